"""The relay's rules for one batch, without Kafka: what publishes, what waits, what commits.

Op records are built as producers, check answers and database resolutions write
them (:class:`~outbox.protocol.OpRecord`), and read back as the relay reads them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pytest

from outbox.protocol import Decision, OpRecord, RawRecord, Resolution, TopicNames
from outbox_checker.decision_memory import DecisionMemory, ReadOps
from outbox_checker.relay_batch import (
    BatchPlan,
    HalfState,
    decide_batch,
    decode_op,
    shared_scans,
)

NAMES = TopicNames("relay-batch")
COMMIT, ROLLBACK = Resolution.COMMIT, Resolution.ROLLBACK


def op(
    at: int,
    half_offset: int,
    resolution: Resolution = COMMIT,
    *,
    partition: int = 0,
    half_partition: int | None = None,
    origin: int | None = None,
) -> RawRecord:
    """The op record stored at ``partition``:``at`` deciding the half at ``half_offset``."""
    record = OpRecord(
        f"tx-{half_offset}",
        "orders",
        partition if half_partition is None else half_partition,
        half_offset,
        resolution,
        1,
        origin,
    ).to_record(NAMES)
    return RawRecord(NAMES.op, partition, at, record.key, record.value, tuple(record.headers))


class Batch:
    """Memories of op partitions and where their halves stand, judging batch after batch."""

    def __init__(self, partitions: Iterable[int] = (0, 1), capacity: int = 100) -> None:
        self.memories = {p: DecisionMemory(capacity) for p in partitions}
        self.states: dict[tuple[int, int], HalfState] = {}
        """Per (half partition, half offset) not readable: where it stands."""
        self.asked: list[tuple[int, int]] = []
        self.learning: list[int] = []
        self.history: dict[int, list[tuple[int, int]]] = {}
        """Per op partition, (op offset, identity) of the decisions read from its history."""

    def half_state(self, decision: Decision) -> HalfState:
        key = (decision.half_partition, decision.half_offset)
        self.asked.append(key)
        return self.states.get(key, HalfState.READABLE)

    def memory_of(self, partition: int) -> DecisionMemory:
        self.learning.append(partition)
        return self.memories[partition]

    def reader(self, partition: int, wanted: set[int]) -> ReadOps:
        def read(start: int, end: int) -> Iterator[tuple[int, int]]:
            return iter([(o, i) for o, i in self.history.get(partition, []) if start <= o < end])

        return read

    def decide(self, *records: RawRecord) -> BatchPlan:
        decisions = [(raw, decode_op(raw)) for raw in records]
        scans = shared_scans(decisions, self.memories, self.reader)
        return decide_batch(decisions, self.half_state, self.memory_of, scans)


def published(plan: BatchPlan) -> dict[int, list[int]]:
    """Per op partition, the half offsets whose real records go out."""
    return {p: [d.half_offset for d in ops] for p, ops in plan.commits.items() if ops}


def test_a_commit_publishes_and_its_offset_commits() -> None:
    plan = Batch().decide(op(10, 5))
    assert published(plan) == {0: [5]}
    assert plan.next_offsets == {0: 11}
    assert plan.held == {} and plan.waiting == []
    assert plan.report.decisions == 1 and plan.report.rollbacks == 0


def test_a_rollback_publishes_nothing_but_is_relayed() -> None:
    plan = Batch().decide(op(10, 5, ROLLBACK))
    assert published(plan) == {}
    assert plan.next_offsets == {0: 11}
    assert plan.report.rollbacks == 1


def test_a_repeated_decision_publishes_once_within_a_batch_and_across_batches() -> None:
    batch = Batch()
    plan = batch.decide(op(10, 5), op(11, 5))
    assert published(plan) == {0: [5]}
    assert plan.report.second_decisions == 1
    assert plan.next_offsets == {0: 12}
    later = batch.decide(op(12, 5))  # a late own end, a second check answer
    assert published(later) == {}
    assert later.report.second_decisions == 1


def test_the_first_decision_wins_a_commit_after_a_rollback_publishes_nothing() -> None:
    plan = Batch().decide(op(10, 5, ROLLBACK), op(11, 5, COMMIT))
    assert published(plan) == {}
    assert plan.report.rollbacks == 1 and plan.report.second_decisions == 1


def test_copies_of_one_half_share_its_identity() -> None:
    """A put-back copy's decision names the copy, but decides the original (its origin)."""
    plan = Batch().decide(op(10, 5), op(11, 40, origin=5))
    assert published(plan) == {0: [5]}
    assert plan.report.second_decisions == 1


@pytest.mark.parametrize(
    "state", [HalfState.BEHIND_OPEN_TRANSACTION, HalfState.PAST_ANSWERED_END], ids=str
)
def test_a_decision_whose_half_cannot_be_read_yet_holds_its_partition(state: HalfState) -> None:
    """Behind a transaction still open on the half partition, or past the ends a replica
    answered (a stale one, until its answers have said so long enough)."""
    batch = Batch()
    batch.states[0, 5] = state
    behind = op(10, 5)
    plan = batch.decide(behind, op(11, 6), op(3, 7, partition=1))
    assert plan.held == {0: 10}
    assert [(raw, why) for raw, _, why in plan.waiting] == [(behind, state)]
    assert published(plan) == {1: [7]}, "another partition does not wait"
    assert plan.next_offsets == {1: 4}, "nothing of the held partition commits"
    assert (0, 6) not in batch.asked, "the ops behind the held one are not judged"
    assert plan.report.decisions == 1
    again = batch.decide(op(10, 5), op(11, 6))  # read again, still behind
    assert published(again) == {} and again.held == {0: 10}
    del batch.states[0, 5]  # the transaction ended
    assert published(batch.decide(op(10, 5), op(11, 6))) == {0: [5, 6]}


def test_an_op_naming_another_half_partition_is_ignored_and_passed() -> None:
    batch = Batch()
    plan = batch.decide(op(10, 5, half_partition=1))
    assert published(plan) == {}
    assert plan.next_offsets == {0: 11}
    assert batch.learning == [], "its memory learned nothing"


def test_a_half_the_partition_cannot_hold_is_ignored_without_learning_it() -> None:
    batch = Batch()
    batch.states[0, 10**12] = HalfState.NOT_STORED
    plan = batch.decide(op(10, 10**12))
    assert published(plan) == {} and plan.next_offsets == {0: 11}
    assert batch.learning == []
    assert len(batch.memories[0]) == 0, "a bogus identity would pin the memory's floor"


def test_a_malformed_op_record_is_passed(caplog: pytest.LogCaptureFixture) -> None:
    plan = Batch().decide(RawRecord(NAMES.op, 0, 10, headers=(("outbox-kind", b"op"),)))
    assert published(plan) == {} and plan.next_offsets == {0: 11}
    assert "ignoring a malformed op record" in caplog.text


def test_a_decision_below_the_memorys_floor_is_judged_from_the_op_history() -> None:
    batch = Batch(capacity=2)
    for at, half in enumerate(range(4)):
        batch.decide(op(at, half))
        batch.memories[0].shrink(at + 1)
    assert batch.memories[0].origin_floor > 0
    batch.history[0] = [(0, 0), (1, 1), (2, 2), (3, 3)]
    plan = batch.decide(op(4, 0), op(5, 4))
    assert published(plan) == {0: [4]}
    assert plan.report.second_decisions == 1


def test_each_partition_that_learns_is_named_before_it_learns() -> None:
    batch = Batch()
    batch.decide(op(10, 5), op(11, 6, ROLLBACK), op(3, 7, partition=1, half_partition=0))
    assert batch.learning == [0, 0]
