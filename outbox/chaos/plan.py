"""The seeded fault schedule: which fault, against whom, at which point of the run.

A fault fires when the run has sent a given share of its transactions, not at a
wall-clock time: on a shared two-core machine the same seed then hits the same
phase of the run however fast it goes, which is what makes ``--seed`` worth
reproducing. Everything else about a fault (the target, how long it stays down)
comes from the same seeded generator.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum

FIRST_FAULT_AT = 0.05
LAST_FAULT_AT = 0.85
"""Faults land inside this share of the run, so the end of the run sees them all recover."""


class FaultKind(StrEnum):
    KILL_PRODUCER = "kill -9 producer"
    KILL_CHECKER = "kill -9 checker"
    STOP_BROKER = "stop broker"
    KILL_BROKER = "kill -9 broker"
    KILL_ALL_CHECKERS = "kill -9 all checkers"
    """Every checker replica at once: publication pauses, nothing may be lost."""
    KILL_ANSWERING_PRODUCER = "kill -9 answering producer"
    """A producer caught inside ``check_local_transaction``, before its answer is written."""
    FREEZE_BROKER = "freeze broker"
    """SIGSTOP, then SIGCONT: connections stay open and silent (a stalled VM, a long GC)."""
    FREEZE_CHECKER = "freeze checker"
    """A checker replica stopped mid-work: its group and its open transactions time out."""

    @property
    def verb(self) -> str:
        """What is done to the target: ``kill -9``, ``stop`` or ``freeze`` (SIGSTOP)."""
        if self in (FaultKind.FREEZE_BROKER, FaultKind.FREEZE_CHECKER):
            return "freeze"
        return "stop" if self is FaultKind.STOP_BROKER else "kill -9"

    @property
    def freezes(self) -> bool:
        """The target is paused and resumed (SIGCONT), never restarted."""
        return self in (FaultKind.FREEZE_BROKER, FaultKind.FREEZE_CHECKER)

    @property
    def has_target(self) -> bool:
        """Whether the fault picks one process (``#n``) rather than a whole role."""
        return self in (
            FaultKind.KILL_PRODUCER,
            FaultKind.KILL_CHECKER,
            FaultKind.KILL_ANSWERING_PRODUCER,
            FaultKind.FREEZE_CHECKER,
        )


@dataclass(frozen=True)
class Fault:
    at_share: float
    """Fires once this share of the run's transactions has been sent."""
    kind: FaultKind
    target: int
    """Producer or checker index; 0 for the broker and for all checkers."""
    down_seconds: float
    """How long the target stays down before the controller starts it again."""

    def describe(self) -> str:
        target = f" #{self.target}" if self.kind.has_target else ""
        return f"{self.kind}{target}, down {self.down_seconds:.1f}s"


def fault_plan(
    seed: int,
    *,
    producers: int,
    checkers: int,
    producer_kills: int,
    checker_kills: int,
    broker_restarts: int,
    answering_producer_kills: int,
    checker_outages: int,
    broker_freezes: int = 0,
    checker_freezes: int = 0,
) -> list[Fault]:
    """The faults of one run, in firing order; the same arguments give the same plan.

    Kinds are drawn in a fixed order, newer kinds last, so adding a kind leaves
    the earlier faults of a seed where they were.
    """
    rng = random.Random(seed)

    def moment() -> float:
        return round(rng.uniform(FIRST_FAULT_AT, LAST_FAULT_AT), 4)

    faults = [
        Fault(moment(), FaultKind.KILL_PRODUCER, rng.randrange(producers), rng.uniform(0.2, 3.0))
        for _ in range(producer_kills)
    ]
    faults += [
        Fault(moment(), FaultKind.KILL_CHECKER, rng.randrange(checkers), rng.uniform(0.5, 8.0))
        for _ in range(checker_kills)
    ]
    broker_kinds = (FaultKind.STOP_BROKER, FaultKind.KILL_BROKER)
    first_kind = rng.randrange(2)
    faults += [
        Fault(moment(), broker_kinds[(first_kind + n) % 2], 0, rng.uniform(1.0, 6.0))
        for n in range(broker_restarts)
    ]
    faults += [
        Fault(
            moment(),
            FaultKind.KILL_ANSWERING_PRODUCER,
            rng.randrange(producers),
            rng.uniform(0.2, 3.0),
        )
        for _ in range(answering_producer_kills)
    ]
    faults += [
        Fault(moment(), FaultKind.KILL_ALL_CHECKERS, 0, rng.uniform(10.0, 20.0))
        for _ in range(checker_outages)
    ]
    faults += [
        Fault(moment(), FaultKind.FREEZE_BROKER, 0, rng.uniform(10.0, 20.0))
        for _ in range(broker_freezes)
    ]
    faults += [
        Fault(moment(), FaultKind.FREEZE_CHECKER, rng.randrange(checkers), rng.uniform(10.0, 20.0))
        for _ in range(checker_freezes)
    ]
    return sorted(faults, key=lambda fault: fault.at_share)
