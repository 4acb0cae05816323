"""How ``python -m bench.producer`` shows its figures: progress lines and the results table.

The measuring is :mod:`bench.producer`; this module only formats what it measured.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

if TYPE_CHECKING:
    from bench.producer import CellResult, Options


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _pair(p50: float | None, p99: float | None) -> str:
    return f"{_ms(p50)} / {_ms(p99)}"


def cell_line(result: CellResult) -> str:
    """One progress line; latencies as p50/p99 in ms, CPU as % of one core."""
    line = (
        f"    {result.mode:<6} senders={result.senders:<3} {result.msgs_per_s:>8,.0f} msg/s"
        f"  send {_short(result.send_p50_ms, result.send_p99_ms)}"
    )
    if result.mode != "plain":
        line += (
            f"  half {_short(result.half_p50_ms, result.half_p99_ms)}"
            f"  end {_short(result.end_p50_ms, result.end_p99_ms)}"
        )
    cpu = " ".join(
        f"{name} {_ms(value) if value is None else f'{value:.0f}'}"
        for name, value in (
            ("client", result.client_cpu_pct),
            ("broker", result.broker_cpu_pct),
            ("other", result.other_cpu_pct),
        )
    )
    us = result.client_us_per_send
    return line + (
        f"  | {result.attempts:,} sends, {result.errors} errors | cpu% {cpu}"
        f" | client {'-' if us is None else f'{us:.0f}'} µs/send"
    )


def _us(cell: CellResult | None) -> str:
    value = cell.client_us_per_send if cell else None
    return "-" if value is None else f"{value:.0f}"


def _short(p50: float | None, p99: float | None) -> str:
    return f"{_ms(p50)}/{_ms(p99)}ms"


def results_table(results: list[CellResult], options: Options) -> Table:
    by_cell = {(r.mode, r.senders): r for r in results}
    table = Table(
        title=(
            f"sends: plain vs transactional outbox, threads and asyncio tasks "
            f"({options.value_bytes} B values, "
            f"{options.partitions} partitions, one local broker, {options.seconds:g}s per cell)"
        )
    )
    columns = (
        "senders",
        "plain msg/s",
        "outbox msg/s",
        "ratio outbox/plain",
        "async msg/s",
        "ratio async/plain",
        "outbox end p50 ms",
        "end p99 ms",
        "plain send p50/p99 ms",
        "outbox send p50/p99 ms",
        "client CPU µs/send plain / outbox / async",
    )
    for column in columns:
        table.add_column(column, justify="right")
    for senders in options.senders:
        plain = by_cell.get(("plain", senders))
        outbox = by_cell.get(("outbox", senders))
        ratio = outbox.ratio_to(plain) if outbox else None
        awaited = by_cell.get(("async", senders))
        async_ratio = awaited.ratio_to(plain) if awaited else None
        table.add_row(
            str(senders),
            f"{plain.msgs_per_s:,.0f}" if plain else "-",
            f"{outbox.msgs_per_s:,.0f}" if outbox else "-",
            "-" if ratio is None else f"{ratio:.3f}",
            f"{awaited.msgs_per_s:,.0f}" if awaited else "-",
            "-" if async_ratio is None else f"{async_ratio:.3f}",
            _ms(outbox.end_p50_ms) if outbox else "-",
            _ms(outbox.end_p99_ms) if outbox else "-",
            _pair(plain.send_p50_ms, plain.send_p99_ms) if plain else "-",
            _pair(outbox.send_p50_ms, outbox.send_p99_ms) if outbox else "-",
            " / ".join(_us(cell) for cell in (plain, outbox, awaited)),
        )
    return table
