"""Typed events through confluent-kafka serializers, on a real broker with the relay.

The Schema Registry here is confluent-kafka's own ``MockSchemaRegistryClient``
(in-process; a real registry needs a JVM service and Docker images we cannot
fetch): what it proves is the subject the serializer was handed, which is
the client's side of the contract, and that the bytes on the real topic are
the serializer's, readable by confluent-kafka's deserializer.
"""

from __future__ import annotations

import json

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.serialization import (
    MessageField,
    SerializationContext,
    StringDeserializer,
    StringSerializer,
)

from outbox import LocalTransactionState, Message, ProducerSettings
from outbox.errors import ConfigurationError
from outbox.protocol import HalfRecord
from tests.producer.conftest import OutboxTopics, ProducerType, ScriptedListener
from tests.producer.test_check_back import wait_for

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ORDER_SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "total": {"type": "number"}},
        "required": ["id", "total"],
    }
)


def mock_registry() -> SchemaRegistryClient:
    registry = SchemaRegistryClient.new_client({"url": "mock://outbox-tests"})
    assert type(registry).__name__ == "MockSchemaRegistryClient"
    return registry


@pytest.mark.kafka
def test_schema_registry_subject_follows_the_real_topic_and_its_bytes_reach_it(
    outbox_topics: OutboxTopics, producer_type: ProducerType, relay: None
):
    registry = mock_registry()
    value_serializer = JSONSerializer(ORDER_SCHEMA, registry)
    order = {"id": 7, "total": 12.5}
    listener = ScriptedListener()
    with producer_type(
        "orders",
        listener,
        outbox_topics.settings(),
        key_serializer=StringSerializer("utf_8"),
        value_serializer=value_serializer,
    ) as producer:
        result = producer.send_message_in_transaction(
            Message(outbox_topics.real_topic, order, key="order-7"), COMMIT
        )
    real = outbox_topics.real_topic
    # The subject names the real topic, never the half topic the bytes were parked in.
    assert registry.get_subjects() == [f"{real}-value"]
    # The listener saw the typed event it was given.
    assert listener.executed[0].value == order
    # The half carries the serializer's bytes; the relay publishes those very bytes.
    expected = JSONSerializer(ORDER_SCHEMA, registry)(
        order, SerializationContext(real, MessageField.VALUE)
    )
    (half,) = [HalfRecord.from_record(r) for r in outbox_topics.read(outbox_topics.names.half)]
    assert (half.key, half.value) == (b"order-7", expected)
    wait_for(lambda: len(outbox_topics.read(real)) == 1, timeout=60)
    (record,) = outbox_topics.read(real)
    assert (record.key, record.value) == (b"order-7", expected)
    assert dict(record.headers)["outbox-transaction-id"] == result.transaction_id.encode()
    # Any consumer of the real topic decodes it with the registry.
    decoded = JSONDeserializer(ORDER_SCHEMA, schema_registry_client=registry)(
        record.value, SerializationContext(real, MessageField.VALUE)
    )
    assert decoded == order
    assert StringDeserializer("utf_8")(record.key, None) == "order-7"


def test_a_serializer_is_called_with_the_real_topic_and_may_add_headers():
    """A plain (obj, ctx) callable gets the real topic's context, and its headers travel."""
    from outbox.serialization import Serialization

    seen: list[tuple[str, str]] = []

    def serializer(obj: object, ctx: SerializationContext) -> bytes:
        seen.append((ctx.topic, ctx.field))
        ctx.headers.append(("schema", b"1"))
        return json.dumps(obj).encode()

    encoded = Serialization(serializer, serializer).encoded(
        Message("orders", {"a": 1}, key={"k": 1}, headers={"h": b"x"})
    )
    assert seen == [("orders", MessageField.KEY), ("orders", MessageField.VALUE)]
    assert (encoded.key, encoded.value) == (b'{"k": 1}', b'{"a": 1}')
    assert encoded.headers == [("h", b"x"), ("schema", b"1"), ("schema", b"1")]


@pytest.mark.parametrize(
    "options,match",
    [
        ({"value_serializer": "json"}, "value_serializer must be a confluent_kafka Serializer"),
        ({"key_serializer": 42}, "key_serializer must be a confluent_kafka Serializer"),
    ],
)
def test_a_serializer_that_is_not_callable_is_refused(options, match, producer_type):
    with pytest.raises(ConfigurationError, match=match):
        producer_type(
            "orders", ScriptedListener(), ProducerSettings(bootstrap_servers="h:1"), **options
        )
