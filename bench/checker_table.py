"""What ``python -m bench.checker`` measured, and how it shows it: the results table.

The measuring is :mod:`bench.checker`; this module holds its result types and
formats them, importing nothing of the bench, so the two never import each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.table import Table

from bench.aims import AIM_HALVES_PER_S, AIM_RSS_MB
from bench.checker_driver import WalkResult


@dataclass
class ScanResult:
    halves: int
    value_bytes: int
    write_seconds: float
    walk: WalkResult
    halves_per_s: float
    checks_answered: int | None
    ops_written: int | None
    answer_wait_seconds: float | None
    answers_per_s: float | None
    """Checks the producer group answered a second, measured after the walk, on its own."""
    cpu_pct: dict[str, float | None]


@dataclass
class RssResult:
    halves: int
    value_bytes: int
    write_seconds: float
    walk: WalkResult | None
    peak_rss_mb: float | None
    peak_rss_polled_mb: float | None
    halves_per_s: float | None
    exit_code: int


def fmt(value: float | None, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def results_table(scan: ScanResult, rss: RssResult | None) -> Table:
    table = Table(title="checker: one half partition, one local broker")
    for column in ("measure", "backlog", "rounds", "checks sent", "round s", "result", "aim"):
        table.add_column(column, justify="right" if column != "measure" else "left")
    verdict = "ok" if scan.halves_per_s >= AIM_HALVES_PER_S else "BELOW"
    table.add_row(
        "scan rate (halves/s)",
        f"{scan.halves:,} x {scan.value_bytes} B",
        str(scan.walk.rounds),
        f"{scan.walk.checks_sent:,}",
        f"{scan.walk.round_seconds:.1f}",
        f"{scan.halves_per_s:,.0f}",
        f">= {AIM_HALVES_PER_S:,} {verdict}",
    )
    if scan.checks_answered is not None:
        table.add_row(
            "answers/s (producer group)",
            f"{scan.walk.checks_sent:,} checks",
            "",
            f"{scan.checks_answered:,} answered",
            fmt(scan.answer_wait_seconds, ".1f"),
            fmt(scan.answers_per_s),
            "",
        )
    if rss is not None and rss.walk is not None:
        peak = rss.peak_rss_mb
        verdict = "ok" if peak is not None and peak < AIM_RSS_MB else "ABOVE"
        table.add_row(
            "peak RSS (MiB)",
            f"{rss.halves:,} x {rss.value_bytes} B",
            str(rss.walk.rounds),
            f"{rss.walk.checks_sent:,}",
            f"{rss.walk.round_seconds:.1f}",
            fmt(peak, ".0f"),
            f"< {AIM_RSS_MB} {verdict}",
        )
        table.add_row(
            "  its scan rate (halves/s)",
            "",
            "",
            "",
            "",
            fmt(rss.halves_per_s),
            "",
        )
    return table
