"""The send flow against a real broker: what each outcome leaves on which topic.

The producer writes halves and decision ops only; the real topic is the
checker relay's to write, so every test here also checks it stays empty.
"""

from __future__ import annotations

import logging
import time

import pytest
from confluent_kafka.admin import AdminClient

from outbox import (
    EndStatus,
    EndTransactionError,
    HalfWriteError,
    LocalTransactionState,
    Message,
    ProducerSettings,
    SendStatus,
    TransactionProducer,
    acked_writer,
)
from outbox.admin import TopicSpec, ensure_topics, plan_topics
from outbox.config import kafka_client_config
from outbox.protocol import HalfRecord, OpRecord, Resolution, TopicNames
from tests.fixtures.reports import reports_without_offsets
from tests.producer.conftest import OutboxTopics, ScriptedListener

pytestmark = pytest.mark.kafka

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE


def ops_of(topics: OutboxTopics) -> list[OpRecord]:
    return [OpRecord.from_record(r) for r in topics.read(topics.names.op)]


def real_topic_of(topics: OutboxTopics) -> list:
    return topics.read(topics.real_topic, "read_uncommitted")


def test_commit_writes_one_commit_op_naming_the_half_and_no_real_record(
    producer: TransactionProducer, outbox_topics: OutboxTopics, listener: ScriptedListener
):
    message = Message(outbox_topics.real_topic, b'{"order": 1}', key="order-1", headers={"a": "b"})
    result = producer.send_message_in_transaction(message, COMMIT)

    assert result.send_status is SendStatus.SEND_OK
    assert result.local_transaction_state is COMMIT
    assert result.end_status is EndStatus.COMMITTED
    assert result.end_error is None
    # Publishing is the relay's job: the producer writes nothing to the real topic.
    assert real_topic_of(outbox_topics) == []
    (op,) = ops_of(outbox_topics)
    assert (op.transaction_id, op.resolution) == (result.transaction_id, Resolution.COMMIT)
    assert (op.half_partition, op.half_offset, op.origin_offset) == (
        result.half_partition,
        result.half_offset,
        result.half_offset,
    )
    (half_raw,) = outbox_topics.read(outbox_topics.names.half)
    assert (half_raw.partition, half_raw.offset) == (result.half_partition, result.half_offset)
    half = HalfRecord.from_record(half_raw)
    assert (half.transaction_id, half.key, half.value) == (
        result.transaction_id,
        b"order-1",
        b'{"order": 1}',
    )
    assert half.user_headers == [("a", b"b")]
    # The listener saw the message stamped with its transaction id.
    assert listener.executed[0].transaction_id == result.transaction_id


def test_rollback_writes_one_rollback_op(producer, outbox_topics):
    result = producer.send_message_in_transaction(Message(outbox_topics.real_topic, b"v"), ROLLBACK)
    assert result.end_status is EndStatus.ROLLED_BACK
    (op,) = ops_of(outbox_topics)
    assert (op.transaction_id, op.resolution) == (result.transaction_id, Resolution.ROLLBACK)
    assert (op.half_partition, op.half_offset, op.origin_offset) == (
        result.half_partition,
        result.half_offset,
        result.half_offset,
    )
    assert real_topic_of(outbox_topics) == []


def test_oneway_end_returns_at_once_and_its_op_arrives(outbox_topics, producer_type):
    settings = outbox_topics.settings(end_oneway=True)
    with producer_type("orders", ScriptedListener(), settings) as producer:
        committed = producer.send_message_in_transaction(
            Message(outbox_topics.real_topic, b"c"), COMMIT
        )
        rolled_back = producer.send_message_in_transaction(
            Message(outbox_topics.real_topic, b"r"), ROLLBACK
        )
        unknown = producer.send_message_in_transaction(
            Message(outbox_topics.real_topic, b"u"), LocalTransactionState.UNKNOW
        )
    assert (committed.end_status, rolled_back.end_status) == (EndStatus.SENT_ONEWAY,) * 2
    assert unknown.end_status is EndStatus.LEFT_UNKNOWN
    # Shut down flushed them: both ops are there, each naming its half.
    ops = {op.transaction_id: op for op in ops_of(outbox_topics)}
    assert set(ops) == {committed.transaction_id, rolled_back.transaction_id}
    for result, resolution in ((committed, Resolution.COMMIT), (rolled_back, Resolution.ROLLBACK)):
        op = ops[result.transaction_id]
        assert (op.resolution, op.half_partition, op.half_offset, op.origin_offset) == (
            resolution,
            result.half_partition,
            result.half_offset,
            result.half_offset,
        )
    assert real_topic_of(outbox_topics) == []


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
    assert real_topic_of(outbox_topics) == []


def test_caller_chosen_transaction_id_and_partition_are_kept(producer, outbox_topics):
    message = Message(outbox_topics.real_topic, b"v", partition=1, transaction_id="order-42:v1")
    result = producer.send_message_in_transaction(message, COMMIT)
    assert result.transaction_id == "order-42:v1"
    (half_raw,) = outbox_topics.read(outbox_topics.names.half)
    half = HalfRecord.from_record(half_raw)
    assert (half.transaction_id, half.real_partition) == ("order-42:v1", 1)
    (op,) = ops_of(outbox_topics)
    assert op.transaction_id == "order-42:v1"


def test_each_half_carries_its_producers_transaction_timeout(outbox_topics, listener):
    """The checker reads the producer's own window off the half (and asks no sooner), so the
    window on the stored half must be this producer's setting, not a default."""
    settings = outbox_topics.settings(transaction_timeout_seconds=9.5)
    with TransactionProducer("orders", listener, settings) as producer:
        producer.send_message_in_transaction(Message(outbox_topics.real_topic, b"v"), COMMIT)
    (half_raw,) = outbox_topics.read(outbox_topics.names.half)
    assert HalfRecord.read(half_raw).end_window_ms == 9_500


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

    topic = outbox_topics.real_topic

    def values() -> tuple[float, float, float]:
        return (
            value("outbox_commits_total", real_topic=topic, origin="send"),
            value("outbox_rollbacks_total", real_topic=topic, origin="send"),
            value("outbox_halves_written_total"),
        )

    before = values()
    producer.send_message_in_transaction(Message(topic, b"v"), COMMIT)
    producer.send_message_in_transaction(Message(topic, b"v"), ROLLBACK)
    after = values()
    assert [b - a for a, b in zip(before, after, strict=True)] == [1, 1, 2]
    assert value("outbox_end_latency_seconds_count") >= 2


def end_failures(reason: str) -> float:
    from prometheus_client import REGISTRY

    labels = {"group": "orders", "reason": reason}
    return REGISTRY.get_sample_value("outbox_end_failures_total", labels) or 0.0


@pytest.mark.parametrize("oneway", [False, True], ids=["acknowledged", "oneway"])
def test_op_lost_with_the_broker_is_reported_never_raised(
    own_kafka_broker, caplog, oneway, producer_type
):
    """The broker goes away during the local transaction: the op can never land.

    Acknowledged, the send says FAILED with the error; oneway, it has returned
    already, so the loss is logged (naming the transaction) and counted.
    """
    bootstrap = own_kafka_broker.bootstrap_servers
    names = TopicNames("lost")
    admin = AdminClient(kafka_client_config(bootstrap))
    ensure_topics(admin, [*plan_topics(names, 1), TopicSpec("events", 1, 1)])
    settings = ProducerSettings(
        bootstrap_servers=bootstrap,
        topic_prefix=names.prefix,
        end_oneway=oneway,
        send_timeout_seconds=3,
        kafka_properties={"message.timeout.ms": "2000"},
    )

    def broker_dies(message: Message) -> LocalTransactionState:
        own_kafka_broker.stop()
        return COMMIT

    reason = "oneway" if oneway else "failed"
    before = end_failures(reason)
    with (
        caplog.at_level(logging.WARNING, logger="outbox.producer"),
        producer_type("orders", ScriptedListener(), settings) as producer,
    ):
        result = producer.send_message_in_transaction(Message("events", b"v"), broker_dies)
        deadline = time.monotonic() + 30
        while end_failures(reason) == before:
            assert time.monotonic() < deadline, "the lost op was never reported"
            time.sleep(0.1)
        own_kafka_broker.start()  # so the shutdown meets a broker again
    assert end_failures(reason) == before + 1
    if oneway:
        assert (result.end_status, result.end_error) == (EndStatus.SENT_ONEWAY, None)
        (warning,) = [r for r in caplog.records if "oneway end not delivered" in r.getMessage()]
        assert warning.levelno == logging.WARNING
        assert result.transaction_id in warning.getMessage()
    else:
        assert result.end_status is EndStatus.FAILED
        assert isinstance(result.end_error, EndTransactionError)


def test_a_half_stored_at_an_unreported_offset_fails_the_send_before_its_local_transaction(
    outbox_topics: OutboxTopics,
    listener: ScriptedListener,
    producer_type,
    monkeypatch: pytest.MonkeyPatch,
):
    # The send cannot name its half, so it must not run the local transaction:
    # a decision (or a transaction log row) naming a guessed position would
    # point at another transaction's half. The half itself is left to the check-back.
    half_topic = outbox_topics.names.half
    monkeypatch.setattr(acked_writer, "Producer", reports_without_offsets(half_topic))
    with (
        producer_type("orders", listener, outbox_topics.settings()) as producer,
        pytest.raises(HalfWriteError, match="did not report its offset") as caught,
    ):
        producer.send_message_in_transaction(Message(outbox_topics.real_topic, b"v"), COMMIT)

    assert listener.executed == []
    assert "left to the check-back" in str(caught.value)
    (half_raw,) = outbox_topics.read(half_topic)
    assert half_raw.offset == 0
    assert ops_of(outbox_topics) == []
