"""Every bad input to the producer: its own exception, a message naming it, nothing written."""

from __future__ import annotations

import re
import time

import pytest
from confluent_kafka.admin import NewTopic

from outbox import (
    AsyncTransactionProducer,
    InvalidMessageError,
    KafkaUnavailableError,
    ListenerMissingError,
    LocalTransactionState,
    Message,
    MessageTooLargeError,
    ProducerClosedError,
    ProducerNotStartedError,
    ProducerSettings,
    TransactionProducer,
)
from outbox.admin import TopicSpec, ensure_topics
from outbox.errors import ConfigurationError, TopicAdminError, TopicMismatchError
from outbox.protocol import HalfRecord, InvalidNameError, TopicNames, new_transaction_id
from outbox.protocol.sizes import record_size
from tests.fixtures.kafka import set_topic_config
from tests.producer.conftest import Awaited, OutboxTopics, ScriptedListener

COMMIT = LocalTransactionState.COMMIT_MESSAGE


@pytest.mark.parametrize("listener", [None, object(), "listener"])
def test_no_listener(listener, producer_type):
    with pytest.raises(ListenerMissingError, match="TransactionListener"):
        producer_type("g", listener, ProducerSettings(bootstrap_servers="h:1"))


@pytest.mark.parametrize("parts", [object(), "kafka"])
def test_parts_that_are_not_a_parts_source_are_named(parts, producer_type):
    with pytest.raises(ConfigurationError, match="parts must be a PartsSource") as info:
        producer_type(
            "g", ScriptedListener(), ProducerSettings(bootstrap_servers="h:1"), parts=parts
        )
    assert repr(parts) in str(info.value)


@pytest.mark.parametrize("group", ["", "bad group", "a/b"])
def test_bad_group_name(group, producer_type):
    with pytest.raises(InvalidNameError, match="producer group"):
        producer_type(group, ScriptedListener(), ProducerSettings(bootstrap_servers="h:1"))


def test_settings_from_environment(monkeypatch, producer_type):
    monkeypatch.setenv("OUTBOX_BOOTSTRAP_SERVERS", "a:1,b:2")
    monkeypatch.setenv("OUTBOX_END_ONEWAY", "true")
    monkeypatch.setenv("OUTBOX_KAFKA_PROPERTIES", '{"sasl.password": "hunter2"}')
    producer = producer_type("g", ScriptedListener())
    assert producer.config.bootstrap_servers == "a:1,b:2"
    assert producer.config.end_oneway is True
    assert producer.config.client_config()["sasl.password"] == "hunter2"
    assert "hunter2" not in repr(producer.config)
    assert "hunter2" not in str(producer.config)


def test_missing_or_bad_settings_name_the_variable(monkeypatch, producer_type):
    monkeypatch.delenv("OUTBOX_BOOTSTRAP_SERVERS", raising=False)
    with pytest.raises(ConfigurationError, match="OUTBOX_BOOTSTRAP_SERVERS"):
        producer_type("g", ScriptedListener())
    monkeypatch.setenv("OUTBOX_BOOTSTRAP_SERVERS", "h:1")
    monkeypatch.setenv("OUTBOX_CHECK_THREADS", "0")
    with pytest.raises(ConfigurationError, match="OUTBOX_CHECK_THREADS"):
        producer_type("g", ScriptedListener())


def test_bad_end_oneway_names_the_variable(monkeypatch, producer_type):
    monkeypatch.setenv("OUTBOX_BOOTSTRAP_SERVERS", "h:1")
    monkeypatch.setenv("OUTBOX_END_ONEWAY", "maybe")
    with pytest.raises(ConfigurationError, match="OUTBOX_END_ONEWAY"):
        producer_type("g", ScriptedListener())


def test_send_before_start_and_after_shutdown(outbox_topics: OutboxTopics, producer_type):
    listener = ScriptedListener()
    producer = producer_type("g", listener, outbox_topics.settings())
    message = Message(outbox_topics.real_topic, b"v")
    with pytest.raises(ProducerNotStartedError, match="start"):
        producer.send_message_in_transaction(message, COMMIT)
    producer.start()
    producer.shutdown()
    with pytest.raises(ProducerClosedError, match="shut down"):
        producer.send_message_in_transaction(message, COMMIT)
    with pytest.raises(ProducerClosedError):
        producer.start()
    producer.shutdown()  # idempotent
    assert listener.executed == []
    assert outbox_topics.read(outbox_topics.names.half, "read_uncommitted") == []


@pytest.mark.kafka
def test_unreachable_broker_fails_start_in_bounded_time(producer_type):
    settings = ProducerSettings(bootstrap_servers="127.0.0.1:1", start_timeout_seconds=2)
    producer = producer_type("g", ScriptedListener(), settings)
    started = time.monotonic()
    with pytest.raises(KafkaUnavailableError, match=r"cannot reach Kafka at 127\.0\.0\.1:1"):
        producer.start()
    assert time.monotonic() - started < 120  # its 2 s, not a retry loop


@pytest.mark.kafka
def test_missing_outbox_topics_say_how_to_create_them(
    kafka_bootstrap, unique_prefix, producer_type
):
    settings = ProducerSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=unique_prefix)
    with pytest.raises(TopicAdminError, match=f"outbox topics create --prefix {unique_prefix}"):
        producer_type("g", ScriptedListener(), settings).start()


@pytest.mark.kafka
def test_half_and_op_partition_mismatch_fails_start(
    kafka_bootstrap, kafka_admin, unique_prefix, producer_type
):
    names = TopicNames(unique_prefix)
    futures = kafka_admin.create_topics([NewTopic(names.half, 2, 1), NewTopic(names.op, 3, 1)])
    for future in futures.values():
        future.result(30)
    settings = ProducerSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=unique_prefix)
    with pytest.raises(TopicMismatchError, match=r"2 partitions but .* has 3"):
        producer_type("g", ScriptedListener(), settings).start()


def _invalid_messages(real: str, prefix: str) -> list[tuple[Message, str]]:
    return [
        (Message("", b"v"), "topic is missing"),
        (Message(None, b"v"), "topic is missing"),  # type: ignore[arg-type]
        (Message("bad topic", b"v"), "characters Kafka does not allow"),
        (Message(f"{prefix}.half", b"v"), "internal outbox topic"),
        (Message(f"{prefix}.check.orders", b"v"), "internal outbox topic"),
        (Message(f"{prefix}-no-such-topic", b"v"), "does not exist"),
        (Message(real, b"v", key=42), "key must be bytes or str, got int"),  # type: ignore[arg-type]
        (Message(real, {"a": 1}), "value must be bytes or str, got dict"),  # type: ignore[arg-type]
        (Message(real, None), "value is missing"),  # type: ignore[arg-type]
        (Message(real, b"v", headers={"outbox-kind": b"x"}), "reserved prefix"),
        (Message(real, b"v", headers={"Outbox-Kind": b"x"}), "reserved prefix"),
        (Message(real, b"v", headers=[("a",)]), "not a (name, value) pair"),  # type: ignore[list-item]
        (Message(real, b"v", headers={"a": 5}), "header 'a' must be bytes or str"),  # type: ignore[dict-item]
        (Message(real, b"v", headers=7), "mapping or (name, value) pairs"),  # type: ignore[arg-type]
        (Message(real, b"v", partition=-1), "partition must be an int >= 0"),
        (Message(real, b"v", partition=99), "partition 99 does not exist"),
        (Message(real, b"v", check_immunity_seconds=-5), "check_immunity_seconds"),
        (Message(real, b"v", transaction_id="bad id"), "transaction id"),
        ("not a message", "expected an outbox.Message"),  # type: ignore[list-item]
    ]


@pytest.mark.kafka
def test_invalid_messages_are_refused_and_nothing_is_written(
    producer: TransactionProducer, outbox_topics: OutboxTopics, listener: ScriptedListener
):
    cases = _invalid_messages(outbox_topics.real_topic, outbox_topics.names.prefix)
    for message, problem in cases:
        with pytest.raises(InvalidMessageError, match=re.escape(problem)):
            producer.send_message_in_transaction(message, COMMIT)
    assert listener.executed == []
    for topic in (outbox_topics.names.half, outbox_topics.names.op, outbox_topics.real_topic):
        assert outbox_topics.read(topic, "read_uncommitted") == []
    # The producer still works after all that.
    ok = producer.send_message_in_transaction(Message(outbox_topics.real_topic, b"v"), COMMIT)
    assert [r.offset for r in outbox_topics.read(outbox_topics.names.half)] == [ok.half_offset]


@pytest.mark.kafka
def test_message_over_the_topic_limit_is_refused(
    producer: TransactionProducer, outbox_topics: OutboxTopics, kafka_admin, listener
):
    small = f"{outbox_topics.names.prefix}-small"
    ensure_topics(kafka_admin, [TopicSpec(small, 1, 1, {"max.message.bytes": "2000"})])
    over_the_topic = rf"max\.message\.bytes of 2000 of topic '{small}'"
    with pytest.raises(MessageTooLargeError, match=over_the_topic):
        producer.send_message_in_transaction(Message(small, b"x" * 5000), COMMIT)
    assert listener.executed == []
    assert outbox_topics.read(outbox_topics.names.half, "read_uncommitted") == []


@pytest.mark.kafka
def test_a_message_over_the_clients_own_limit_names_that_limit(
    producer: TransactionProducer, outbox_topics: OutboxTopics, kafka_admin, listener
):
    """Under every topic's limit but over librdkafka's message.max.bytes (1 000 000)."""
    roomy = f"{outbox_topics.names.prefix}-roomy"
    ensure_topics(kafka_admin, [TopicSpec(roomy, 1, 1, {"max.message.bytes": "2000000"})])
    with pytest.raises(MessageTooLargeError, match=r"client's message\.max\.bytes of 1000000"):
        producer.send_message_in_transaction(Message(roomy, b"x" * 1_000_100), COMMIT)
    assert listener.executed == []
    assert outbox_topics.read(outbox_topics.names.half, "read_uncommitted") == []


@pytest.mark.kafka
def test_a_message_whose_check_request_would_not_fit_is_refused(
    producer: TransactionProducer, outbox_topics: OutboxTopics, kafka_admin, listener
):
    """The half fits its topic, but its check request (more headers) would not fit the check
    topic: accepted, it would be stuck the first time it needs a check."""
    names = outbox_topics.names
    limit = 50_000
    set_topic_config(kafka_admin, names.check(producer.group), "max.message.bytes", str(limit))
    half = HalfRecord(
        transaction_id=new_transaction_id(),
        producer_group=producer.group,
        real_topic=outbox_topics.real_topic,
        key=None,
        value=b"",
        born_ms=0,
    )
    room = limit - record_size(half.to_record(names, 0)) - 20
    with pytest.raises(MessageTooLargeError, match="its check request would be about"):
        producer.send_message_in_transaction(Message(outbox_topics.real_topic, b"x" * room), COMMIT)
    assert listener.executed == []


def test_listener_of_the_other_kind_is_refused():
    """A blocking listener would stall the event loop; an async one would never be awaited."""
    settings = ProducerSettings(bootstrap_servers="h:1")
    with pytest.raises(
        ListenerMissingError, match="an async listener needs AsyncTransactionProducer"
    ):
        TransactionProducer("g", Awaited(ScriptedListener()), settings)
    with pytest.raises(
        ListenerMissingError, match=r"not a coroutine function.*stall the event loop"
    ):
        AsyncTransactionProducer("g", ScriptedListener(), settings)
