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


PLAIN_MODES = ("plain", "pair")
"""Modes of plain writes (``pair``: two acknowledged ones a send), with no half or end step."""


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
    if result.mode not in PLAIN_MODES:
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


def _ratio_text(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.3f}"


def _short(p50: float | None, p99: float | None) -> str:
    return f"{_ms(p50)}/{_ms(p99)}ms"


def results_table(results: list[CellResult], options: Options) -> Table:
    """One row per cell (senders, then mode), so the table stays whole at any width."""
    by_cell = {(r.mode, r.senders): r for r in results}
    table = Table(
        title=(
            f"sends: plain vs transactional outbox ({options.value_bytes} B values, "
            f"{options.partitions} partitions, {options.seconds:g}s per cell)"
        ),
        caption=(
            "pair: two acknowledged plain writes a send, the protocol's floor; "
            "ratio: msg/s over plain's at the same senders; CPU: the bench process's"
        ),
    )
    for column in ("senders", "mode", "msg/s", "ratio", "send p50/p99 ms", "end p50/p99 ms"):
        left = column == "mode"
        justify = "left" if left else "right"
        table.add_column(column, justify=justify, overflow="fold", min_width=6 if left else None)
    table.add_column("CPU µs a send", justify="right", overflow="fold")
    for senders in options.senders:
        plain = by_cell.get(("plain", senders))
        for mode in ("plain", "pair", "outbox", "async"):
            cell = by_cell.get((mode, senders))
            if cell is None:
                continue
            table.add_row(
                str(senders),
                mode,
                f"{cell.msgs_per_s:,.0f}",
                "" if mode == "plain" else _ratio_text(cell.ratio_to(plain)),
                _pair(cell.send_p50_ms, cell.send_p99_ms),
                "" if mode in PLAIN_MODES else _pair(cell.end_p50_ms, cell.end_p99_ms),
                _us(cell),
            )
    return table
