"""What ``python -m bench.parking`` measured, and how it shows it: the phases side by side.

The measuring is :mod:`bench.parking`; this module holds its options and result
types and formats them, importing nothing of the bench, so the two never import
each other (and :mod:`bench.all_table` can show the figures without the bench).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

AIM_PARKED_TO_VISIBLE_S = 2.0
"""Issue 38: a parked send is visible at most this long after Kafka takes writes again."""

FAULTS = ("freeze", "stop")
"""``freeze``: SIGSTOP, a stalled machine (clients hear nothing); ``stop``: a clean
shutdown and a start again (connections refused, then a JVM start)."""


@dataclass
class Options:
    """The parsed command line; one object so every step sees the same choices."""

    fault: str
    down_seconds: float
    before_seconds: float
    """Steady sends between the end of the warm-up and the fault."""
    after_seconds: float
    """Steady sends after the broker is back."""
    warmup: float
    rate: float
    """Sends a second offered, over all senders, on a fixed schedule."""
    senders: int
    partitions: int
    park_after_seconds: float
    database_url: str | None
    """``None``: a SQLite file in a temporary directory."""
    check_interval: float | None
    """The checker's ``--check-interval``; ``None``: its default."""
    dynamic_member: bool
    """The checker without ``--instance-id``: after an outage past its session it rejoins
    only once the broker has expired its old membership."""
    visible_timeout: float
    """How long to wait, after the sends, for every committed send to be visible."""
    settle_seconds: float
    """Reading on after the last committed send is visible: a second copy would show."""
    quick: bool
    json_path: Path | None
    """``None``: not written (``bench.all`` keeps the document in its own)."""
    log_dir: Path
    """Where each phase's checker log is kept (named in the JSON)."""


@dataclass
class PhaseResult:
    """One phase (parking off or on) around one broker fault."""

    parking: bool
    fault: str
    down_seconds: float
    """From the fault's start to the broker's return, as it happened."""
    return_took_s: float | None
    """``stop``: how long the broker's start took (part of ``down_seconds``)."""
    sends: int
    """Sends of the measured window (after the warm-up)."""
    failed: int
    first_error: str | None
    parked: int
    parked_committed: int
    send_p50_ms: float | None
    send_p99_ms: float | None
    send_max_ms: float | None
    fault_sends: int
    """Sends that started while the broker was away."""
    fault_send_p50_ms: float | None
    fault_send_p99_ms: float | None
    fault_send_max_ms: float | None
    request_p99_ms: float | None
    """From when a send was due (the fixed schedule) to its return: what a request waits,
    a blocked sender's queue included."""
    request_max_ms: float | None
    fault_request_p99_ms: float | None
    """The same, for the requests due while the broker was away."""
    writable_after_return_s: float | None
    """When Kafka first acknowledged a send's half again, after the broker's return."""
    parked_to_visible_p50_s: float | None
    parked_to_visible_max_s: float | None
    """First visible minus the broker's return, over the committed parked sends."""
    after_writable_p50_s: float | None
    after_writable_max_s: float | None
    """First visible minus the moment Kafka acknowledged a send again (the issue's aim)."""
    last_visible_after_return_s: float | None
    """The last committed send of the phase (parked or not) visible, after the return."""
    committed: int
    rolled_back: int
    visible: int
    missing: int
    duplicates: int
    rolled_back_visible: int
    unexpected_visible: int
    """Records of the phase's topic whose transaction id no send of the phase had."""
    visible_wait_s: float
    end_statuses: dict[str, int] = field(default_factory=dict)
    client_log_records: int = 0
    """WARNING and above logged by the bench process's clients (kept off the console)."""
    cpu_pct: dict[str, float | None] = field(default_factory=dict)
    other_cpu_pct: float | None = None
    load_average: list[float] | None = None
    checker: dict[str, Any] = field(default_factory=dict)
    """The checker's log around the fault: its timeline and key moments (:mod:`bench.parking`)."""
    checker_log: str | None = None

    @property
    def name(self) -> str:
        return "with parking" if self.parking else "without parking"

    def problems(self) -> list[str]:
        """What makes this phase a failure, one sentence each."""
        found = [
            f"{count} {what}"
            for count, what in (
                (self.missing, "committed sends never visible"),
                (self.duplicates, "committed sends visible more than once"),
                (self.rolled_back_visible, "rolled-back sends visible"),
                (self.unexpected_visible, "visible records no send of the phase made"),
            )
            if count
        ]
        if self.parking and self.failed:
            found.append(f"{self.failed} sends failed with parking on ({self.first_error})")
        return found


def _num(value: float | None, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def _trio(p50: float | None, p99: float | None, top: float | None) -> str:
    return f"{_num(p50)} / {_num(p99)} / {_num(top)}"


def ratio(without: float | None, with_parking: float | None) -> float | None:
    """How many times longer the p99 was without parking."""
    if without is None or not with_parking:
        return None
    return without / with_parking


def phase_line(result: PhaseResult) -> str:
    """One progress line after a phase."""
    whole = _trio(result.send_p50_ms, result.send_p99_ms, result.send_max_ms)
    away = _trio(result.fault_send_p50_ms, result.fault_send_p99_ms, result.fault_send_max_ms)
    return (
        f"    {result.name}: {result.sends:,} sends, {result.failed} failed, "
        f"{result.parked} parked; send p50/p99/max {whole} ms, "
        f"started while away ({result.fault_sends}) {away} ms; "
        f"visible {result.visible:,} of {result.committed:,} committed, missing {result.missing}, "
        f"duplicates {result.duplicates}, rolled back visible {result.rolled_back_visible}"
    )


def _row(table: Table, figure: str, phases: list[PhaseResult], cell: Any, detail: str = "") -> None:
    by = {p.parking: p for p in phases}
    table.add_row(
        figure,
        *(cell(by[parking]) if parking in by else "-" for parking in (False, True)),
        detail,
    )


def results_table(phases: list[PhaseResult], options: Options) -> Table:
    """The two phases side by side, and the ratio of their p99 while the broker was away."""
    title = (
        f"a broker {'frozen (SIGSTOP)' if options.fault == 'freeze' else 'stopped'} for "
        f"{options.down_seconds:g}s while {options.rate:g} sends/s go on from "
        f"{options.senders} thread{'s' if options.senders != 1 else ''}; one local broker"
    )
    if options.dynamic_member:
        title += ", the checker a dynamic group member"
    if options.quick:
        title += " (--quick: a smoke run, not a measurement)"
    table = Table(title=title)
    table.add_column("figure")
    table.add_column("without parking", justify="right")
    table.add_column("with parking", justify="right")
    table.add_column("detail")
    _row(table, "sends / failed", phases, lambda p: f"{p.sends:,} / {p.failed}", "after warm-up")
    _row(
        table,
        "send p50 / p99 / max ms",
        phases,
        lambda p: _trio(p.send_p50_ms, p.send_p99_ms, p.send_max_ms),
        "the whole phase",
    )
    by = {p.parking: p for p in phases}
    times = ratio(
        by[False].fault_send_p99_ms if False in by else None,
        by[True].fault_send_p99_ms if True in by else None,
    )
    _row(
        table,
        "send p50 / p99 / max ms, broker away",
        phases,
        lambda p: _trio(p.fault_send_p50_ms, p.fault_send_p99_ms, p.fault_send_max_ms),
        f"sends started while it was away; p99 {_num(times, '.1f')}x without parking",
    )
    _row(
        table,
        "request p99 / max ms (from when due)",
        phases,
        lambda p: f"{_num(p.request_p99_ms)} / {_num(p.request_max_ms)}",
        "a blocked sender's queue included",
    )
    _row(
        table,
        "request p99 ms, due while away",
        phases,
        lambda p: _num(p.fault_request_p99_ms),
    )
    _row(
        table,
        "parked (committed)",
        phases,
        lambda p: f"{p.parked:,} ({p.parked_committed:,})",
    )
    _row(
        table,
        "Kafka acknowledged a send again, s",
        phases,
        lambda p: _num(p.writable_after_return_s, ".1f"),
        "after the broker's return",
    )
    _row(
        table,
        "parked → visible p50 / max s",
        phases,
        lambda p: (
            f"{_num(p.parked_to_visible_p50_s, '.1f')} / {_num(p.parked_to_visible_max_s, '.1f')}"
        ),
        "after the broker's return",
    )
    on = by.get(True)
    met = (
        on is not None
        and on.after_writable_max_s is not None
        and on.after_writable_max_s <= AIM_PARKED_TO_VISIBLE_S
    )
    _row(
        table,
        "the same after Kafka took writes, s",
        phases,
        lambda p: f"{_num(p.after_writable_p50_s, '.1f')} / {_num(p.after_writable_max_s, '.1f')}",
        f"aim max <= {AIM_PARKED_TO_VISIBLE_S:g} s: "
        + ("-" if on is None or on.after_writable_max_s is None else "met" if met else "NOT met"),
    )
    _row(
        table,
        "last committed send visible, s",
        phases,
        lambda p: _num(p.last_visible_after_return_s, ".1f"),
        "after the broker's return",
    )
    _row(
        table,
        "checker: half partitions back, s",
        phases,
        lambda p: _num(p.checker.get("assigned_after_return_s"), ".1f"),
        "its group rejoined after the return (from its log)",
    )
    _row(
        table,
        "committed / visible",
        phases,
        lambda p: f"{p.committed:,} / {p.visible:,}",
        "each committed send once (read_committed reader)",
    )
    _row(
        table,
        "missing / duplicates / rolled back visible",
        phases,
        lambda p: (
            f"{p.missing} / {p.duplicates} / {p.rolled_back_visible}"
            if not p.problems()
            else f"[red]{p.missing} / {p.duplicates} / {p.rolled_back_visible}[/]"
        ),
        "each must be 0",
    )
    _row(
        table,
        "cpu% bench / broker / checker / other",
        phases,
        lambda p: " / ".join(
            _num(p.cpu_pct.get(name)) for name in ("bench", "broker", "checker", "other")
        ),
        "% of one core over the phase",
    )
    return table
