"""The relay's memory of first decisions: exact after shrinking, and restorable from metadata."""

from __future__ import annotations

import random

import pytest

from outbox_checker.decision_memory import MAX_INDEX, DecisionMemory, SharedScan


class OpLog:
    """An op partition in memory: identities at offsets, scanned like the relay scans Kafka."""

    def __init__(self) -> None:
        self.identities: list[int] = []
        self.scans = 0

    def append(self, identity: int) -> int:
        self.identities.append(identity)
        return len(self.identities) - 1

    def scan(self, identity: int, start: int, end: int) -> bool:
        self.scans += 1
        return identity in self.identities[start:end]


def test_a_second_decision_is_recognised_in_the_window():
    log, memory = OpLog(), DecisionMemory(capacity=10)
    assert memory.is_first(5, log.append(5), log.scan)
    assert not memory.is_first(5, log.append(5), log.scan)
    assert log.scans == 0


def test_memory_stays_exact_and_bounded_over_a_long_random_history():
    """Every op is judged as a full replay of the log would judge it, with a small window."""
    rng = random.Random(7)
    log, memory = OpLog(), DecisionMemory(capacity=50)
    decided: set[int] = set()
    next_identity = 0
    for _ in range(5_000):
        if rng.random() < 0.7 or not decided:
            identity, next_identity = next_identity, next_identity + rng.randint(1, 3)
        else:  # a later decision for an earlier half, sometimes far behind the window
            identity = rng.choice(sorted(decided))
        offset = log.append(identity)
        assert memory.is_first(identity, offset, log.scan) == (identity not in decided)
        decided.add(identity)
        memory.shrink(offset + 1)
        assert len(memory) <= 50
        assert len(memory.index) <= MAX_INDEX
    assert log.scans > 0, "the history never reached below the window: the test proves nothing"


def test_metadata_round_trips_the_floor_and_the_index():
    log, memory = OpLog(), DecisionMemory(capacity=4)
    for identity in range(20):
        memory.is_first(identity, log.append(identity), log.scan)
        memory.shrink(len(log.identities))
    restored = DecisionMemory.from_metadata(memory.metadata(), 4, low_offset=0)
    assert (restored.origin_floor, restored.op_floor, restored.index) == (
        memory.origin_floor,
        memory.op_floor,
        memory.index,
    )
    assert len(memory.metadata()) < 4096


def test_no_metadata_starts_at_the_partitions_first_op():
    memory = DecisionMemory.from_metadata(None, 100, low_offset=42)
    assert (memory.origin_floor, memory.op_floor, memory.index) == (0, 42, [])


@pytest.mark.parametrize("metadata", ["op=12", "relay1;o=1", "relay1;o=x;w=1;i="])
def test_unreadable_metadata_is_refused_not_guessed(metadata):
    with pytest.raises(ValueError):
        DecisionMemory.from_metadata(metadata, 100, low_offset=0)


def test_a_shared_scan_judges_a_burst_as_separate_scans_would_reading_each_op_once():
    rng = random.Random(23)
    log = OpLog()
    for _ in range(300):
        log.append(rng.randrange(100))
    read_ops: list[int] = []

    def read(start: int, end: int):
        read_ops.extend(range(start, end))
        return [(o, log.identities[o]) for o in range(start, min(end, len(log.identities)))]

    def bound(identity: int) -> int:
        """As the memory's index gives: no op names ``identity`` before it."""
        first = log.identities.index(identity) if identity in log.identities else 50
        return min(rng.randrange(0, 50), first)

    identities = [rng.randrange(100) for _ in range(60)]
    questions = [(i, bound(i), rng.randrange(200, 300)) for i in identities]
    questions.sort(key=lambda q: q[2])
    wanted = {identity for identity, _, _ in questions}
    shared = SharedScan(read, wanted, (min(q[1] for q in questions), max(q[2] for q in questions)))
    for identity, start, end in questions:
        assert shared(identity, start, end) == log.scan(identity, start, end)
    assert sorted(read_ops) == sorted(set(read_ops))  # no op read twice
    with pytest.raises(ValueError, match="not announced"):
        shared(1000, 0, 10)
