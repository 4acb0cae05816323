"""The relay against a real broker: each committed half reaches its real topic exactly once.

Halves and decisions are written as records (as producers, check answers and
database resolutions write them), so each test states exactly which decisions
the op partition holds, in which order.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ClassVar

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from prometheus_client import REGISTRY

from outbox.errors import KafkaUnavailableError
from outbox.protocol import (
    DiscardReason,
    DiscardRecord,
    HalfRecord,
    OpRecord,
    OutgoingRecord,
    RealRecord,
    Resolution,
    murmur2,
)
from outbox_checker import membership, relay_lookups, relay_transaction
from outbox_checker.kafka_reader import watermark_client
from outbox_checker.relay import BatchReport, Relay, RelaySettings
from outbox_devtools.processes import free_port
from tests.checker.support import pending_half, wait_for, write
from tests.producer.conftest import OutboxTopics

pytestmark = pytest.mark.kafka

COMMIT, ROLLBACK = Resolution.COMMIT, Resolution.ROLLBACK


@contextmanager
def relay_of(
    topics: OutboxTopics,
    *,
    group: str | None = None,
    memory: int = 1000,
    silence_seconds: float = 10.0,
    batch: int = 100,
    now_ms: Callable[[], int] = lambda: int(time.time() * 1000),
) -> Iterator[Relay]:
    """A relay of the test's topics that owns every op partition (one member in its group)."""
    relay = Relay(
        topics.client_config,
        topics.names,
        group_id=group or f"{topics.names.prefix}.relay",
        transactional_id=f"{topics.names.prefix}.relay.{uuid.uuid4().hex[:8]}",
        settings=RelaySettings(batch=batch, memory=memory, silence_seconds=silence_seconds),
        now_ms=now_ms,
    )
    try:
        deadline = time.monotonic() + 60
        while len(relay.partitions) < 3:
            assert time.monotonic() < deadline, "the relay got no op partitions"
            relay.pump(0.2)
        yield relay
    finally:
        relay.close()


def a_relay(topics: OutboxTopics, transactional_id: str, timeout: float = 5.0) -> Relay:
    """A relay in the test's relay group, not started."""
    return Relay(
        topics.client_config,
        topics.names,
        group_id=f"{topics.names.prefix}.relay",
        transactional_id=transactional_id,
        settings=RelaySettings(batch=100, timeout=timeout),
    )


def before_each_restore(relay: Relay, hook: Callable[[int], None]) -> None:
    """Call ``hook(partition)`` before each restore of one of the relay's op partitions, to
    slow it down or make it fail."""
    restore = relay.op_partitions.restore

    def hooked(partition: int) -> int:
        hook(partition)
        return restore(partition)

    relay.op_partitions.restore = hooked  # type: ignore[method-assign]


def drain(relay: Relay, quiet_seconds: float = 1.5) -> None:
    """Pump until nothing arrived for ``quiet_seconds``."""
    last = time.monotonic()
    while time.monotonic() - last < quiet_seconds:
        if relay.pump(0.2).decisions:
            last = time.monotonic()


def write_half(topics: OutboxTopics, half: HalfRecord, partition: int = 0) -> int:
    ((_, offset),) = write(topics, half.to_record(topics.names, partition))
    return offset


def write_halves(topics: OutboxTopics, halves: list[HalfRecord]) -> list[int]:
    """Their offsets on half partition 0, in one write (a write is a client's start)."""
    return [offset for _, offset in write(topics, *(h.to_record(topics.names, 0) for h in halves))]


def decision(
    topics: OutboxTopics,
    half: HalfRecord,
    offset: int,
    resolution: Resolution,
    *,
    origin: int | None = None,
    partition: int = 0,
) -> OutgoingRecord:
    op = OpRecord(
        half.transaction_id, half.producer_group, partition, offset, resolution, 1, origin
    )
    return op.to_record(topics.names)


def decide(
    topics: OutboxTopics, half: HalfRecord, offset: int, resolution: Resolution, **where: int
) -> None:
    """Write the decision on ``half`` (``where``: its ``partition``, ``origin``)."""
    write(topics, decision(topics, half, offset, resolution, **where))


def commit_all(topics: OutboxTopics, halves: list[HalfRecord], offsets: list[int]) -> None:
    """A commit decision for each half (at its offset on partition 0), in one write."""
    write(
        topics,
        *(decision(topics, h, o, COMMIT) for h, o in zip(halves, offsets, strict=True)),
    )


def published(topics: OutboxTopics) -> Counter[str]:
    return Counter(RealRecord.from_record(r).transaction_id for r in topics.read(topics.real_topic))


def test_first_decision_wins_and_each_commit_is_published_once(outbox_topics: OutboxTopics):
    t = outbox_topics
    halves = {name: pending_half(t, f"{name}-{uuid.uuid4().hex[:6]}") for name in "abcde"}
    at = {name: write_half(t, half) for name, half in halves.items()}
    copy_of_c = halves["c"].put_back(at["c"], None)
    copy_at = write_half(t, copy_of_c)
    decide(t, halves["a"], at["a"], COMMIT)
    decide(t, halves["b"], at["b"], ROLLBACK)
    decide(t, halves["c"], at["c"], COMMIT)  # own end
    decide(t, copy_of_c, copy_at, COMMIT, origin=at["c"])  # a check answer for its copy
    decide(t, halves["d"], at["d"], ROLLBACK)
    decide(t, halves["d"], at["d"], COMMIT)  # a commit after a rollback: never published
    # e: no decision at all
    with relay_of(t) as relay:
        drain(relay)
    ids = {name: half.transaction_id for name, half in halves.items()}
    assert published(t) == Counter({ids["a"]: 1, ids["c"]: 1})


def test_the_real_record_is_restored_from_the_half(outbox_topics: OutboxTopics):
    t = outbox_topics
    half = pending_half(t, "restored", user_headers=[("trace", b"abc"), ("empty", None)])
    offset = write_half(t, half)
    decide(t, half, offset, COMMIT)
    with relay_of(t) as relay:
        drain(relay)
    (raw,) = t.read(t.real_topic)
    real = RealRecord.from_record(raw)
    assert (real.key, real.value, real.producer_group) == (half.key, half.value, "orders")
    assert real.user_headers == [("trace", b"abc"), ("empty", None)]


def test_a_reused_transaction_id_is_a_new_half(outbox_topics: OutboxTopics):
    """A caller retries with the id of a rolled-back send: the retry commits and is published."""
    t = outbox_topics
    first = pending_half(t, "reused-id")
    first_at = write_half(t, first)
    decide(t, first, first_at, ROLLBACK)
    retry = pending_half(t, "reused-id", value=b"retry")
    retry_at = write_half(t, retry)
    decide(t, retry, retry_at, COMMIT)
    with relay_of(t) as relay:
        drain(relay)
    (raw,) = t.read(t.real_topic)
    assert raw.value == b"retry"


def test_a_restarted_relay_remembers_what_it_published(outbox_topics: OutboxTopics):
    """The memory of decisions is rebuilt from the committed offsets and the op history."""
    t = outbox_topics
    half = pending_half(t, f"restart-{uuid.uuid4().hex[:6]}")
    offset = write_half(t, half)
    decide(t, half, offset, COMMIT)
    with relay_of(t) as relay:
        drain(relay)
    assert published(t) == Counter({half.transaction_id: 1})
    copy = half.put_back(offset, None)
    copy_at = write_half(t, copy)
    decide(t, copy, copy_at, COMMIT, origin=offset)  # a late check answer, after the restart
    with relay_of(t) as relay:
        drain(relay)
    assert published(t) == Counter({half.transaction_id: 1})


def test_a_decision_older_than_the_memory_is_judged_from_the_op_history(
    outbox_topics: OutboxTopics,
):
    """With room for 2 identities, late decisions for early halves are still judged exactly."""
    t = outbox_topics
    halves = [pending_half(t, f"old-{n}-{uuid.uuid4().hex[:6]}") for n in range(12)]
    offsets = write_halves(t, halves)
    commit_all(t, halves[:10], offsets[:10])
    with relay_of(t, memory=2) as relay:
        drain(relay)
        decide(t, halves[0], offsets[0], COMMIT)  # long decided: nothing
        decide(t, halves[10], offsets[10], COMMIT)  # a first decision: published
        drain(relay)
    with relay_of(t, memory=2) as relay:  # and again after a restart
        decide(t, halves[1], offsets[1], COMMIT)
        decide(t, halves[11], offsets[11], COMMIT)
        drain(relay)
    assert published(t) == Counter({h.transaction_id: 1 for h in halves})


def test_an_unpublishable_commit_is_discarded_and_the_partition_moves_on(
    outbox_topics: OutboxTopics,
):
    t = outbox_topics
    lost_topic = pending_half(t, "no-such-topic", real_topic=f"{t.names.prefix}-missing")
    after = pending_half(t, "after-it")
    commit_all(t, [lost_topic, after], write_halves(t, [lost_topic, after]))
    with relay_of(t) as relay:
        drain(relay)
    assert published(t) == Counter({"after-it": 1})
    (discard,) = [DiscardRecord.from_record(r) for r in t.read(t.names.discard)]
    assert discard.reason is DiscardReason.UNPUBLISHABLE
    assert "does not exist" in (discard.detail or "")
    assert discard.original_half().transaction_id == "no-such-topic"


def test_a_real_record_lands_on_the_partition_a_java_producer_would_choose(
    outbox_topics: OutboxTopics,
):
    """Kafka's default partitioner: murmur2 of the key, positive, modulo the partitions."""
    t = outbox_topics
    halves = [pending_half(t, f"key-{n}") for n in range(20)]
    commit_all(t, halves, write_halves(t, halves))
    with relay_of(t) as relay:
        drain(relay)
    records = t.read(t.real_topic)
    assert len(records) == 20
    for raw in records:
        assert raw.key is not None
        assert raw.partition == (murmur2(raw.key) & 0x7FFFFFFF) % 2


def test_a_stuck_relay_transaction_is_abandoned_fenced_and_its_batch_published_once(
    outbox_topics: OutboxTopics, monkeypatch: pytest.MonkeyPatch
):
    """librdkafka can block in send_offsets_to_transaction for minutes after a broker
    restart; the relay gives up on such a batch at its deadline (5 s: a batch commits in
    ms), fences the stuck producer and reads the batch again. The stuck call is made to
    hang where that one hangs."""
    t = outbox_topics
    half = pending_half(t, f"stuck-{uuid.uuid4().hex[:6]}")
    decide(t, half, write_half(t, half), COMMIT)
    release = threading.Event()

    class HangsOnce(Producer):
        hung = False
        returned = False

        def send_offsets_to_transaction(self, *args, **kwargs):
            if not HangsOnce.hung:
                HangsOnce.hung = True
                release.wait(600)  # as if stuck in the client, for longer than any wait here
                HangsOnce.returned = True
            return super().send_offsets_to_transaction(*args, **kwargs)

    monkeypatch.setattr(relay_transaction, "Producer", HangsOnce)  # the relay's producers
    relay = a_relay(t, f"{t.names.prefix}.relay.stuck", timeout=2.0)
    relay.start()
    try:
        wait_for(lambda: HangsOnce.hung, what="the stuck batch")
        wait_for(lambda: published(t) == Counter({half.transaction_id: 1}), 120, "publication")
        # Published while the stuck call still hangs: the batch was abandoned, not waited for.
        assert not HangsOnce.returned
        release.set()  # the abandoned call wakes up: its producer was fenced
        time.sleep(3)
        assert published(t) == Counter({half.transaction_id: 1})
    finally:
        release.set()
        relay.close()


def publish_past_a_wedge(
    t: OutboxTopics, relay: Relay, name: str, seconds: float, failure: Callable[[], str]
) -> tuple[Consumer, HalfRecord]:
    """Wedge the relay's consumer (paused: it hears nothing, as after a frozen broker),
    commit a half and pump until it is published; the wedged consumer and the half."""
    wedged = relay.op_partitions.consumer
    wedged.pause(wedged.assignment())
    half = pending_half(t, name)
    decide(t, half, write_half(t, half), COMMIT)
    deadline = time.monotonic() + seconds
    while not published(t):
        assert time.monotonic() < deadline, failure()
        relay.pump(0.2)
    return wedged, half


def test_a_relay_whose_consumer_went_silent_reads_on_with_a_fresh_one(outbox_topics: OutboxTopics):
    """A wedged consumer (here: paused, as a frozen broker can leave librdkafka) hears nothing.

    The relay sees committed decisions beyond what it read while idle, and
    replaces the consumer; the commit is published once, without a restart.
    """
    t = outbox_topics
    with relay_of(t, silence_seconds=1.0) as relay:
        wedged, half = publish_past_a_wedge(
            t, relay, "after-the-wedge", 60, lambda: "the silent consumer was never replaced"
        )
        drain(relay)
        assert relay.op_partitions.consumer is not wedged
    assert published(t) == Counter({half.transaction_id: 1})


def test_a_relay_slow_to_take_its_partitions_does_not_take_that_time_for_silence(
    outbox_topics: OutboxTopics, monkeypatch: pytest.MonkeyPatch
):
    """The seconds an assignment spends restoring partitions are not the consumer's silence.

    Silence was counted from the relay's idle polls before the assignment: over a slow
    restore it outlasted ``silence_seconds``, the decisions waiting past the restored
    offsets made the fresh consumer look wedged too, and each replacement began another
    slow assignment (a chaos run's takeover at a load of 50 lost 5 s to one).
    """
    t = outbox_topics
    consumers_made: list[Consumer] = []
    group_member = membership.group_member

    def counted(*args, **kwargs):
        consumer, session_log = group_member(*args, **kwargs)
        consumers_made.append(consumer)
        return consumer, session_log

    monkeypatch.setattr(membership, "group_member", counted)
    relay = Relay(
        t.client_config,
        t.names,
        group_id=f"{t.names.prefix}.relay",
        transactional_id=f"{t.names.prefix}.relay.{uuid.uuid4().hex[:8]}",
        settings=RelaySettings(batch=100, silence_seconds=1.0),
    )
    # As on a loaded machine (the committed offset asked, the op history re-read), inside
    # the assignment callback.
    before_each_restore(relay, lambda _: time.sleep(0.5))
    try:
        deadline = time.monotonic() + 60
        while len(relay.partitions) < 3:
            assert time.monotonic() < deadline, "the relay got no op partitions"
            relay.pump(0.2)
        wedged, half = publish_past_a_wedge(
            t,
            relay,
            "waiting-at-the-takeover",
            120,
            lambda: f"not published; {len(consumers_made)} consumers made",
        )
        assert relay.op_partitions.consumer is not wedged
        assert len(consumers_made) == 2, "a fresh consumer was taken for a wedged one"
    finally:
        relay.close()
    assert published(t) == Counter({half.transaction_id: 1})


def sample(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_finish_latency_counts_from_the_halves_store_time_to_its_publication(
    outbox_topics: OutboxTopics,
):
    """RocketMQ's born-to-finish latency, on the cluster's clocks: the original half's store
    time (a copy carries it) to the relay's clock after publishing; rollbacks publish nothing."""
    t = outbox_topics
    original = pending_half(t, "original", age_seconds=3600)  # a producer clock an hour off
    original_at = write_half(t, original)
    (stored,) = [r.timestamp_ms for r in t.read(t.names.half) if r.offset == original_at]
    assert stored is not None
    copied_origin_at = write_half(t, pending_half(t, "copied"))  # a copy follows its origin
    copied = pending_half(t, "copied").put_back(copied_origin_at, stored_ms=stored - 60_000)
    rolled_back = pending_half(t, "rolled-back")
    decide(t, original, original_at, COMMIT)
    decide(t, copied, write_half(t, copied), COMMIT, origin=copied_origin_at)
    decide(t, rolled_back, write_half(t, rolled_back), ROLLBACK)
    labels = {"real_topic": t.real_topic, "group": "orders"}
    with relay_of(t, now_ms=lambda: stored + 2_500) as relay:
        drain(relay)
    assert published(t) == Counter({"original": 1, "copied": 1})
    assert sample("outbox_finish_message_latency_seconds_count", labels) == 2
    assert sample("outbox_finish_message_latency_seconds_sum", labels) == 2.5 + 62.5
    assert sample("outbox_finish_message_latency_seconds_bucket", {**labels, "le": "5.0"}) == 1


def test_relay_lag_is_what_each_op_partition_holds_beyond_the_relayed(
    outbox_topics: OutboxTopics,
):
    """Counted per op partition; ops written in a Kafka transaction (as the checker's
    database resolutions are) leave no lag behind for their transaction markers."""
    t = outbox_topics
    halves = [pending_half(t, f"lag-{n}") for n in range(5)]
    offsets = [off for _, off in write(t, *(h.to_record(t.names, 0) for h in halves))]
    ops = [
        OpRecord(h.transaction_id, "orders", 0, offset, COMMIT, 1)
        for h, offset in zip(halves, offsets, strict=True)
    ]
    with relay_of(t, batch=2) as relay:
        write(t, *(op.to_record(t.names) for op in ops))  # one batch: fetched all at once
        report = BatchReport()
        while not report.decisions:
            report = relay.pump(5)
        assert report.decisions == 2
        assert REGISTRY.get_sample_value("outbox_checker_relay_lag", {"partition": "0"}) == 3
        resolved = pending_half(t, "resolved")
        op = OpRecord("resolved", "orders", 1, write_half(t, resolved, 1), COMMIT, 1)
        with transactional_producer(t) as producer:
            producer.produce(**op.to_record(t.names).produce_kwargs())
        drain(relay)
        assert published(t) == Counter({h.transaction_id: 1 for h in [*halves, resolved]})
        for partition in ("0", "1", "2"):
            lag = REGISTRY.get_sample_value("outbox_checker_relay_lag", {"partition": partition})
            assert lag == 0, partition


@contextmanager
def transactional_producer(topics: OutboxTopics) -> Iterator[Producer]:
    """Records produced in the block are committed in one Kafka transaction."""
    producer = Producer(
        {**topics.client_config, "transactional.id": f"{topics.names.prefix}.tx.{uuid.uuid4()}"}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    yield producer
    producer.commit_transaction(30)


def test_a_partition_the_relay_could_not_rewind_does_not_skip_its_failed_batch(
    outbox_topics: OutboxTopics,
):
    """After a failed batch the relay rewinds each op partition to its committed offset. While
    the group coordinator moves, reading that offset fails (NOT_COORDINATOR); a partition left
    so stands past the aborted batch, and relaying on from there commits offsets beyond a
    decision never published. A three-broker chaos run lost a commit that way. Here the batch
    fails for real (the relay's producer is fenced); the rewind's read is made to fail once."""
    t = outbox_topics
    transactional_id = f"{t.names.prefix}.relay.rewind"

    failing = threading.Event()

    def fail_while_failing(partition: int) -> None:
        if failing.is_set():
            raise KafkaException(KafkaError(KafkaError.NOT_COORDINATOR))

    relay = Relay(
        t.client_config,
        t.names,
        group_id=f"{t.names.prefix}.relay",
        transactional_id=transactional_id,
        settings=RelaySettings(batch=100, timeout=5.0),
    )
    before_each_restore(relay, fail_while_failing)
    try:
        wait_for(lambda: relay.pump(0.2) is not None and len(relay.partitions) == 3, what="owns")
        lost = pending_half(t, f"rewound-{uuid.uuid4().hex[:6]}")
        decide(t, lost, write_half(t, lost), COMMIT)
        zombie_killer = Producer({**t.client_config, "transactional.id": transactional_id})
        zombie_killer.init_transactions(30)  # fences the relay's producer
        del zombie_killer
        failed = False
        deadline = time.monotonic() + 120
        while not failed and time.monotonic() < deadline:
            try:
                relay.pump(0.2)
            except KafkaException:
                failed = True
        assert failed, "the fenced batch did not fail"
        failing.set()
        relay.rewind()  # what run() does after a failed batch
        failing.clear()
        later = pending_half(t, f"later-{uuid.uuid4().hex[:6]}")
        decide(t, later, write_half(t, later), COMMIT)
        drain(relay)
    finally:
        failing.clear()
        relay.close()
    assert published(t) == Counter({lost.transaction_id: 1, later.transaction_id: 1})


@pytest.mark.parametrize(
    "failure",
    [KafkaUnavailableError("op history unreadable"), ValueError("metadata not understood")],
    ids=["unavailable", "value-error"],
)
def test_an_op_partition_whose_restore_fails_at_assignment_is_retried_not_orphaned(
    outbox_topics: OutboxTopics, failure: Exception
):
    """Rebuilding a newly assigned partition's memory can fail with more than a KafkaException
    (the op history unreadable, the committed metadata not understood). Such a partition must
    wait to be restored again, not be dropped while assigned: its decisions would never be
    published, its offsets never committed, and its lag unseen."""
    t = outbox_topics
    half = pending_half(t, f"orphan-{uuid.uuid4().hex[:6]}")
    decide(t, half, write_half(t, half), COMMIT)

    failures = [failure]

    def first_restore_fails(partition: int) -> None:
        if partition == 0 and failures:
            raise failures.pop()

    relay = a_relay(t, f"{t.names.prefix}.relay.{uuid.uuid4().hex[:8]}")
    before_each_restore(relay, first_restore_fails)
    relay.start()  # run(): a failed batch is logged and the relay reads on
    try:
        wait_for(lambda: published(t) == Counter({half.transaction_id: 1}), 30, "published")
        assert relay.partitions == [0, 1, 2]
    finally:
        relay.close()


def test_a_burst_below_the_memory_floor_reads_the_op_history_once_per_batch(
    outbox_topics: OutboxTopics,
):
    """Decisions below the window's floor are judged from the op history. A burst of them
    (a ``discard resume --all``, a database resolver catching up) judged one by one rereads
    that history per decision: a batch that outlasts the poll interval and repeats after the
    rewind. One batch reads it once for all of them, and still judges each exactly."""
    t = outbox_topics
    halves = [pending_half(t, f"burst-{n}-{uuid.uuid4().hex[:6]}") for n in range(40)]
    offsets = [offset for _, offset in write(t, *(h.to_record(t.names, 0) for h in halves))]

    def ops(resolutions: list[Resolution]) -> list:
        return [
            OpRecord(h.transaction_id, h.producer_group, 0, o, r, 1).to_record(t.names)
            for h, o, r in zip(halves, offsets, resolutions, strict=False)
        ]

    write(t, *ops([COMMIT] * 30))
    with relay_of(t, memory=2, batch=500) as relay:
        drain(relay)
        reads = []
        history = relay.lookups.op_history
        original = history.read

        def counted(partition: int, start: int, limit: int):
            reads.append((partition, start))
            return original(partition, start, limit)

        history.read = counted  # type: ignore[method-assign]
        write(t, *ops([COMMIT] * 30 + [ROLLBACK] * 5 + [COMMIT] * 5))  # 30 late, 10 first
        drain(relay)
    assert published(t) == Counter(
        {h.transaction_id: 1 for n, h in enumerate(halves) if n < 30 or n >= 35}
    )
    assert len(reads) <= 3, f"{len(reads)} reads of the op history for one burst"


class SteppedClock:
    """Wall milliseconds that move only when the test says: the relay's ``now_ms``."""

    def __init__(self) -> None:
        self.ms = int(time.time() * 1000)

    def __call__(self) -> int:
        return self.ms

    def advance(self, seconds: float) -> None:
        self.ms += int(seconds * 1000)


def test_an_op_naming_a_half_beyond_the_half_partition_does_not_pin_the_memory_floor(
    outbox_topics: OutboxTopics,
):
    """A bogus op (a huge origin offset, from a buggy or hostile writer) named the highest
    identity, which the memory's window never drops: its op offset pinned the window's op
    floor, so every restart re-read the op partition from there, for ever. An op for a half
    the partition's ends keep saying it cannot hold (for PAST_END_PATIENCE_SECONDS: one
    answer may be a stale replica's) is no decision; it is ignored with a warning."""
    t = outbox_topics
    bogus = pending_half(t, f"bogus-{uuid.uuid4().hex[:6]}")
    write(t, OpRecord(bogus.transaction_id, "orders", 0, 10**12, COMMIT, 1).to_record(t.names))
    halves = [pending_half(t, f"after-{n}-{uuid.uuid4().hex[:6]}") for n in range(8)]
    offsets = [offset for _, offset in write(t, *(h.to_record(t.names, 0) for h in halves))]
    ops = [
        OpRecord(h.transaction_id, h.producer_group, 0, o, COMMIT, 1).to_record(t.names)
        for h, o in zip(halves, offsets, strict=True)
    ]
    write(t, *ops)
    clock = SteppedClock()
    with relay_of(t, memory=2, now_ms=clock) as relay:
        drain(relay)
        assert published(t) == Counter(), "the ops behind the one that waits were relayed"
        clock.advance(relay_lookups.PAST_END_PATIENCE_SECONDS)
        drain(relay)
        floor = relay.op_partitions.memories[0].op_floor
    assert published(t) == Counter({h.transaction_id: 1 for h in halves})
    assert floor > 0, "the bogus op at op offset 0 still holds the memory's floor"


def test_a_commit_whose_half_a_replica_answers_past_its_end_waits_and_is_published(
    outbox_topics: OutboxTopics,
):
    """A half is acknowledged before the op that decides it is written, but a leader cut
    from its cluster (or deposed and not told yet) answers ends from a log that stops
    earlier. The relay took one such answer for proof of a bogus op and dropped the
    committed transaction. Here the answer is behind because the half comes after its op:
    the op must wait for it, and the transaction be published once."""
    t = outbox_topics
    before = pending_half(t, f"before-{uuid.uuid4().hex[:6]}")
    late = pending_half(t, f"late-{uuid.uuid4().hex[:6]}")
    at = write_half(t, before)
    decide(t, late, at + 1, COMMIT)
    clock = SteppedClock()
    with relay_of(t, now_ms=clock) as relay:
        drain(relay)
        clock.advance(relay_lookups.PAST_END_PATIENCE_SECONDS / 2)
        drain(relay)
        assert published(t) == Counter(), "published with no half to restore it from"
        assert write_half(t, late) == at + 1
        clock.advance(1.0)  # past the interval between askings
        deadline = time.monotonic() + 120
        while published(t)[late.transaction_id] != 1:
            assert time.monotonic() < deadline, "the committed transaction was never published"
            relay.pump(0.5)
        drain(relay)
    assert published(t) == Counter({late.transaction_id: 1})


def test_an_out_of_range_answer_never_moves_the_relay_back_to_decisions_it_published(
    outbox_topics: OutboxTopics,
):
    """A leader cut from its cluster answers from a log that ends earlier: asked for the op
    at the relay's position it says "out of range", and the relay's consumer reset to the
    earliest op, read decisions it had published again and published them twice (18 in a
    three-node chaos run). Here the position is past the log, as such a leader sees it."""
    t = outbox_topics
    halves = [pending_half(t, f"once-{n}-{uuid.uuid4().hex[:6]}") for n in range(8)]
    commit_all(t, halves, write_halves(t, halves))
    with relay_of(t, memory=2) as relay:
        drain(relay)
        assert published(t) == Counter({h.transaction_id: 1 for h in halves})
        consumer = relay.op_partitions.consumer
        (position,) = consumer.position([TopicPartition(t.names.op, 0)])
        consumer.seek(TopicPartition(t.names.op, 0, position.offset + 1_000))
        with pytest.raises(KafkaUnavailableError, match=r"read again from the committed"):
            drain(relay)
        relay.rewind()  # what the relay's loop does after a failed batch
        later = pending_half(t, f"later-{uuid.uuid4().hex[:6]}")
        decide(t, later, write_half(t, later), COMMIT)
        deadline = time.monotonic() + 120
        while published(t)[later.transaction_id] != 1:
            assert time.monotonic() < deadline, "the relay did not go on after the rewind"
            relay.pump(0.5)
        drain(relay)
    assert published(t) == Counter({h.transaction_id: 1 for h in [*halves, later]})


def test_ops_retention_removed_before_the_relay_read_them_do_not_stop_it(
    outbox_topics: OutboxTopics, kafka_admin: AdminClient, caplog: pytest.LogCaptureFixture
):
    """The relay's consumer resets nowhere (the test above), so a committed offset below the
    partition's first op (retention removed the ops the relay had not read yet) would be
    answered "out of range" at every read: the relay resumes at the first op still stored,
    and says which ops it never saw."""
    t = outbox_topics
    first = pending_half(t, f"first-{uuid.uuid4().hex[:6]}")
    decide(t, first, write_half(t, first), COMMIT)
    with relay_of(t) as relay:
        drain(relay)
    assert published(t) == Counter({first.transaction_id: 1})
    unread = [pending_half(t, f"unread-{n}-{uuid.uuid4().hex[:6]}") for n in range(3)]
    commit_all(t, unread, write_halves(t, unread))
    for future in kafka_admin.delete_records([TopicPartition(t.names.op, 0, -1)]).values():
        future.result()  # what retention does: every op of partition 0, to its end, is gone
    later = pending_half(t, f"later-{uuid.uuid4().hex[:6]}")
    decide(t, later, write_half(t, later), COMMIT)
    with caplog.at_level(logging.WARNING, logger="outbox_checker.relay"), relay_of(t) as relay:
        deadline = time.monotonic() + 120
        while published(t)[later.transaction_id] != 1:
            assert time.monotonic() < deadline, "the relay did not go on past the removed ops"
            relay.pump(0.5)
        drain(relay)
    assert published(t) == Counter({first.transaction_id: 1, later.transaction_id: 1})
    assert any(
        "were removed by retention before the relay read them" in record.getMessage()
        for record in caplog.records
    )


@contextmanager
def open_transaction_on(topics: OutboxTopics, partition: int) -> Iterator[None]:
    """A Kafka transaction holding ``partition`` of the half topic open (as a frozen round
    writer's put-back chunk does) until the block ends; then it commits. Its timeout (300 s)
    outlasts every wait in the block: only the commit ends it, never the broker's abort."""
    producer = Producer(
        {
            **topics.client_config,
            "transactional.id": f"{topics.names.prefix}.open",
            "transaction.timeout.ms": 300000,
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    blocker = pending_half(topics, f"blocker-{uuid.uuid4().hex[:6]}")
    producer.produce(**blocker.to_record(topics.names, partition).produce_kwargs())
    producer.flush(30)
    try:
        yield
    finally:
        producer.commit_transaction(30)


def test_a_decision_for_a_half_behind_an_open_transaction_waits_for_it(
    outbox_topics: OutboxTopics,
):
    """A half stored after a transaction still open on its partition lies past the
    partition's last stable offset, though it is stored and acknowledged. The relay took an
    op naming it for a bogus one ("which its half partition cannot hold") and moved past it:
    a committed transaction never published (the three-broker chaos run lost 2 and 3 so,
    a frozen checker holding its put-back chunk open). The relay must wait for the half."""
    t = outbox_topics
    half = pending_half(t, f"behind-{uuid.uuid4().hex[:6]}")
    elsewhere = pending_half(t, f"elsewhere-{uuid.uuid4().hex[:6]}")
    with relay_of(t) as relay:
        with open_transaction_on(t, 0):
            at = write_half(t, half)
            decide(t, half, at, COMMIT)
            decide(t, elsewhere, write_half(t, elsewhere, partition=1), COMMIT, partition=1)
            deadline = time.monotonic() + 120
            while published(t)[elsewhere.transaction_id] != 1:  # not held up by the wait
                assert time.monotonic() < deadline, "another partition's commit waited too"
                relay.pump(0.5)
            drain(relay)
            assert published(t) == Counter({elsewhere.transaction_id: 1}), (
                "a half no committed read can see was published"
            )
        deadline = time.monotonic() + 120
        while published(t)[half.transaction_id] != 1:
            assert time.monotonic() < deadline, "the committed half was never published"
            relay.pump(0.5)
        drain(relay)
    assert published(t) == Counter({half.transaction_id: 1, elsewhere.transaction_id: 1})


def reread(caplog: pytest.LogCaptureFixture, partition: int = 0) -> list[int]:
    """Per restore of ``partition`` logged so far: how many decisions it re-read."""
    pattern = re.compile(rf"op partition {partition}: relay resumes at \d+, (\d+) decisions")
    return [int(m.group(1)) for r in caplog.records if (m := pattern.match(r.getMessage()))]


def test_a_relay_joining_again_keeps_its_memory_instead_of_rereading_the_op_partition(
    outbox_topics: OutboxTopics, caplog: pytest.LogCaptureFixture
):
    """A fence (or a silent consumer) makes the relay join again with a fresh consumer. Its
    decision memory still holds at the offsets it committed: re-reading the op partition from
    the memory's floor cost seconds per restore on a three-node chaos run (and scales with
    ``relay_memory``). The memory kept must still judge exactly."""
    caplog.set_level(logging.INFO, logger="outbox_checker.relay")
    t = outbox_topics
    halves = [pending_half(t, f"kept-{n}-{uuid.uuid4().hex[:6]}") for n in range(4)]
    at = write_halves(t, halves)
    commit_all(t, halves[:3], at[:3])
    with relay_of(t) as relay:
        drain(relay)
        before = len(reread(caplog))
        relay.op_partitions.replace_consumer()  # what a fence does
        wait_for(lambda: relay.pump(0.2) is not None and len(relay.partitions) == 3, what="owns")
        decide(t, halves[0], at[0], COMMIT)  # a second decision: nothing
        decide(t, halves[3], at[3], COMMIT)  # a first one: published
        drain(relay)
        assert reread(caplog)[before:] == [0], caplog.text[-3000:]
    assert published(t) == Counter({h.transaction_id: 1 for h in halves})


def test_a_kept_memory_learns_what_another_replica_relayed_meanwhile(
    outbox_topics: OutboxTopics, caplog: pytest.LogCaptureFixture
):
    """Back from a fence after another replica relayed the partition for a while, the relay
    reads only the ops relayed meanwhile into its kept memory; a second decision for a half
    the other replica published is then still known for one."""
    caplog.set_level(logging.INFO, logger="outbox_checker.relay")
    t = outbox_topics
    early, late, last = (pending_half(t, f"{n}-{uuid.uuid4().hex[:6]}") for n in "elx")
    at = {name: write_half(t, h) for name, h in zip("elx", (early, late, last), strict=True)}
    decide(t, early, at["e"], COMMIT)
    relay = a_relay(t, f"{t.names.prefix}.relay.{uuid.uuid4().hex[:8]}")
    try:
        wait_for(lambda: relay.pump(0.2) is not None and len(relay.partitions) == 3, what="owns")
        drain(relay)
        partitions = relay.op_partitions
        partitions.consumer.unsubscribe()  # out of the group a while, as a fenced replica is
        wait_for(lambda: relay.pump(0.2) is not None and not relay.partitions, what="revoked")
        with relay_of(t) as other:  # the group's only member meanwhile
            decide(t, late, at["l"], COMMIT)
            drain(other)
        assert published(t) == Counter({early.transaction_id: 1, late.transaction_id: 1})
        partitions.consumer.subscribe(
            [t.names.op], on_assign=partitions.on_assign, on_revoke=partitions.on_revoke
        )
        wait_for(lambda: relay.pump(0.2) is not None and len(relay.partitions) == 3, what="back")
        decide(t, late, at["l"], COMMIT)  # the other replica published it: nothing
        decide(t, early, at["e"], COMMIT)  # this one did: nothing
        decide(t, last, at["x"], COMMIT)
        drain(relay)
        assert reread(caplog)[-1] == 1, caplog.text[-3000:]  # the one relayed meanwhile
    finally:
        relay.close()
    assert published(t) == Counter({h.transaction_id: 1 for h in (early, late, last)})


class AbortHangsOnce:
    """A relay producer whose first abort hangs out its timeout, as librdkafka's does while the
    transaction's coordinator is frozen (a SIGSTOPped node) or killed: 7-17 s on a three-node
    chaos run, with the relay's client timeout (30 s) as the bound."""

    hung_for: float | None = None

    def __init__(self, producer: Producer) -> None:
        self._producer = producer

    def __getattr__(self, name: str) -> object:
        return getattr(self._producer, name)

    def abort_transaction(self, timeout: float) -> None:
        if AbortHangsOnce.hung_for is None:
            AbortHangsOnce.hung_for = timeout
            time.sleep(timeout)
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        self._producer.abort_transaction(timeout)


def test_a_relay_whose_abort_hangs_gives_up_on_it_at_the_transaction_deadline(
    outbox_topics: OutboxTopics, monkeypatch: pytest.MonkeyPatch
):
    """After a failed batch the relay aborts it; an abort that cannot reach the coordinator
    is given up at the transaction deadline and a fresh producer fences it instead, so
    publication resumes in seconds, not after the client timeout."""
    t = outbox_topics
    transactional_id = f"{t.names.prefix}.relay.abort-{uuid.uuid4().hex[:6]}"

    def hanging(config: dict) -> Producer | AbortHangsOnce:
        producer = Producer(config)
        return producer if AbortHangsOnce.hung_for is not None else AbortHangsOnce(producer)

    AbortHangsOnce.hung_for = None
    monkeypatch.setattr(relay_transaction, "Producer", hanging)  # the relay's producers
    relay = a_relay(t, transactional_id, timeout=30.0)
    try:
        wait_for(lambda: relay.pump(0.2) is not None and len(relay.partitions) == 3, what="owns")
        half = pending_half(t, f"abort-{uuid.uuid4().hex[:6]}")
        decide(t, half, write_half(t, half), COMMIT)
        zombie_killer = Producer({**t.client_config, "transactional.id": transactional_id})
        zombie_killer.init_transactions(30)  # the batch fails: its producer is fenced
        del zombie_killer
        relay.start()
        wait_for(lambda: published(t) == Counter({half.transaction_id: 1}), 120, "publication")
    finally:
        relay.close()
    # The abort was given up at the deadline, not the client timeout (30 s).
    assert AbortHangsOnce.hung_for == RelaySettings().transaction_deadline


class CallbackWatch(Consumer):
    """A real group consumer that notes each metadata or watermark question put to it from
    inside its own ``poll``, ``consume`` or ``close``: from one of its callbacks.

    confluent-kafka keeps one call state per consumer and thread, which ``list_topics``
    (:func:`~outbox.reading.watermarks` calls it to find a moved leader) ends;
    the next callback that same ``poll`` serves (a log line) then finds none and aborts the
    process. The relay restores an op partition from its ``on_assign``: a CI run died so
    while a frozen broker came back.
    """

    made: ClassVar[list[CallbackWatch]] = []

    def __init__(self, config: dict) -> None:
        super().__init__(config)
        self.serving = False
        self.asked_from_callbacks: list[str] = []
        CallbackWatch.made.append(self)

    def _serve(self, call: Callable, *args, **kwargs):
        self.serving = True
        try:
            return call(*args, **kwargs)
        finally:
            self.serving = False

    def poll(self, *args, **kwargs):
        return self._serve(super().poll, *args, **kwargs)

    def consume(self, *args, **kwargs):
        return self._serve(super().consume, *args, **kwargs)

    def close(self, *args, **kwargs):
        return self._serve(super().close, *args, **kwargs)

    def _note(self, question: str) -> None:
        if self.serving:
            self.asked_from_callbacks.append(question)

    def list_topics(self, *args, **kwargs):
        self._note("list_topics")
        return super().list_topics(*args, **kwargs)

    def get_watermark_offsets(self, *args, **kwargs):
        self._note("get_watermark_offsets")
        return super().get_watermark_offsets(*args, **kwargs)


def test_the_relays_callbacks_ask_its_group_consumer_nothing_that_can_end_its_call_state(
    outbox_topics: OutboxTopics, monkeypatch: pytest.MonkeyPatch
):
    """Restoring op partitions at assignment reads watermarks and the op history, and may
    refresh metadata: none of it through the group consumer whose callback is running."""
    t = outbox_topics
    half = pending_half(t, f"callbacks-{uuid.uuid4().hex[:6]}")
    offset = write_half(t, half)
    decide(t, half, offset, COMMIT)
    CallbackWatch.made.clear()
    monkeypatch.setattr("outbox_checker.membership.Consumer", CallbackWatch)  # group_member
    for _ in range(2):  # the second restore re-reads the op history the first relayed
        with relay_of(t) as relay:
            drain(relay)
    assert len(CallbackWatch.made) >= 2
    assert published(t) == Counter({half.transaction_id: 1})
    asked = [question for watch in CallbackWatch.made for question in watch.asked_from_callbacks]
    assert asked == []


def test_an_idle_relay_serves_its_watermark_clients_log_lines(outbox_topics: OutboxTopics):
    """The watermark client is asked, never polled for records. Its log lines (a broker
    gone, say) wait in its queue until it is served: unserved, they would pile up in memory,
    unseen, for as long as the relay runs."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    logger = logging.getLogger(f"tests.watermark-client.{uuid.uuid4().hex[:6]}")
    logger.addHandler(Collect())
    logger.propagate = False
    gone = f"127.0.0.1:{free_port('127.0.0.1')}"  # nothing listens: refused at once
    with relay_of(outbox_topics) as relay:
        relay.lookups.use_watermark_client(
            watermark_client({"bootstrap.servers": gone, "logger": logger})
        )
        deadline = time.monotonic() + 60
        while not lines and time.monotonic() < deadline:
            relay.pump(0.2)  # nothing to relay: idle cycles
        served = list(lines)  # (closing the client would serve its queue anyway)
    assert any(gone in line for line in served), served


def test_a_batch_of_new_halves_on_several_partitions_asks_their_ends_together(
    outbox_topics: OutboxTopics, monkeypatch: pytest.MonkeyPatch
):
    """At the tail each batch names halves newer than the end the relay knows, on most
    half partitions. Asked one partition at a time (a round trip to its leader each),
    those questions took 17-22 ms of every batch at 64 senders, as long as its commit;
    one ListOffsets per leader now asks them all, and a partition is asked alone only
    when that fails."""
    t = outbox_topics
    asked_alone: list[int] = []
    real_watermarks = relay_lookups.watermarks

    def counting(client, partition, timeout):
        asked_alone.append(partition.partition)
        return real_watermarks(client, partition, timeout)

    monkeypatch.setattr(relay_lookups, "watermarks", counting)
    halves = [pending_half(t, f"tail-{p}-{uuid.uuid4().hex[:6]}") for p in range(3)]
    with relay_of(t) as relay:
        drain(relay, quiet_seconds=0.5)
        asked_alone.clear()
        offsets = [write_half(t, half, partition=p) for p, half in enumerate(halves)]
        write(
            t,
            *(
                decision(t, half, at, COMMIT, partition=p)
                for p, (half, at) in enumerate(zip(halves, offsets, strict=True))
            ),
        )
        deadline = time.monotonic() + 120
        while sum(published(t).values()) < 3:
            assert time.monotonic() < deadline, "the commits were not published"
            relay.pump(0.5)
    assert published(t) == Counter({half.transaction_id: 1 for half in halves})
    assert asked_alone == [], f"half partitions {asked_alone} were asked one at a time"


def test_a_relay_that_cannot_put_its_partitions_back_reads_on_with_a_fresh_consumer(
    outbox_topics: OutboxTopics,
):
    """After a lost session, a consumer can be left with op partitions it cannot seek
    (librdkafka: "Erroneous state", its assignment's offset fetch failed) or whose
    committed offsets never come ("Timed out", every 30 s): the relay stood them aside for
    good, and their commits were never published (the parking bench: 106 and 548 of them,
    for minutes). Past ``silence_seconds`` it takes a fresh consumer, as for a silent one."""
    t = outbox_topics
    with relay_of(t, silence_seconds=1.0) as relay:
        stuck = relay.op_partitions.consumer
        stuck.unassign()  # what the failed assignment left: every seek refused
        for partition in relay.partitions:
            relay.op_partitions.stand_aside(partition)
        half = pending_half(t, "after-the-stand-aside")
        decide(t, half, write_half(t, half), COMMIT)
        deadline = time.monotonic() + 60
        while not published(t):
            assert time.monotonic() < deadline, "the partitions standing aside never came back"
            relay.pump(0.2)
        drain(relay)
        assert relay.op_partitions.consumer is not stuck
    assert published(t) == Counter({half.transaction_id: 1})
