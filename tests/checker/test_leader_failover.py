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
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from outbox.reading import watermarks
from outbox_devtools.kafka import LocalKafkaCluster

pytestmark = [pytest.mark.kafka, pytest.mark.cluster_proof]
"""With the three-node proofs (``make test-cluster``): a cluster of its own costs the suite
its start (20-100 s on the 2-core machine), the test itself ~10 s."""


def test_watermarks_follow_a_killed_leader_to_its_successor(kafka_cluster: LocalKafkaCluster):
    topic = f"leader-{uuid.uuid4().hex[:8]}"
    client = {"bootstrap.servers": kafka_cluster.bootstrap_servers}
    admin = AdminClient(client)
    admin.create_topics([NewTopic(topic, 1, 3)])[topic].result(30)
    consumer = Consumer({**client, "group.id": f"g-{topic}", "isolation.level": "read_committed"})
    partition = TopicPartition(topic, 0)
    try:
        assert watermarks(consumer, partition, 30) == (0, 0)  # it knows the leader now
        leader = kafka_cluster.leader_of(topic, 0)
        leader.kill()
        started = time.monotonic()
        assert watermarks(consumer, partition, 30) == (0, 0)
        took = time.monotonic() - started
    finally:
        consumer.close()
    # The election: the broker session (5 s) and a little; not the 30 s timeout.
    assert took < 15.0, f"answered {took:.1f}s after the leader was killed"
