"""The record kinds survive a real broker: written, read back, decoded."""

import pytest
from confluent_kafka import Producer

from outbox.admin import TopicSpec, ensure_topics, plan_topics
from outbox.config import kafka_client_config
from outbox.protocol import (
    CheckRequest,
    DiscardReason,
    DiscardRecord,
    HalfRecord,
    OpRecord,
    RealRecord,
    Resolution,
    TopicNames,
    new_transaction_id,
)
from outbox.reading import read_topic

pytestmark = pytest.mark.kafka


def test_every_kind_round_trips_through_kafka(kafka_bootstrap, kafka_admin, unique_prefix):
    topics = TopicNames(unique_prefix)
    real_topic = f"{unique_prefix}-events"
    ensure_topics(kafka_admin, [*plan_topics(topics, 2, 1, ("g",)), TopicSpec(real_topic, 2, 1)])
    config = kafka_client_config(kafka_bootstrap)
    half = HalfRecord(
        new_transaction_id(), "g", real_topic, b"k", b"v", 123, [("h", b"1"), ("h", None)]
    )
    producer = Producer({**config, "enable.idempotence": True})
    producer.produce(**half.to_record(topics, 1).produce_kwargs())
    assert producer.flush(30) == 0
    (half_raw,) = read_topic(config, topics.half)
    assert HalfRecord.from_record(half_raw) == half
    assert (half_raw.partition, half_raw.timestamp_ms is not None) == (1, True)

    op = OpRecord(half.transaction_id, "g", 1, half_raw.offset, Resolution.COMMIT, 456)
    check = CheckRequest(half.put_back(half_raw.offset, None), 1, half_raw.offset, 789)
    discard = DiscardRecord.of_half(half_raw, DiscardReason.RETENTION, 1000)
    for record in (op.to_record(topics), check.to_record(topics), discard.to_record(topics)):
        producer.produce(**record.produce_kwargs())
    producer.produce(**half.to_real_record().produce_kwargs())
    assert producer.flush(30) == 0

    assert [OpRecord.from_record(r) for r in read_topic(config, topics.op)] == [op]
    assert [CheckRequest.from_record(r) for r in read_topic(config, topics.check("g"))] == [check]
    (discard_raw,) = read_topic(config, topics.discard)
    assert DiscardRecord.from_record(discard_raw).original_half() == half
    (real_raw,) = read_topic(config, real_topic)
    real = RealRecord.from_record(real_raw)
    assert (real.transaction_id, real.key, real.value) == (half.transaction_id, b"k", b"v")
    assert real.user_headers == [("h", b"1"), ("h", None)]


def test_read_topic_skips_aborted_transactions(kafka_bootstrap, kafka_admin, unique_prefix):
    topic = f"{unique_prefix}-txn"
    ensure_topics(kafka_admin, [TopicSpec(topic, 1, 1)])
    producer = Producer(
        kafka_client_config(kafka_bootstrap, {"transactional.id": f"{unique_prefix}-t"})
    )
    producer.init_transactions(30)
    for value, commit in ((b"aborted", False), (b"committed", True)):
        producer.begin_transaction()
        producer.produce(topic, value=value)
        producer.flush(30)  # an abort purges what is still queued; this one must reach the log
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    config = kafka_client_config(kafka_bootstrap)
    assert [r.value for r in read_topic(config, topic)] == [b"committed"]
    raw = read_topic(config, topic, isolation="read_uncommitted")
    assert [r.value for r in raw] == [b"aborted", b"committed"]
