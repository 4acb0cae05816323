"""The seeded fault schedule: which fault, against whom, at which point of the run.

A fault fires when the run has sent a given share of its transactions, not at a
wall-clock time: on a shared two-core machine the same seed then hits the same
phase of the run however fast it goes, which is what makes ``--seed`` worth
reproducing. Everything else about a fault (the target, how long it stays down)
comes from the same seeded generator.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
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
    ROLLING_RESTART = "rolling restart"
    """Cluster only: every node stopped and started in turn, each once the replicas are in sync."""
    KILL_HALF_LEADER = "kill -9 half leader"
    """Cluster only: the node leading a half partition (producers' sends fail over)."""
    KILL_RELAY_COORDINATOR = "kill -9 relay coordinator"
    """Cluster only: the node coordinating a checker replica's relay transactions."""
    KILL_CHECKER_MID_CHUNK = "kill -9 checker mid-chunk"
    """A checker replica caught inside a round chunk's Kafka transaction, its put-back copies
    stored and its check requests not yet written."""
    DISCARD_RESUME_CYCLE = "discard-and-resume cycle"
    """Orders of a group nobody answers for: discarded, resumed, discarded again, resumed with
    a producer answering (see :mod:`outbox_devtools.chaos.discard_cycle`)."""
    CUT_CHECKER = "cut checker"
    """A checker replica cut from every broker while it keeps running (``--network-partitions``,
    :mod:`outbox_devtools.chaos.network`): past its session its partitions move to the other
    replica while it still believes it owns them, the zombie a partition makes."""
    CUT_PRODUCER = "cut producer"
    """A producer process cut from every broker in the middle of its sends."""
    CUT_NODE = "cut node"
    """Cluster only: one node cut from the other nodes (a minority), clients still reach it."""
    CUT_HALF_LEADER = "cut half leader"
    """Cluster only: the node leading a half partition cut from its followers (the other nodes)."""
    KAFKA_AWAY = "Kafka away"
    """The broker, or a majority of the cluster's nodes, killed for 20-30 s while orders continue:
    no write is possible anywhere, so producers that park their sends
    (``--park-when-unavailable``) must take every order and the checker publish them after."""
    FREEZE_DRAINING_CHECKER = "freeze draining checker"
    """With parking: the replica caught inside a parked drain's Kafka transaction (its halves
    stored, their COMMIT ops not yet) stopped past its session and resumed: its partition
    moved meanwhile, so the resumed drain is a zombie Kafka must fence."""

    @property
    def verb(self) -> str:
        """What is done to the target: ``kill -9``, ``stop``, ``freeze`` (SIGSTOP), ``restart``."""
        if self.freezes:
            return "freeze"
        if self is FaultKind.ROLLING_RESTART:
            return "restart"
        if self is FaultKind.KAFKA_AWAY:
            return "kill -9"
        if self in CUT_KINDS:
            return "cut"
        return "stop" if self is FaultKind.STOP_BROKER else "kill -9"

    @property
    def hits_a_broker(self) -> bool:
        """Takes a Kafka node down or pauses it: in a cluster, one at a time (see run.py)."""
        return self in BROKER_KINDS

    @property
    def freezes(self) -> bool:
        """The target is paused and resumed (SIGCONT), never restarted."""
        return self in (
            FaultKind.FREEZE_BROKER,
            FaultKind.FREEZE_CHECKER,
            FaultKind.FREEZE_DRAINING_CHECKER,
        )

    @property
    def cuts(self) -> bool:
        """A network partition: the target keeps running, its links are cut, then healed."""
        return self in CUT_KINDS

    @property
    def cuts_nodes(self) -> bool:
        """Cuts Kafka nodes from each other: in a cluster, one broker fault at a time."""
        return self in (FaultKind.CUT_NODE, FaultKind.CUT_HALF_LEADER)

    @property
    def has_target(self) -> bool:
        """Whether the fault picks one process (``#n``) rather than a whole role."""
        return self in (
            FaultKind.KILL_PRODUCER,
            FaultKind.KILL_CHECKER,
            FaultKind.KILL_ANSWERING_PRODUCER,
            FaultKind.FREEZE_CHECKER,
            FaultKind.KILL_CHECKER_MID_CHUNK,
            FaultKind.CUT_CHECKER,
            FaultKind.CUT_PRODUCER,
        )


BROKER_KINDS = frozenset(
    {
        FaultKind.STOP_BROKER,
        FaultKind.KILL_BROKER,
        FaultKind.FREEZE_BROKER,
        FaultKind.ROLLING_RESTART,
        FaultKind.KILL_HALF_LEADER,
        FaultKind.KILL_RELAY_COORDINATOR,
        FaultKind.KAFKA_AWAY,
    }
)
CUT_KINDS = frozenset(
    {FaultKind.CUT_CHECKER, FaultKind.CUT_PRODUCER, FaultKind.CUT_NODE, FaultKind.CUT_HALF_LEADER}
)
NODE_KINDS = (FaultKind.STOP_BROKER, FaultKind.KILL_BROKER, FaultKind.FREEZE_BROKER)
"""The single-broker faults; in a cluster each strikes one seeded node."""


@dataclass(frozen=True)
class Fault:
    at_share: float
    """Fires once this share of the run's transactions has been sent."""
    kind: FaultKind
    target: int
    """Producer or checker index; 0 for all checkers and the single broker. In a cluster: the
    node id of a stop, kill or freeze; the half partition whose leader is killed; the checker
    replica whose relay's coordinator is killed; the first node of the majority Kafka away kills."""
    down_seconds: float
    """How long the target stays down before the controller starts it again."""

    def nodes(self, brokers: int) -> tuple[int, ...]:
        """The node ids a Kafka-away fault kills: a majority (all of one broker), from its
        target on, wrapping: on three nodes the target and the next one."""
        majority = brokers // 2 + 1
        return tuple((self.target - 1 + step) % brokers + 1 for step in range(majority))

    def describe(self) -> str:
        if self.kind is FaultKind.ROLLING_RESTART:
            return "rolling restart of every node"
        if self.kind is FaultKind.DISCARD_RESUME_CYCLE:
            return "discard-and-resume cycle"
        if self.kind is FaultKind.FREEZE_DRAINING_CHECKER:
            return f"{self.kind} (the first caught inside a drain), down {self.down_seconds:.1f}s"
        if self.kind is FaultKind.KAFKA_AWAY:
            where = "the broker" if self.target == 0 else f"a majority from node {self.target}"
            return f"{self.kind}: {where} killed, down {self.down_seconds:.1f}s"
        if self.kind in (FaultKind.CUT_CHECKER, FaultKind.CUT_PRODUCER):
            target = f" #{self.target} from every broker"
        elif self.kind is FaultKind.CUT_NODE:
            target = f" {self.target} from the other nodes"
        elif self.kind is FaultKind.CUT_HALF_LEADER:
            target = f" of partition {self.target} from its followers"
        elif self.kind is FaultKind.KILL_HALF_LEADER:
            target = f" of partition {self.target}"
        elif self.kind is FaultKind.KILL_RELAY_COORDINATOR:
            target = f" of checker #{self.target}"
        elif self.kind in NODE_KINDS and self.target:
            target = f" node {self.target}"
        else:
            target = f" #{self.target}" if self.kind.has_target else ""
        state = "cut" if self.kind.cuts else "down"
        return f"{self.kind}{target}, {state} {self.down_seconds:.1f}s"


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
    brokers: int = 1,
    partitions: int = 1,
    rolling_restarts: int = 0,
    half_leader_kills: int = 0,
    coordinator_kills: int = 0,
    mid_chunk_kills: int = 0,
    discard_cycles: int = 0,
    checker_cuts: int = 0,
    producer_cuts: int = 0,
    node_cuts: int = 0,
    half_leader_cuts: int = 0,
    kafka_outages: int = 0,
    drain_freezes: int = 0,
) -> list[Fault]:
    """The faults of one run, in firing order; the same arguments give the same plan.

    Kinds are drawn in a fixed order, newer kinds last, so adding a kind leaves
    the earlier faults of a seed where they were. The cluster's kinds (and the
    node each single-broker fault strikes) are drawn only with ``brokers`` > 1.
    """
    rng = random.Random(seed)

    def draw(
        kind: FaultKind, count: int, targets: int, down: tuple[float, float] | None
    ) -> list[Fault]:
        """``count`` faults of ``kind``: a moment, a target (0 when ``targets`` is 0), a down
        time (none: 0 s); drawn in this order, the order of the seeds quoted in tests."""
        return [
            Fault(
                round(rng.uniform(FIRST_FAULT_AT, LAST_FAULT_AT), 4),
                kind,
                rng.randrange(targets) if targets else 0,
                rng.uniform(*down) if down else 0.0,
            )
            for _ in range(count)
        ]

    faults = draw(FaultKind.KILL_PRODUCER, producer_kills, producers, (0.2, 3.0))
    faults += draw(FaultKind.KILL_CHECKER, checker_kills, checkers, (0.5, 8.0))
    broker_kinds = (FaultKind.STOP_BROKER, FaultKind.KILL_BROKER)
    first_kind = rng.randrange(2)
    for n in range(broker_restarts):
        faults += draw(broker_kinds[(first_kind + n) % 2], 1, 0, (1.0, 6.0))
    faults += draw(
        FaultKind.KILL_ANSWERING_PRODUCER, answering_producer_kills, producers, (0.2, 3.0)
    )
    faults += draw(FaultKind.KILL_ALL_CHECKERS, checker_outages, 0, (10.0, 20.0))
    faults += draw(FaultKind.FREEZE_BROKER, broker_freezes, 0, (10.0, 20.0))
    faults += draw(FaultKind.FREEZE_CHECKER, checker_freezes, checkers, (10.0, 20.0))
    if brokers > 1:
        faults = [
            replace(fault, target=rng.randrange(brokers) + 1) if fault.kind in NODE_KINDS else fault
            for fault in faults
        ]
        faults += draw(FaultKind.ROLLING_RESTART, rolling_restarts, 0, None)
        faults += draw(FaultKind.KILL_HALF_LEADER, half_leader_kills, partitions, (1.0, 6.0))
        faults += draw(FaultKind.KILL_RELAY_COORDINATOR, coordinator_kills, checkers, (1.0, 6.0))
    faults += draw(FaultKind.KILL_CHECKER_MID_CHUNK, mid_chunk_kills, checkers, (0.5, 8.0))
    faults += draw(FaultKind.DISCARD_RESUME_CYCLE, discard_cycles, 0, None)
    # Partitions last (and only asked for with --network-partitions): every older seed keeps
    # its faults. A checker stays cut past its session (6 s) so its partitions move.
    faults += draw(FaultKind.CUT_CHECKER, checker_cuts, checkers, (10.0, 25.0))
    faults += draw(FaultKind.CUT_PRODUCER, producer_cuts, producers, (5.0, 15.0))
    if brokers > 1:
        cut_nodes = draw(FaultKind.CUT_NODE, node_cuts, brokers, (10.0, 20.0))
        faults += [replace(fault, target=fault.target + 1) for fault in cut_nodes]  # a node id
        faults += draw(FaultKind.CUT_HALF_LEADER, half_leader_cuts, partitions, (10.0, 20.0))
    # Kafka away last (only asked for with --park-when-unavailable): older seeds keep their
    # faults. On a cluster the target is the first node of the majority killed.
    away = draw(FaultKind.KAFKA_AWAY, kafka_outages, brokers if brokers > 1 else 0, (20.0, 30.0))
    faults += [replace(fault, target=fault.target + 1) if brokers > 1 else fault for fault in away]
    # A drain frozen, after them (parked rows are there only once Kafka was away): armed as
    # Kafka goes, it strikes the first replica caught draining once Kafka is back. Frozen
    # past the replicas' 6 s session, within the round writer's 30 s transaction timeout.
    frozen = draw(FaultKind.FREEZE_DRAINING_CHECKER, min(drain_freezes, len(away)), 0, (8.0, 16.0))
    faults += [
        replace(fault, at_share=outage.at_share)
        for fault, outage in zip(frozen, away, strict=False)
    ]
    return sorted(faults, key=lambda fault: fault.at_share)
