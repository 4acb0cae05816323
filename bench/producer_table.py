"""What ``python -m bench.producer`` measured, and how it shows it: progress lines, the table.

The measuring is :mod:`bench.producer`; this module holds its result types (and its
options, which the table names) and formats them, importing nothing of the bench,
so the two never import each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table


@dataclass
class CellResult:
    """One (mode, senders) measurement, as printed and written to the JSON."""

    mode: str
    senders: int
    window_seconds: float
    messages: int
    msgs_per_s: float
    send_p50_ms: float | None
    send_p99_ms: float | None
    end_p50_ms: float | None = None
    end_p99_ms: float | None = None
    half_p50_ms: float | None = None
    half_p99_ms: float | None = None
    attempts: int = 0
    errors: int = 0
    first_error: str | None = None
    committed: int | None = None
    not_committed: dict[str, int] = field(default_factory=dict)
    client_cpu_pct: float | None = None
    broker_cpu_pct: float | None = None
    other_cpu_pct: float | None = None
    """CPU used by other processes on the host meanwhile: noise in a shared machine's numbers."""
    client_us_per_send: float | None = None
    """This process's CPU time (every thread: senders, the client's, the loop) per send
    completed in the window, in µs: what a send costs the service, whatever the machine's
    load does to its throughput."""

    def ratio_to(self, plain: CellResult | None) -> float | None:
        """This cell's throughput over ``plain``'s: what the outbox keeps of a plain send."""
        if plain is None or not plain.msgs_per_s:
            return None
        return self.msgs_per_s / plain.msgs_per_s


@dataclass
class Options:
    """The parsed command line; one object so every step sees the same choices."""

    senders: list[int]
    seconds: float
    warmup: float
    value_bytes: int
    partitions: int
    modes: list[str]
    bootstrap_servers: str | None
    verify_read: bool
    json_path: Path | None
    """``None``: not written (``bench.all`` keeps the document in its own)."""
    producer_overrides: dict[str, Any]


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
