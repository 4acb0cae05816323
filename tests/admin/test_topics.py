"""Topic admin against a real broker: idempotent creation and clear mismatch errors."""

import pytest
from confluent_kafka.admin import NewTopic

from outbox.admin import (
    HALF_RETENTION_MS,
    ensure_topics,
    plan_topics,
    read_topic_states,
)
from outbox.errors import TopicMismatchError
from outbox.protocol import TopicNames

pytestmark = pytest.mark.kafka


def test_create_is_idempotent_and_sets_configs(kafka_admin, unique_prefix):
    topics = TopicNames(unique_prefix)
    specs = plan_topics(topics, partitions=3, producer_groups=("orders",))
    first = ensure_topics(kafka_admin, specs)
    assert first == {s.name: True for s in specs}
    assert set(first) == {*topics.fixed, topics.check("orders")}
    second = ensure_topics(kafka_admin, specs)
    assert second == {s.name: False for s in specs}
    states = read_topic_states(kafka_admin, list(first))
    assert {s.partitions for s in states.values()} == {3}
    assert states[topics.half].config["retention.ms"] == str(HALF_RETENTION_MS)
    assert states[topics.half].config["cleanup.policy"] == "delete"


def test_partition_mismatch_names_topics_and_fix(kafka_admin, unique_prefix):
    topics = TopicNames(unique_prefix)
    ensure_topics(kafka_admin, plan_topics(topics, partitions=2))
    with pytest.raises(TopicMismatchError) as info:
        ensure_topics(kafka_admin, plan_topics(topics, partitions=4))
    message = str(info.value)
    assert f"topic {topics.half} has 2 partitions, 4 requested" in message
    assert f"topic {topics.op} has 2 partitions" in message
    assert "--partitions 2" in message


def test_half_and_op_created_apart_with_different_counts_is_an_error(kafka_admin, unique_prefix):
    topics = TopicNames(unique_prefix)
    kafka_admin.create_topics([NewTopic(topics.op, 5, 1)])[topics.op].result(30)
    with pytest.raises(TopicMismatchError, match=f"topic {topics.op} has 5 partitions, 3"):
        ensure_topics(kafka_admin, plan_topics(topics, partitions=3))
    # Nothing was created on the way to the error.
    assert not read_topic_states(kafka_admin, [topics.half])[topics.half].exists


def test_missing_topics_read_as_absent(kafka_admin, unique_prefix):
    states = read_topic_states(kafka_admin, list(TopicNames(unique_prefix).fixed))
    assert not any(s.exists for s in states.values())


@pytest.mark.parametrize(
    "partitions,replication,match",
    [(0, 1, "--partitions must be at least 1"), (1, 0, "--replication-factor must be")],
)
def test_plan_rejects_bad_counts(partitions, replication, match):
    with pytest.raises(ValueError, match=match):
        plan_topics(TopicNames(), partitions, replication)
