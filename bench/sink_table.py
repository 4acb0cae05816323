"""What ``python -m bench.sink`` measured, and how it shows it: the results table.

The measuring is :mod:`bench.sink`; this module holds its result types (and its
options, which the table names) and formats them, importing nothing of the bench,
so the two never import each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rich.table import Table

WARMUP_EVENTS = 20
"""Events sent before the measured ones; each lands in the table once too."""


@dataclass
class Options:
    """The parsed command line; one object so every step sees the same choices."""

    events: int
    value_bytes: int
    partitions: int
    rate: float
    live_seconds: float
    live_senders: int
    trigger: str
    master: str
    shuffle_partitions: int
    bootstrap_servers: str | None
    json_path: Path | None
    """``None``: not written (``bench.all`` keeps the document in its own)."""
    keep_dir: bool
    modes: tuple[str, ...] = ()


MERGE_MODE = "delta/merge"


@dataclass
class OnceRun:
    """One ``--once`` run of the sink (or of the plain job) over the loaded topic."""

    jvm: str
    run_seconds: float
    rows_per_s: float
    batches: int
    rows_written: int
    batch_seconds: list[float]
    table_rows: int
    table_distinct_ids: int
    cpu: dict[str, float | None] = field(default_factory=dict)

    @property
    def exactly_once(self) -> bool:
        return self.table_rows == self.table_distinct_ids == self.rows_written


@dataclass
class Throughput:
    """The same events written twice: by a fresh driver JVM, then by a warmed-up one."""

    events: int
    load_seconds: float
    cold: OnceRun
    warm: OnceRun
    """The sink's default mode in the warmed-up driver: the first of ``modes``."""
    plain: OnceRun
    modes: list[OnceRun] = field(default_factory=list)

    @property
    def rows_per_s(self) -> float:
        return self.warm.rows_per_s

    @property
    def ratio(self) -> float:
        return self.warm.rows_per_s / self.plain.rows_per_s if self.plain.rows_per_s else 0.0

    @property
    def merge_rows_per_s(self) -> float | None:
        """Delta with ``--dedup merge`` (the Delta default), when ``--modes`` has it."""
        merged = [run.rows_per_s for run in self.modes if run.jvm.endswith(MERGE_MODE)]
        return merged[0] if merged else None


@dataclass
class Delay:
    trigger: str
    rate: float
    seconds: float
    events: int
    committed: int
    landed: int
    batches: int
    delay_p50_ms: float | None
    delay_p99_ms: float | None
    delay_max_ms: float | None
    batch_p50_ms: float | None
    table_rows: int
    table_distinct_ids: int
    send_errors: int = 0
    cpu: dict[str, float | None] = field(default_factory=dict)
    phases_p50_ms: dict[str, float] = field(default_factory=dict)
    """Median of each phase of Spark's ``durationMs`` over the measured batches: the profile."""

    @property
    def expected_rows(self) -> int:
        """The warm-up events and every committed one, each once in the table."""
        return WARMUP_EVENTS + self.committed

    @property
    def exactly_once(self) -> bool:
        return self.table_rows == self.table_distinct_ids == self.expected_rows


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
        "  batch phases p50 ms",
        "",
        " ".join(f"{name} {value:.0f}" for name, value in delay.phases_p50_ms.items()),
    )
    table.add_row(
        "ratio to plain Spark",
        f"{throughput.ratio:.2f}",
        f"sink {throughput.warm.jvm} over the plain job, both warm",
    )
    return table
