"""Topic replication on a real three-node cluster: the default, and what is short of it."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from outbox.admin import ensure_topics, plan_topics, read_topic_states
from outbox.protocol import TopicNames
from outbox_devtools.kafka import LocalKafkaCluster
from tests.admin.test_topics_cli import outbox

pytestmark = pytest.mark.kafka


def test_three_brokers_give_three_replicas_and_min_insync_two(
    kafka_cluster: LocalKafkaCluster, unique_prefix: str
) -> None:
    admin = AdminClient({"bootstrap.servers": kafka_cluster.bootstrap_servers})
    topics = TopicNames(unique_prefix)
    ensure_topics(admin, plan_topics(topics, partitions=2, producer_groups=("shop",)))
    states = read_topic_states(admin, [*topics.fixed, topics.check("shop")])
    assert {(s.replication_factor, s.config["min.insync.replicas"]) for s in states.values()} == {
        (3, "2")
    }


def test_an_existing_thinner_topic_is_kept_with_a_warning(
    kafka_cluster: LocalKafkaCluster, unique_prefix: str
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    topics = TopicNames(unique_prefix)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topics.half, 1, 1)])[topics.half].result(30)
    created = outbox(
        "topics", "create", "-p", "1", "--prefix", unique_prefix, "--bootstrap", bootstrap
    )
    assert created.returncode == 0, created.stderr
    assert f"topic {topics.half} has 1 replica(s) per partition, not 3" in created.stderr
    assert "kafka-reassign-partitions" in created.stderr
    assert topics.op not in created.stderr
    states = read_topic_states(admin, [topics.half, topics.op])
    assert (states[topics.half].replication_factor, states[topics.op].replication_factor) == (1, 3)


def test_asking_for_fewer_replicas_than_the_cluster_allows_warns(
    kafka_cluster: LocalKafkaCluster, unique_prefix: str
) -> None:
    args = ("--prefix", unique_prefix, "--bootstrap", kafka_cluster.bootstrap_servers)
    created = outbox("topics", "create", "-p", "1", "-r", "1", *args)
    assert created.returncode == 0, created.stderr
    assert "created with 1 replica(s) on a cluster of 3 brokers" in created.stderr
