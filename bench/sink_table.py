"""How ``python -m bench.sink`` shows its figures: the results table.

The measuring is :mod:`bench.sink`; this module only formats what it measured.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

if TYPE_CHECKING:
    from bench.sink import Delay, Options, Throughput


def fmt(value: float | None, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def _cpu(cpu: dict[str, float | None]) -> str:
    return " ".join(f"{name} {fmt(value)}" for name, value in cpu.items())


def results_table(throughput: Throughput, delay: Delay, options: Options) -> Table:
    table = Table(
        title=(
            f"Spark sink: Kafka → Parquet ({options.value_bytes} B values, {options.partitions} "
            f"partitions, master {options.master}, {options.shuffle_partitions} state partitions)"
        )
    )
    for column in ("measurement", "value", "detail"):
        table.add_column(column, justify="right" if column == "value" else "left")
    for run in (throughput.plain, *throughput.modes, throughput.cold):
        ok = run.exactly_once and run.rows_written == throughput.events
        table.add_row(
            f"--once rows/s ({run.jvm})",
            f"{run.rows_per_s:,.0f}",
            f"{run.rows_written:,} events in {run.run_seconds:.1f}s, batches of "
            f"{' + '.join(f'{b:.1f}' for b in run.batch_seconds)}s; table {run.table_rows:,} rows "
            f"({'exactly once' if ok else 'MISMATCH'})",
        )
        table.add_row("  cpu % of a core", "", _cpu(run.cpu))
    ok_live = delay.exactly_once
    detail = (
        f"{delay.landed:,} of {delay.committed:,} events at {delay.rate:g}/s for "
        f"{delay.seconds:g}s, trigger {delay.trigger}, {delay.batches} batches"
    )
    table.add_row("delay p50 ms", fmt(delay.delay_p50_ms), detail)
    table.add_row(
        "delay p99 ms",
        fmt(delay.delay_p99_ms),
        f"max {fmt(delay.delay_max_ms)} ms; a batch every {fmt(delay.batch_p50_ms)} ms (p50); "
        f"table {delay.table_rows:,} rows ({'exactly once' if ok_live else 'MISMATCH'})",
    )
    table.add_row("  cpu % of a core", "", _cpu(delay.cpu))
    table.add_row(
        "ratio to plain Spark",
        f"{throughput.ratio:.2f}",
        f"sink {throughput.warm.jvm} over the plain job, both warm",
    )
    return table
