"""What one relay batch does with the decisions it read: the relay's rules, without Kafka.

Given the decoded op records of a batch, where each named half stands and the
op partitions' decision memories, :func:`decide_batch` says which decisions
publish (the *first* decision of a half, when it is a commit), which are second
decisions or rollbacks, which op partitions are held at a decision whose half
cannot be read yet, and the op offsets the batch commits. :class:`~outbox_checker.relay.Relay`
then restores the commits' real records and writes them in one Kafka transaction.
Asking Kafka where a half stands, and reading the op history for decisions below
a memory's floor, are the caller's: they come in as callables, asked lazily, so
a partition held at its first op asks nothing about the ops behind it.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from outbox.protocol import Decision, MalformedRecordError, RawRecord
from outbox_checker.decision_memory import DecisionMemory, ReadOps, Scan, SharedScan

log = logging.getLogger("outbox_checker.relay")  # the relay's one logger, whichever module logs


class HalfState(Enum):
    """Where the half an op names stands on its half partition."""

    READABLE = "readable"
    """Below the last stable offset: a committed read returns it (or finds it aborted)."""
    BEHIND_OPEN_TRANSACTION = "behind an open transaction"
    """Stored, but past the last stable offset: a transaction opened before it (a round
    writer's put-back chunk, a frozen or killed writer's) is still open on its partition."""
    PAST_ANSWERED_END = "past the end its half partition answered"
    """Past both ends Kafka answered for its partition, which a half stored before its op
    never is: an answer from a replica whose log ends earlier (a leader cut from its
    cluster, or deposed and not told yet) until the answers have said so for
    :data:`~outbox_checker.relay_lookups.PAST_END_PATIENCE_SECONDS`."""
    NOT_STORED = "not stored"
    """Past everything the partition holds, or before its own origin: a bogus op."""

    @property
    def waits(self) -> bool:
        """Whether an op naming such a half holds its op partition until asked again."""
        return self in (HalfState.BEHIND_OPEN_TRANSACTION, HalfState.PAST_ANSWERED_END)


@dataclass
class BatchReport:
    """What one relay transaction did."""

    decisions: int = 0
    """Op records relayed (the ones waiting for their half not counted)."""
    published: int = 0
    second_decisions: int = 0
    rollbacks: int = 0
    unpublishable: int = 0
    waiting: int = 0
    """Op partitions held at a decision whose half is behind an open transaction."""
    by_partition: dict[int, int] = field(default_factory=dict)
    finished: list[tuple[str, str, int]] = field(default_factory=list)
    """(real topic, producer group, half stored ms) of each publication, for the latency."""


@dataclass
class BatchPlan:
    """What :func:`decide_batch` decided for one batch."""

    report: BatchReport = field(default_factory=BatchReport)
    """Its counts so far: decisions, second decisions, rollbacks."""
    commits: dict[int, list[Decision]] = field(default_factory=lambda: defaultdict(list))
    """Per op partition, the first decisions that commit, in op order: what publishes."""
    next_offsets: dict[int, int] = field(default_factory=dict)
    """Per op partition, the op offset after the last decision relayed: what commits."""
    held: dict[int, int] = field(default_factory=dict)
    """Per op partition, the op whose half cannot be read yet: it and what follows wait."""
    waiting: list[tuple[RawRecord, Decision, HalfState]] = field(default_factory=list)
    """The op records at which partitions are held, with their decisions and why."""


def decode_op(raw: RawRecord) -> Decision | None:
    """The decision an op record holds; ``None`` (with a warning) for a malformed one."""
    try:
        return Decision.from_record(raw)
    except MalformedRecordError as exc:
        log.warning("ignoring a malformed op record: %s", exc)
        return None


def decide_batch(
    decisions: Sequence[tuple[RawRecord, Decision | None]],
    half_state: Callable[[Decision], HalfState],
    memory_of: Callable[[int], DecisionMemory],
    scans: Mapping[int, Scan],
) -> BatchPlan:
    """Judge a batch's op records, in order, against the memories of their op partitions.

    ``half_state`` is asked only for a decision of a partition not held yet, as
    the batch is judged. ``memory_of(partition)`` is called just before that
    partition's memory learns a decision: from then on the memory is no longer
    the committed offset's (a batch that fails midway leaves it so).
    ``scans`` judge, per op partition, decisions below its memory's floor.
    """
    plan = BatchPlan()
    report = plan.report
    for raw, decision in decisions:
        if raw.partition in plan.held:
            continue
        if decision is not None and decision.half_partition == raw.partition:
            state = half_state(decision)
            if state.waits:
                plan.held[raw.partition] = raw.offset
                plan.waiting.append((raw, decision, state))
                continue
        plan.next_offsets[raw.partition] = raw.offset + 1
        report.decisions += 1
        if decision is None or decision.half_partition != raw.partition:
            if decision is not None:
                log.warning(
                    "op at %s[%d] names half partition %d; ignored",
                    raw.topic,
                    raw.offset,
                    decision.half_partition,
                )
            continue
        if state is HalfState.NOT_STORED:
            log.warning(
                "op at %s[%d] names half %d:%d (origin %d), which its half partition "
                "cannot hold; ignored",
                raw.topic,
                raw.offset,
                decision.half_partition,
                decision.half_offset,
                decision.identity,
            )
            continue
        memory = memory_of(raw.partition)
        if not memory.is_first(decision.identity, raw.offset, scans[raw.partition]):
            report.second_decisions += 1
            continue
        if decision.commit:
            plan.commits[raw.partition].append(decision)
        else:
            report.rollbacks += 1
    return plan


def shared_scans(
    decisions: Sequence[tuple[RawRecord, Decision | None]],
    memories: Mapping[int, DecisionMemory],
    history_reader: Callable[[int, set[int]], ReadOps],
) -> dict[int, SharedScan]:
    """Per op partition, one reading of its history for the batch's decisions below the
    memory's floor (rare: decisions days late; a burst of them is read once).

    ``history_reader(partition, wanted)`` reads the op history of ``partition`` for
    the ``wanted`` identities; nothing is read until a scan is asked.
    """
    below: dict[int, set[int]] = defaultdict(set)
    spans: dict[int, tuple[int, int]] = {}
    for raw, decision in decisions:
        memory = memories[raw.partition]
        if decision is not None and decision.identity < memory.origin_floor:
            below[raw.partition].add(decision.identity)
            low, _ = spans.get(raw.partition, (raw.offset, raw.offset))
            spans[raw.partition] = (min(low, memory.lower_bound(decision.identity)), raw.offset)
    scans = {}
    for partition in {raw.partition for raw, _ in decisions}:
        wanted = below[partition]
        reader = history_reader(partition, wanted)
        scans[partition] = SharedScan(reader, wanted, spans.get(partition))
    return scans
