"""Topic admin against a real broker: idempotent creation and clear mismatch errors."""

import time

import pytest
from confluent_kafka.admin import NewTopic

from outbox.admin import (
    HALF_RETENTION_MS,
    TopicSpec,
    ensure_topics,
    plan_topics,
    read_topic_states,
    shown_configs,
)
from outbox.errors import KafkaUnavailableError, TopicAdminError, TopicMismatchError
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
    # Created is not yet visible: metadata can miss it for a moment (seen under load), and
    # ensure_topics would then take op for missing and create the half on its way to the
    # same error (a concurrent creator's race, which it covers by checking again).
    deadline = time.monotonic() + 30
    while not read_topic_states(kafka_admin, [topics.op])[topics.op].exists:
        assert time.monotonic() < deadline, f"{topics.op} never showed in metadata"
        time.sleep(0.1)
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


@pytest.mark.parametrize(
    "brokers,replication,min_insync", [(1, 1, "1"), (2, 2, "1"), (3, 3, "2"), (7, 3, "2")]
)
def test_default_replication_follows_the_cluster(brokers, replication, min_insync):
    spec = TopicSpec("t", 1).for_cluster(brokers)
    assert spec.replication_factor == replication
    assert spec.config["min.insync.replicas"] == min_insync


def test_explicit_replication_and_min_insync_are_kept():
    spec = TopicSpec("t", 1, 2, {"min.insync.replicas": "2"}).for_cluster(5)
    assert (spec.replication_factor, spec.config["min.insync.replicas"]) == (2, "2")


def test_single_broker_gets_one_replica_and_min_insync_one(kafka_admin, unique_prefix):
    topics = TopicNames(unique_prefix)
    ensure_topics(kafka_admin, plan_topics(topics, partitions=1))
    states = read_topic_states(kafka_admin, list(topics.fixed))
    assert {(s.replication_factor, s.config["min.insync.replicas"]) for s in states.values()} == {
        (1, "1")
    }
    assert {s.brokers for s in states.values()} == {1}


def test_more_replicas_than_brokers_names_both_and_creates_nothing(kafka_admin, unique_prefix):
    topics = TopicNames(unique_prefix)
    with pytest.raises(TopicAdminError) as info:
        ensure_topics(kafka_admin, plan_topics(topics, partitions=1, replication_factor=3))
    assert "replication factor 3 needs at least 3 brokers, but the cluster has 1" in str(info.value)
    assert topics.half in str(info.value)
    assert not read_topic_states(kafka_admin, [topics.half])[topics.half].exists


def test_configs_of_a_topic_a_broker_does_not_know_yet_are_not_ready(kafka_admin, unique_prefix):
    """On a cluster the broker asked for configs can lag the metadata that listed the topic:
    ensure_topics asks again instead of failing the creation."""
    with pytest.raises(KafkaUnavailableError, match="is not ready: a broker does not know it"):
        shown_configs(kafka_admin, [f"{unique_prefix}.nowhere"], timeout=10)
