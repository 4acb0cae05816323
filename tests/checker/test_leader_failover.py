"""Questions the relay asks of a partition's leader, on a three-node cluster whose leader dies.

librdkafka sends a watermark question to the leader it knows and waits on that node:
after a ``kill -9`` until the question's timeout (30 s in the checker) or the node's
return, though the controller elects a new leader within its broker session (5 s on
these nodes). A three-node chaos run stalled publication 15 s on one such call.
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, IsolationLevel, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from outbox.config import kafka_client_config
from outbox.errors import KafkaUnavailableError
from outbox.reading import watermarks
from outbox_checker.kafka_reader import EndOffsetClient
from outbox_devtools.kafka import LocalKafkaCluster

pytestmark = [pytest.mark.kafka, pytest.mark.cluster_proof]
"""With the three-node proofs (``make test-cluster``): a cluster of its own costs the suite
its start (20-100 s on the 2-core machine), the test itself ~10 s."""


def test_watermarks_follow_a_killed_leader_to_its_successor(kafka_cluster: LocalKafkaCluster):
    topic = f"leader-{uuid.uuid4().hex[:8]}"
    client = kafka_client_config(kafka_cluster.bootstrap_servers)
    admin = AdminClient(client)
    admin.create_topics([NewTopic(topic, 1, 3)])[topic].result(30)
    consumer = Consumer({**client, "group.id": f"g-{topic}", "isolation.level": "read_committed"})
    partition = TopicPartition(topic, 0)
    try:
        assert watermarks(consumer, partition, 30) == (0, 0)  # it knows the leader now
        leader = kafka_cluster.leader_of(topic, 0)
        leader.kill()
        # An answer within the call's own timeout: a client still asking the dead leader
        # would get none, ever (it is never restarted).
        assert watermarks(consumer, partition, 60) == (0, 0)
    finally:
        consumer.close()


def test_end_offsets_follow_a_killed_leader_to_its_successor(kafka_cluster: LocalKafkaCluster):
    """The relay's long-lived ``ListOffsets`` client, asked after a partition's leader died.

    An admin client kept between questions sent them to the dead leader for as long as it
    lived: 24 questions over 60 s after a ``kill -9``, each answered "-1001" after its 2 s
    timeout, while the controller had elected a new leader within 6 s (measured 2026-11-28,
    librdkafka 2.x). The relay asks its half partitions' ends so before each batch; with its
    client stale it fell back to one question per decision, and the coordinator-kill
    proof's publication stalled past 35 s in about one run of eight.
    """
    topic = f"ends-{uuid.uuid4().hex[:8]}"
    client = kafka_client_config(kafka_cluster.bootstrap_servers)
    admin = AdminClient(client)
    admin.create_topics([NewTopic(topic, 3, 3)])[topic].result(30)
    _store_one_record_per_partition(client, topic)
    ends = EndOffsetClient(client)
    asked = (topic, [0, 1, 2], IsolationLevel.READ_COMMITTED, 2.0)
    assert ends.ask(*asked) == {0: 1, 1: 1, 2: 1}  # it knows every leader now
    kafka_cluster.leader_of(topic, 0).kill()
    killed = time.monotonic()
    while True:
        try:
            answer = ends.ask(*asked)
            break
        except KafkaUnavailableError:
            # A stale client never answers (the dead leader is never restarted); the
            # election takes seconds. How many is measured in chaos, not here.
            assert time.monotonic() - killed < 180.0, "no answer 180 s after the leader died"
            time.sleep(0.5)
    assert answer == {0: 1, 1: 1, 2: 1}


def _store_one_record_per_partition(client: dict[str, str], topic: str) -> None:
    """A producer of its own, gone when this returns (a live one logs raw lines to stderr
    once its cluster is closed)."""
    producer = Producer({**client, "acks": "all"})
    for partition in (0, 1, 2):
        producer.produce(topic, b"stored", partition=partition)
    assert producer.flush(30) == 0
