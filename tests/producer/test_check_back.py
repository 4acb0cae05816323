"""Check requests, as the checker writes them, answered by a real producer.

An answer is a decision op naming the copy it was asked about and the
original half's offset (its identity); the producer never writes the real topic.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from outbox import (
    EndStatus,
    LateEndRefusedError,
    LocalTransactionState,
    Message,
    TransactionProducer,
    TransactionSendResult,
)
from outbox.kafka_parts import KafkaParts
from outbox.protocol import (
    CheckRequest,
    HalfRecord,
    OpRecord,
    OutgoingRecord,
    Resolution,
)
from tests.producer.conftest import HALF_PARTITIONS, OutboxTopics, ScriptedListener

pytestmark = pytest.mark.kafka

UNKNOW = LocalTransactionState.UNKNOW


def produce(topics: OutboxTopics, *records) -> list[tuple[int, int]]:
    """Write records as the checker would; their (partition, offset)s."""
    positions: list[tuple[int, int]] = []
    producer = Producer({**topics.client_config, "enable.idempotence": True})

    def delivered(err, msg):
        assert err is None, err
        positions.append((msg.partition(), msg.offset()))

    for record in records:
        producer.produce(**record.produce_kwargs(), on_delivery=delivered)
    assert producer.flush(30) == 0
    return positions


def put_back_and_ask(
    topics: OutboxTopics, requested_ms: int | None = None, which: int = -1
) -> CheckRequest:
    """What one checker round does for a pending half: copy it, then ask.

    ``which`` picks the half record (by default the latest, the only pending one's copy).
    """
    half_raw = topics.read(topics.names.half)[which]
    copy = HalfRecord.from_record(half_raw).put_back(half_raw.offset, half_raw.timestamp_ms)
    ((_, copy_offset),) = produce(topics, copy.to_record(topics.names, half_raw.partition))
    request = CheckRequest(
        copy, half_raw.partition, copy_offset, requested_ms or int(time.time() * 1000)
    )
    produce(topics, request.to_record(topics.names))
    return request


def wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def ops_of(topics: OutboxTopics) -> list[OpRecord]:
    return [OpRecord.from_record(r) for r in topics.read(topics.names.op)]


@pytest.mark.parametrize(
    "answer,resolution",
    [
        (LocalTransactionState.COMMIT_MESSAGE, Resolution.COMMIT),
        (LocalTransactionState.ROLLBACK_MESSAGE, Resolution.ROLLBACK),
    ],
)
def test_check_answer_ends_the_named_copy(
    producer: TransactionProducer,
    outbox_topics: OutboxTopics,
    listener: ScriptedListener,
    answer,
    resolution,
):
    listener.check_answer = answer
    message = Message(outbox_topics.real_topic, b"payload", key="k", headers=[("h", b"1")])
    sent = producer.send_message_in_transaction(message, UNKNOW)
    request = put_back_and_ask(outbox_topics)

    wait_for(lambda: len(ops_of(outbox_topics)) == 1)
    (op,) = ops_of(outbox_topics)
    assert (op.transaction_id, op.resolution) == (sent.transaction_id, resolution)
    assert (op.half_partition, op.half_offset) == (request.half_partition, request.half_offset)
    assert op.half_offset != sent.half_offset  # the put-back copy, not the original
    assert op.origin_offset == sent.half_offset  # ...and the identity of the original
    assert outbox_topics.read(outbox_topics.real_topic, "read_uncommitted") == []
    # Asked exactly once, with the message reconstructed from the request.
    (checked,) = listener.checked
    assert (checked.topic, checked.key, checked.value) == (
        outbox_topics.real_topic,
        b"k",
        b"payload",
    )
    assert list(checked.headers) == [("h", b"1")]
    assert checked.transaction_id == sent.transaction_id
    assert checked.check_times == 1


def test_answer_to_a_copy_of_a_copy_names_the_original(producer, outbox_topics, listener):
    answers = iter([UNKNOW, LocalTransactionState.COMMIT_MESSAGE])
    listener.check_answer = lambda message: next(answers)
    sent = producer.send_message_in_transaction(Message(outbox_topics.real_topic, b"v"), UNKNOW)
    first = put_back_and_ask(outbox_topics)
    assert listener.check_called.wait(30)
    second = put_back_and_ask(outbox_topics)

    wait_for(lambda: len(ops_of(outbox_topics)) == 1)
    (op,) = ops_of(outbox_topics)
    assert second.half.check_times == 2
    assert first.half_offset < second.half_offset
    assert (op.resolution, op.half_offset) == (Resolution.COMMIT, second.half_offset)
    assert op.origin_offset == second.half.origin_offset == sent.half_offset
    assert outbox_topics.read(outbox_topics.real_topic, "read_uncommitted") == []


def test_unknown_check_answer_and_listener_errors_write_nothing(producer, outbox_topics, listener):
    listener.check_answer = RuntimeError("cannot tell")
    producer.send_message_in_transaction(Message(outbox_topics.real_topic, b"v"), UNKNOW)
    put_back_and_ask(outbox_topics)
    assert listener.check_called.wait(30)
    time.sleep(1)  # give a wrongly written end time to show up
    assert ops_of(outbox_topics) == []
    assert outbox_topics.read(outbox_topics.real_topic, "read_uncommitted") == []


def test_stale_check_request_is_dropped(producer, outbox_topics, listener):
    producer.send_message_in_transaction(Message(outbox_topics.real_topic, b"v"), UNKNOW)
    stale_ms = int(time.time() * 1000) - 10 * 60 * 1000
    put_back_and_ask(outbox_topics, requested_ms=stale_ms)
    # A fresh request written after the stale one is answered: the stale one was skipped.
    marker = Message(outbox_topics.real_topic, b"fresh", key="fresh")
    fresh = producer.send_message_in_transaction(marker, UNKNOW)
    fresh_raw = next(r for r in outbox_topics.read(outbox_topics.names.half) if r.key == b"fresh")
    now = int(time.time() * 1000)
    request = CheckRequest(
        HalfRecord.from_record(fresh_raw), fresh.half_partition, fresh.half_offset, now
    )
    produce(outbox_topics, request.to_record(outbox_topics.names))
    wait_for(lambda: len(ops_of(outbox_topics)) == 1)
    assert [m.value for m in listener.checked] == [b"fresh"]


def test_malformed_check_request_does_not_block_the_next(producer, outbox_topics, listener):
    garbage = OutgoingRecord(
        outbox_topics.names.check("orders"), b"k", b"v", [("outbox-kind", b"check")]
    )
    produce(outbox_topics, garbage)
    producer.send_message_in_transaction(Message(outbox_topics.real_topic, b"v"), UNKNOW)
    put_back_and_ask(outbox_topics)
    wait_for(lambda: len(ops_of(outbox_topics)) == 1)
    assert len(listener.checked) == 1


def held_checks(release: threading.Event) -> ScriptedListener:
    """A listener whose check answers (rollback) wait for ``release``."""

    def slow_check(message: Message) -> LocalTransactionState:
        release.wait(30)
        return LocalTransactionState.ROLLBACK_MESSAGE

    return ScriptedListener(slow_check)


def undecided_sends(producer: Any, topic: str, count: int) -> list[TransactionSendResult]:
    """``count`` transactions left unknown through ``producer`` (either kind, blocking face)."""
    return [
        producer.send_message_in_transaction(Message(topic, f"v{i}".encode()), UNKNOW)
        for i in range(count)
    ]


def test_full_check_executor_loses_no_request(outbox_topics, producer_type):
    release = threading.Event()
    listener = held_checks(release)
    settings = outbox_topics.settings(check_threads=1, check_queue_size=1)
    with producer_type("orders", listener, settings) as producer:
        sent = undecided_sends(producer, outbox_topics.real_topic, 6)
        now = int(time.time() * 1000)
        requests = []
        for raw in outbox_topics.read(outbox_topics.names.half):
            half = HalfRecord.from_record(raw)
            requests.append(CheckRequest(half, raw.partition, raw.offset, now))
        produce(outbox_topics, *(r.to_record(outbox_topics.names) for r in requests))
        time.sleep(2)  # the executor (1 running + 1 queued) is full; the rest must wait
        release.set()
        wait_for(lambda: len(ops_of(outbox_topics)) == 6)
    assert sorted(o.transaction_id for o in ops_of(outbox_topics)) == sorted(
        s.transaction_id for s in sent
    )
    assert len(listener.checked) == 6


def test_a_partition_given_to_a_full_responder_loses_no_request(outbox_topics):
    """While its executor is full the responder pauses and only serves its group; a
    partition it is given meanwhile (here, another member leaves) is not paused yet, so a
    request fetched from it in that poll must be sought back to, not skipped."""
    check_topic = outbox_topics.names.check("orders")
    release = threading.Event()
    listener = held_checks(release)
    settings = outbox_topics.settings(check_threads=1, check_queue_size=1)
    visitor = Consumer({**outbox_topics.client_config, "group.id": check_topic})
    parts = KafkaParts(settings, "orders")
    with TransactionProducer("orders", listener, settings, parts=parts) as producer:
        sent = undecided_sends(producer, outbox_topics.real_topic, 8)
        visitor.subscribe([check_topic])
        deadline = time.monotonic() + 30
        while not visitor.assignment():
            assert time.monotonic() < deadline, "the visitor never joined the responder's group"
            visitor.poll(0.1)
        theirs = {tp.partition for tp in visitor.assignment()}
        ours = sorted(set(range(HALF_PARTITIONS)) - theirs)
        now = int(time.time() * 1000)
        requests = [
            CheckRequest(HalfRecord.from_record(raw), raw.partition, raw.offset, now)
            for raw in outbox_topics.read(outbox_topics.names.half)
        ]
        records = [r.to_record(outbox_topics.names) for r in requests]
        # Three for the responder: one answered (blocked), one queued, one it pauses at.
        produce(
            outbox_topics,
            *(
                dataclasses.replace(r, partition=ours[i % len(ours)])
                for i, r in enumerate(records[:3])
            ),
        )
        wait_for(lambda: len(listener.checked) == 1)
        time.sleep(0.5)  # the third request found the executor full: paused
        # The rest wait on the visitor's partitions, then the visitor leaves: the
        # responder is given them while full, with requests ready to fetch at once.
        produce(
            outbox_topics,
            *(
                dataclasses.replace(r, partition=sorted(theirs)[i % len(theirs)])
                for i, r in enumerate(records[3:])
            ),
        )
        visitor.close()
        responder = parts.responder  # the rebalance is seen from inside only
        assert responder is not None
        wait_for(lambda: len(responder.assignment()) == HALF_PARTITIONS)
        time.sleep(0.5)  # one more poll while full: the fetched request is taken back
        release.set()
        deadline = time.monotonic() + 30
        while len(ops_of(outbox_topics)) < len(sent) and time.monotonic() < deadline:
            time.sleep(0.2)
    unanswered = {s.transaction_id for s in sent} - {
        o.transaction_id for o in ops_of(outbox_topics)
    }
    assert not unanswered, f"requests skipped, never answered: {sorted(unanswered)}"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def test_late_own_end_is_refused_and_left_to_the_check(outbox_topics, producer_type):
    clock = FakeClock()

    def slow_commit(message: Message) -> LocalTransactionState:
        clock.now += 5.5  # past the 6 s timeout minus the 1 s margin
        return LocalTransactionState.COMMIT_MESSAGE

    def quick_commit(message: Message) -> LocalTransactionState:
        clock.now += 4.5  # still inside the window
        return LocalTransactionState.COMMIT_MESSAGE

    listener = ScriptedListener()
    with producer_type("orders", listener, outbox_topics.settings(), clock=clock) as producer:
        result = producer.send_message_in_transaction(
            Message(outbox_topics.real_topic, b"v"), slow_commit
        )
        on_time = producer.send_message_in_transaction(
            Message(outbox_topics.real_topic, b"w"), quick_commit
        )
    assert result.end_status is EndStatus.REFUSED_LATE
    assert isinstance(result.end_error, LateEndRefusedError)
    assert on_time.end_status is EndStatus.COMMITTED
    # Refused before the op is written: only the on-time send has a decision.
    assert [o.transaction_id for o in ops_of(outbox_topics)] == [on_time.transaction_id]


def test_immunity_header_widens_the_direct_end_window(outbox_topics, producer_type):
    clock = FakeClock()

    def slow_commit(message: Message) -> LocalTransactionState:
        clock.now += 30
        return LocalTransactionState.COMMIT_MESSAGE

    with producer_type(
        "orders", ScriptedListener(), outbox_topics.settings(), clock=clock
    ) as producer:
        message = Message(outbox_topics.real_topic, b"v", check_immunity_seconds=60)
        result = producer.send_message_in_transaction(message, slow_commit)
    assert result.end_status is EndStatus.COMMITTED
