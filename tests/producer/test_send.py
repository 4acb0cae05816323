"""The send flow against a real broker: what each outcome leaves on which topic."""

from __future__ import annotations

import pytest

from outbox import (
    EndStatus,
    LocalTransactionState,
    Message,
    SendStatus,
    TransactionProducer,
)
from outbox.protocol import HalfRecord, OpRecord, RealRecord, Resolution
from tests.producer.conftest import OutboxTopics, ScriptedListener

pytestmark = pytest.mark.kafka

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE


def ops_of(topics: OutboxTopics) -> list[OpRecord]:
    return [OpRecord.from_record(r) for r in topics.read(topics.names.op)]


def test_commit_publishes_the_real_record_once_with_its_op(
    producer: TransactionProducer, outbox_topics: OutboxTopics, listener: ScriptedListener
):
    message = Message(outbox_topics.real_topic, b'{"order": 1}', key="order-1", headers={"a": "b"})
    result = producer.send_message_in_transaction(message, COMMIT)

    assert result.send_status is SendStatus.SEND_OK
    assert result.local_transaction_state is COMMIT
    assert result.end_status is EndStatus.COMMITTED
    assert result.end_error is None
    (real_raw,) = outbox_topics.read(outbox_topics.real_topic)
    real = RealRecord.from_record(real_raw)
    assert (real.transaction_id, real.key, real.value) == (
        result.transaction_id,
        b"order-1",
        b'{"order": 1}',
    )
    assert real.user_headers == [("a", b"b")]
    (op,) = ops_of(outbox_topics)
    assert (op.transaction_id, op.resolution) == (result.transaction_id, Resolution.COMMIT)
    assert (op.half_partition, op.half_offset) == (result.half_partition, result.half_offset)
    (half_raw,) = outbox_topics.read(outbox_topics.names.half)
    assert (half_raw.partition, half_raw.offset) == (result.half_partition, result.half_offset)
    # The listener saw the message stamped with its transaction id.
    assert listener.executed[0].transaction_id == result.transaction_id


def test_rollback_writes_only_the_op(producer, outbox_topics):
    result = producer.send_message_in_transaction(Message(outbox_topics.real_topic, b"v"), ROLLBACK)
    assert result.end_status is EndStatus.ROLLED_BACK
    assert outbox_topics.read(outbox_topics.real_topic, "read_uncommitted") == []
    (op,) = ops_of(outbox_topics)
    assert (op.transaction_id, op.resolution) == (result.transaction_id, Resolution.ROLLBACK)


@pytest.mark.parametrize(
    "answer",
    [
        LocalTransactionState.UNKNOW,
        LocalTransactionState.UNKNOWN,
        None,
        "COMMIT_MESSAGE",  # not a LocalTransactionState: never taken as a commit
        RuntimeError("database down"),
    ],
    ids=["UNKNOW", "UNKNOWN-alias", "None", "wrong-type", "exception"],
)
def test_unknown_outcomes_leave_only_the_half(producer, outbox_topics, answer):
    result = producer.send_message_in_transaction(Message(outbox_topics.real_topic, b"v"), answer)
    assert result.local_transaction_state is LocalTransactionState.UNKNOW
    assert result.end_status is EndStatus.LEFT_UNKNOWN
    if isinstance(answer, BaseException):
        assert result.local_transaction_error is answer
    else:
        assert result.local_transaction_error is None
    (half_raw,) = outbox_topics.read(outbox_topics.names.half)
    assert HalfRecord.from_record(half_raw).transaction_id == result.transaction_id
    assert ops_of(outbox_topics) == []
    assert outbox_topics.read(outbox_topics.real_topic, "read_uncommitted") == []


def test_caller_chosen_transaction_id_and_partition_are_kept(producer, outbox_topics):
    message = Message(outbox_topics.real_topic, b"v", partition=1, transaction_id="order-42:v1")
    result = producer.send_message_in_transaction(message, COMMIT)
    assert result.transaction_id == "order-42:v1"
    (real_raw,) = outbox_topics.read(outbox_topics.real_topic)
    assert real_raw.partition == 1
    assert RealRecord.from_record(real_raw).transaction_id == "order-42:v1"


def test_same_key_same_half_partition(producer, outbox_topics):
    results = [
        producer.send_message_in_transaction(
            Message(outbox_topics.real_topic, b"v", key="k"), COMMIT
        )
        for _ in range(5)
    ]
    assert len({r.half_partition for r in results}) == 1
    offsets = [r.half_offset for r in results]
    assert offsets == sorted(offsets)


def test_metrics_count_each_outcome(producer, outbox_topics):
    from prometheus_client import REGISTRY

    def value(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, {"group": "orders", **labels}) or 0.0

    before = (
        value("outbox_commits_total", origin="send"),
        value("outbox_rollbacks_total", origin="send"),
        value("outbox_halves_written_total"),
    )
    producer.send_message_in_transaction(Message(outbox_topics.real_topic, b"v"), COMMIT)
    producer.send_message_in_transaction(Message(outbox_topics.real_topic, b"v"), ROLLBACK)
    after = (
        value("outbox_commits_total", origin="send"),
        value("outbox_rollbacks_total", origin="send"),
        value("outbox_halves_written_total"),
    )
    assert [b - a for a, b in zip(before, after, strict=True)] == [1, 1, 2]
    assert value("outbox_end_latency_seconds_count") >= 2
