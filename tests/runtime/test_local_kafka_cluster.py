"""The three-node local cluster against real brokers: leader and coordinator moves, restarts."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from outbox.config import kafka_client_config
from outbox_devtools import processes
from outbox_devtools.kafka import (
    KafkaRuntimeError,
    LocalKafka,
    LocalKafkaCluster,
    coordinator_partition,
    java_string_hash,
)
from tests.runtime.test_local_kafka import consume, produce

pytestmark = pytest.mark.kafka


def create_replicated_topic(bootstrap: str, name: str, partitions: int = 1) -> None:
    admin = AdminClient(kafka_client_config(bootstrap))
    topic = NewTopic(name, partitions, 3, config={"min.insync.replicas": "2"})
    admin.create_topics([topic])[name].result(30)


def transactional_producer(bootstrap: str, transactional_id: str) -> Producer:
    producer = Producer(
        kafka_client_config(
            bootstrap,
            {"transactional.id": transactional_id, "transaction.timeout.ms": 20_000},
        )
    )
    producer.init_transactions(60)
    return producer


def send_in_transaction(producer: Producer, topic: str, value: bytes, *, commit: bool) -> None:
    producer.begin_transaction()
    producer.produce(topic, value)
    assert producer.flush(60) == 0  # else an abort just drops it from the client queue
    if commit:
        producer.commit_transaction(60)
    else:
        producer.abort_transaction(60)


# ------------------------------------------------------------------ no broker


def test_each_node_knows_every_voter_and_three_copies(tmp_path: Path) -> None:
    cluster = LocalKafkaCluster(tmp_path)
    voters = ",".join(f"{node.node_id}@127.0.0.1:{node.controller_port}" for node in cluster.nodes)
    for node in cluster.nodes:
        props = node.server_properties()
        assert props["controller.quorum.voters"] == voters
        assert "controller.quorum.bootstrap.servers" not in props
        assert props["node.id"] == str(node.node_id)
        assert props["log.dirs"] == str(tmp_path / f"node-{node.node_id}" / "data")
        for name in (
            "default.replication.factor",
            "offsets.topic.replication.factor",
            "transaction.state.log.replication.factor",
            "share.coordinator.state.topic.replication.factor",
        ):
            assert props[name] == "3", name
        for name in (
            "min.insync.replicas",
            "transaction.state.log.min.isr",
            "share.coordinator.state.topic.min.isr",
        ):
            assert props[name] == "2", name
    ports = [p for node in cluster.nodes for p in (node.port, node.controller_port)]
    assert len(set(ports)) == 6
    assert cluster.bootstrap_servers == ",".join(n.bootstrap_servers for n in cluster.nodes)


def test_a_single_node_keeps_one_copy_and_its_own_quorum(tmp_path: Path) -> None:
    node = LocalKafka(tmp_path)
    props = node.server_properties()
    assert props["controller.quorum.voters"] == f"1@127.0.0.1:{node.controller_port}"
    assert props["default.replication.factor"] == "1"
    assert props["transaction.state.log.min.isr"] == "1"


@pytest.mark.parametrize(
    ("nodes", "why"),
    [
        (0, "not 0"),
        (2, "two voters lose their quorum"),
        (6, "cluster of 3 to 5, not 6"),
        (1, "a single node is LocalKafka"),
    ],
)
def test_unsupported_node_counts_are_refused(tmp_path: Path, nodes: int, why: str) -> None:
    with pytest.raises(KafkaRuntimeError, match=why):
        LocalKafkaCluster(tmp_path, nodes=nodes)


def test_transactional_ids_hash_like_java_strings() -> None:
    # Values of String.hashCode() on a JVM.
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("\u20ac") == 8364
    assert java_string_hash("\U0001f600") == 0xD83D * 31 + 0xDE00  # a surrogate pair
    assert java_string_hash("polygenelubricants") == -(2**31)
    # Kafka's Utils.abs maps Integer.MIN_VALUE to 0 (Math.abs would leave it negative).
    assert coordinator_partition("polygenelubricants", 4) == 0
    assert coordinator_partition("hello", 4) == 99162322 % 4


# --------------------------------------------------------------- the cluster


def test_the_predicted_coordinator_is_the_one_that_serves_the_id(
    kafka_cluster: LocalKafkaCluster,
) -> None:
    """Each broker logs the transactional ids it initialises; the prediction names that one."""
    topic = f"t{uuid.uuid4().hex[:8]}"
    create_replicated_topic(kafka_cluster.bootstrap_servers, topic)
    ids = [f"{topic}-tx-{n}" for n in range(6)]
    for transactional_id in ids:
        producer = transactional_producer(kafka_cluster.bootstrap_servers, transactional_id)
        send_in_transaction(producer, topic, b"x", commit=True)
        del producer
    for transactional_id in ids:
        coordinator = kafka_cluster.transaction_coordinator_of(transactional_id)
        line = f"Initialized transactionalId {transactional_id} with"
        serving = [n.node_id for n in kafka_cluster.nodes if line in n.log_path.read_text()]
        assert serving == [coordinator.node_id], transactional_id


def test_the_predicted_group_coordinator_is_the_one_that_serves_the_group(
    kafka_cluster: LocalKafkaCluster,
) -> None:
    """Each broker logs the members joining the groups it coordinates."""
    topic = f"t{uuid.uuid4().hex[:8]}"
    create_replicated_topic(kafka_cluster.bootstrap_servers, topic)
    produce(kafka_cluster.bootstrap_servers, topic, b"x")
    groups = [f"{topic}-group-{n}" for n in range(6)]
    for group in groups:
        consumer = Consumer(
            kafka_client_config(
                kafka_cluster.bootstrap_servers,
                {"group.id": group, "auto.offset.reset": "earliest"},
            )
        )
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while consumer.poll(0.5) is None:
            assert time.monotonic() < deadline, f"{group} got no record"
        consumer.close()
    for group in groups:
        coordinator = kafka_cluster.group_coordinator_of(group)
        line = f"joins group {group} in"
        serving = [n.node_id for n in kafka_cluster.nodes if line in n.log_path.read_text()]
        assert serving == [coordinator.node_id], group


@pytest.mark.long_proof  # the suite's chaos run kills both and rolls every node, under load
def test_transactions_go_on_when_the_leader_and_the_coordinator_are_killed(
    kafka_cluster: LocalKafkaCluster,
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    topic = f"t{uuid.uuid4().hex[:8]}"
    create_replicated_topic(bootstrap, topic)
    transactional_id = f"{topic}-tx"
    producer = transactional_producer(bootstrap, transactional_id)
    send_in_transaction(producer, topic, b"before", commit=True)

    leader = kafka_cluster.leader_of(topic, 0)
    leader.kill()
    send_in_transaction(producer, topic, b"aborted", commit=False)
    send_in_transaction(producer, topic, b"after leader kill", commit=True)
    assert kafka_cluster.leader_of(topic, 0) is not leader
    leader.start()  # two nodes down would leave fewer than min.insync.replicas
    kafka_cluster.wait_in_sync()

    coordinator = kafka_cluster.transaction_coordinator_of(transactional_id)
    coordinator.kill()
    send_in_transaction(producer, topic, b"after coordinator kill", commit=True)
    assert kafka_cluster.transaction_coordinator_of(transactional_id) is not coordinator
    del producer

    seen = consume(bootstrap, topic, until=b"after coordinator kill")
    assert seen == [b"before", b"after leader kill", b"after coordinator kill"]
    everything = consume(
        bootstrap, topic, until=b"after coordinator kill", isolation="read_uncommitted"
    )
    assert b"aborted" in everything


@pytest.mark.long_proof  # the suite's chaos run kills both and rolls every node, under load
def test_a_rolling_restart_replaces_every_node_and_waits_for_the_replicas(
    kafka_cluster: LocalKafkaCluster,
) -> None:
    bootstrap = kafka_cluster.bootstrap_servers
    topic = f"t{uuid.uuid4().hex[:8]}"
    create_replicated_topic(bootstrap, topic)  # one partition: "before" is read before "after"
    producer = transactional_producer(bootstrap, f"{topic}-tx")
    send_in_transaction(producer, topic, b"before", commit=True)
    pids = [node.pid for node in kafka_cluster.nodes]

    restarted = [line for line in kafka_cluster.rolling_restart_steps(grace_seconds=30) if line]

    assert restarted == [f"restarting node {n}" for n in (1, 2, 3)]
    assert all(not processes.pid_alive(pid or 0) for pid in pids)
    assert kafka_cluster.under_replicated() == []
    send_in_transaction(producer, topic, b"after", commit=True)
    del producer
    assert consume(bootstrap, topic, until=b"after") == [b"before", b"after"]


def test_a_stopped_node_shows_as_under_replicated_until_it_is_back(
    kafka_cluster: LocalKafkaCluster,
) -> None:
    topic = f"t{uuid.uuid4().hex[:8]}"
    create_replicated_topic(kafka_cluster.bootstrap_servers, topic)
    node = kafka_cluster.nodes[1]
    node.stop()
    deadline = time.monotonic() + 30
    while not any(topic in line for line in kafka_cluster.under_replicated()):
        assert time.monotonic() < deadline, "the stopped node's replica stayed in sync"
        time.sleep(0.5)
    with pytest.raises(KafkaRuntimeError, match="in-sync replicas not recovered within 1s"):
        kafka_cluster.wait_in_sync(timeout=1)
    node.start()
    kafka_cluster.wait_in_sync()
    assert kafka_cluster.under_replicated() == []
