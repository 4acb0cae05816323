"""What ``python -m bench.peer`` measured, and how it shows it: a row per side and concurrency.

The measuring is :mod:`bench.peer`; this module holds its options and result
types and formats them, importing nothing of the bench (as
:mod:`bench.parking_table` does for the parking bench).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rich.table import Table

SIDES = ("peer", "outbox", "outbox-async", "outbox-sql")
"""``peer``: faststream-outbox; the others our forms (see :mod:`bench.peer_service`)."""

SIDE_NAMES = {
    "peer": "faststream-outbox (polling)",
    "outbox": "outbox, caller's transaction",
    "outbox-async": "outbox, caller's transaction, asyncio",
    "outbox-sql": "outbox, SQL listener",
}


def side_key(side: str) -> str:
    """``outbox-sql`` -> ``outbox_sql``: the side as a summary key's prefix."""
    return side.replace("-", "_")


@dataclass
class Options:
    """The parsed command line; one object so every step sees the same choices."""

    concurrency: list[int]
    sides: list[str]
    seconds: float
    warmup: float
    value_bytes: int
    partitions: int
    peer_workers: int
    """faststream-outbox's ``max_workers`` on the relay's subscriber."""
    peer_fetch_batch: int
    peer_flush_batch: int
    database_url: str | None
    """``None``: a local PostgreSQL started here."""
    bootstrap_servers: str | None
    visible_timeout: float
    quick: bool
    json_path: Path | None
    """``None``: not written (``bench.all`` keeps the document in its own)."""


@dataclass
class CellResult:
    """One side at one concurrency: ``seconds`` of requests, then until all were visible."""

    side: str
    concurrency: int
    committed: int
    """Requests whose transaction committed in the measured window."""
    errors: int
    first_error: str | None
    requests_per_s: float
    rows: int
    """Order rows of the cell in the database: each committed request's (the warm-up's
    included), no other."""
    visible: int
    missing: int
    duplicates: int
    warmup_committed: int
    warmup_missing: int
    warmup_duplicates: int
    visible_p50_ms: float | None
    visible_p99_ms: float | None
    visible_max_ms: float | None
    visible_wait_s: float
    """From the end of the requests until the last committed one was visible."""
    relayed_per_s: float | None
    """The committed requests over the time from the first request until the last was
    visible: the rate the relay kept up with (below ``requests_per_s``: a backlog grew)."""
    service_cpu_us: float | None
    """The service process's CPU per committed request, while it sent."""
    relay_cpu_us: float | None
    """The relay's (faststream-outbox's subscriber, or our checker) CPU per committed
    request, from the first request until the last was visible."""
    cpu_us_per_request: float | None
    """The two together: every process of the side."""
    db_xacts: float | None
    """Per committed request, from pg_stat_database over the database; likewise below."""
    db_rollbacks: float | None
    db_inserted: float | None
    db_updated: float | None
    db_deleted: float | None
    wal_bytes: float | None
    """WAL written per committed request (pg_current_wal_lsn, the whole server)."""
    db_cpu_us: float | None
    """The PostgreSQL server's processes' CPU per committed request (a local server only)."""
    cpu_pct: dict[str, float | None] = field(default_factory=dict)
    other_cpu_pct: float | None = None

    def problems(self) -> list[str]:
        found = [
            f"{count} {what}"
            for count, what in (
                (self.missing, "committed requests never visible"),
                (self.duplicates, "committed requests visible more than once"),
                (self.warmup_missing, "committed warm-up requests never visible"),
                (self.warmup_duplicates, "committed warm-up requests visible more than once"),
                (self.errors, f"requests failed ({self.first_error})"),
            )
            if count
        ]
        if self.rows != self.committed + self.warmup_committed:
            found.append(
                f"{self.rows} order rows for {self.committed + self.warmup_committed} "
                "committed requests (the warm-up's included)"
            )
        if not self.committed:
            found.append("no request committed")
        return [f"{self.side} at {self.concurrency}: {problem}" for problem in found]


FIGURES: tuple[tuple[str, str], ...] = (
    ("requests_per_s", ".0f"),
    ("relayed_per_s", ".0f"),
    ("visible_p50_ms", ".1f"),
    ("visible_p99_ms", ".1f"),
    ("visible_max_ms", ".1f"),
    ("cpu_us_per_request", ".0f"),
    ("service_cpu_us", ".0f"),
    ("relay_cpu_us", ".0f"),
    ("db_xacts", ".2f"),
    ("db_inserted", ".2f"),
    ("db_updated", ".2f"),
    ("db_deleted", ".2f"),
    ("wal_bytes", ".0f"),
    ("db_cpu_us", ".0f"),
)
"""A cell's figures in the summary, each as ``<side>_<figure>_at_<concurrency>``; the
per-request ones named as such (``db_xacts`` -> ``db_xacts_per_request``)."""


def summary_key(side: str, name: str, concurrency: int) -> str:
    per_request = name in ("service_cpu_us", "relay_cpu_us") or name.startswith(("db_", "wal_"))
    return f"{side_key(side)}_{name}{'_per_request' if per_request else ''}_at_{concurrency}"


def summary(cells: list[CellResult]) -> list[tuple[str, float | None, str]]:
    """The last line's (key, value, format), by side, figure and concurrency."""
    rows: list[tuple[str, float | None, str]] = []
    for cell in cells:
        for name, spec in FIGURES:
            rows.append((summary_key(cell.side, name, cell.concurrency), getattr(cell, name), spec))
    rows.append(("missing", sum(c.missing + c.warmup_missing for c in cells), "d"))
    rows.append(("duplicates", sum(c.duplicates + c.warmup_duplicates for c in cells), "d"))
    return rows


def _num(value: float | None, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def cell_line(cell: CellResult) -> str:
    """The progress line after a cell."""
    return (
        f"    {cell.requests_per_s:,.0f} req/s, relayed {_num(cell.relayed_per_s)}/s; "
        "visible p50/p99/max "
        f"{_num(cell.visible_p50_ms, '.1f')} / {_num(cell.visible_p99_ms, '.1f')} / "
        f"{_num(cell.visible_max_ms, '.1f')} ms; {cell.visible:,} of {cell.committed:,} seen "
        f"({cell.duplicates} twice), {cell.errors} errors; CPU {_num(cell.cpu_us_per_request)} "
        f"µs/req; DB {_num(cell.db_xacts, '.2f')} xacts, {_num(cell.wal_bytes)} WAL B /req; "
        f"other cpu {_num(cell.other_cpu_pct)}%"
    )


def results_table(cells: list[CellResult], options: Options, database: str) -> Table:
    """A row per side and concurrency: what a person compares at a glance."""
    title = (
        f"{options.value_bytes} B events, one DB transaction per request (order row + event), "
        f"{options.seconds:g}s per cell; {database}; one local broker"
    )
    if options.quick:
        title += " (--quick: a smoke run, not a measurement)"
    table = Table(title=title)
    table.add_column("side")
    table.add_column("conc", justify="right")
    table.add_column("req/s (relayed/s)", justify="right")
    table.add_column("visible p50 / p99 / max ms", justify="right")
    table.add_column("CPU µs/req (service + relay)", justify="right")
    table.add_column("DB xacts / ins / upd / del per req", justify="right")
    table.add_column("WAL B/req", justify="right")
    table.add_column("DB CPU µs/req", justify="right")
    table.add_column("seen once", justify="right")
    for cell in cells:
        table.add_row(
            SIDE_NAMES.get(cell.side, cell.side),
            str(cell.concurrency),
            f"{_num(cell.requests_per_s)} ({_num(cell.relayed_per_s)})",
            " / ".join(
                _num(v, ".1f")
                for v in (cell.visible_p50_ms, cell.visible_p99_ms, cell.visible_max_ms)
            ),
            f"{_num(cell.cpu_us_per_request)} ({_num(cell.service_cpu_us)} + "
            f"{_num(cell.relay_cpu_us)})",
            " / ".join(
                _num(v, ".2f")
                for v in (cell.db_xacts, cell.db_inserted, cell.db_updated, cell.db_deleted)
            ),
            _num(cell.wal_bytes),
            _num(cell.db_cpu_us),
            "ok" if not cell.problems() else "[red]FAILED[/]",
        )
    return table
