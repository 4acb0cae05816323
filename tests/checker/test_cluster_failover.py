"""The outbox on a three-node cluster: partition leaders and the relay's coordinator die.

Producers send under a stream of commits and rollbacks while a checker (with
its relay) runs; the node leading a half partition and then the node that
coordinates the relay's Kafka transactions are killed with SIGKILL and started
again. Every committed transaction must reach the real topic exactly once and
no rolled-back one may be visible.
"""

from __future__ import annotations

import faulthandler
import random
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from confluent_kafka.admin import AdminClient

from outbox import LocalTransactionState, Message, TransactionProducer
from outbox.admin import TopicSpec, ensure_topics, plan_topics
from outbox.protocol import RealRecord, TopicNames
from outbox_checker.names import relay_group, relay_transactional_id
from outbox_checker.relay import RelaySettings
from outbox_checker.service import Checker
from outbox_checker.settings import CheckerSettings
from outbox_devtools.kafka import LocalKafka, LocalKafkaCluster
from tests.checker.support import wait_for
from tests.producer.conftest import OutboxTopics, ScriptedListener

pytestmark = [pytest.mark.kafka, pytest.mark.cluster_proof]

GROUP = "orders"
INSTANCE = "cluster-checker"
RESUME_SECONDS = RelaySettings().transaction_deadline + 30.0
"""A node's death costs its sessions (6-10 s) and a client timeout or two (30 s); at worst a
relay transaction stuck in librdkafka, abandoned at its deadline, then a batch read again."""


class Sender:
    """One thread sending transactions, 80 % committed, until told to stop."""

    def __init__(self, topics: OutboxTopics) -> None:
        self.decisions: dict[str, LocalTransactionState] = {}
        self.listener = ScriptedListener(check_answer=lambda m: self.decisions[m.transaction_id])
        self.producer = TransactionProducer(GROUP, self.listener, topics.settings()).start()
        self.topic = topics.real_topic
        self.committed: set[str] = set()
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    @property
    def sent(self) -> int:
        return len(self.decisions)

    def _run(self) -> None:
        rng = random.Random(3)
        while not self.stop.is_set():
            transaction_id = f"cluster-{uuid.uuid4().hex[:10]}"
            state = (
                LocalTransactionState.COMMIT_MESSAGE
                if rng.random() < 0.8
                else LocalTransactionState.ROLLBACK_MESSAGE
            )
            self.decisions[transaction_id] = state
            message = Message(self.topic, transaction_id, transaction_id=transaction_id)
            try:
                result = self.producer.send_message_in_transaction(message, state)
            except Exception as exc:  # the half was not stored: nothing to publish
                self.errors.append(exc)
                continue
            if result.local_transaction_state is LocalTransactionState.COMMIT_MESSAGE:
                self.committed.add(transaction_id)

    def wait_for_more(self, count: int, timeout: float = 120.0) -> None:
        target = self.sent + count
        wait_for(lambda: self.sent >= target, timeout, f"{target} transactions sent")


def _kill_and_restart(cluster: LocalKafkaCluster, node: LocalKafka, sender: Sender) -> None:
    """SIGKILL, some sends while it is down, then back and in sync (the next fault needs it)."""
    node.kill()
    sender.wait_for_more(20)
    node.start()
    cluster.wait_in_sync()


@dataclass
class RunningOutbox:
    names: TopicNames
    topics: OutboxTopics
    settings: CheckerSettings
    sender: Sender

    def published(self) -> Counter[str]:
        """Real-topic records per transaction id (read_committed)."""
        records = self.topics.read(self.topics.real_topic)
        return Counter(RealRecord.from_record(raw).transaction_id for raw in records)


@contextmanager
def running_outbox(cluster: LocalKafkaCluster, prefix: str) -> Iterator[RunningOutbox]:
    """Replicated outbox topics, a checker with its relay, and a sender that has started.

    On leaving, sending stops and the checker runs until every commit is
    published (or four minutes pass); then the invariants are checked.
    """
    names = TopicNames(prefix)
    topics = OutboxTopics(cluster.bootstrap_servers, names, f"{prefix}-events")
    ensure_topics(
        AdminClient(topics.client_config),
        [
            *plan_topics(names, 3, 3, (GROUP,)),
            TopicSpec(topics.real_topic, 2, 3, {"min.insync.replicas": "2"}),
        ],
    )
    settings = CheckerSettings(
        bootstrap_servers=topics.bootstrap,
        topic_prefix=prefix,
        http_address="",
        check_interval_seconds=1.0,
        instance_id=INSTANCE,
    )
    checker = Checker(settings)
    loop = threading.Thread(target=checker.run, daemon=True)
    sender = Sender(topics)
    running = RunningOutbox(names, topics, settings, sender)
    loop.start()
    try:
        try:
            wait_for(lambda: checker.relay is not None and checker.relay.partitions, 60, "relay")
            sender.thread.start()
            sender.wait_for_more(50)
            yield running
        finally:
            sender.stop.set()
            sender.thread.join(120)
        wait_for(
            lambda: sender.committed <= set(running.published()), 240, "every commit published"
        )
        real = running.published()
    finally:
        checker.stop()
        loop.join(60)
        sender.producer.shutdown()

    assert not sender.errors, sender.errors[:3]
    assert len(sender.committed) > 100
    rolled_back = set(sender.decisions) - sender.committed
    assert rolled_back, "the stream had no rollback to hide"
    assert set(real) == sender.committed, {
        "missing": len(sender.committed - set(real)),
        "rolled back but visible": len(set(real) & rolled_back),
    }
    assert [tid for tid, count in real.items() if count > 1] == []


@pytest.mark.long_proof  # the suite's short chaos run kills both on three nodes, and checks more
@pytest.mark.timeout(600)
def test_every_commit_is_published_once_across_a_half_leader_and_a_relay_coordinator_kill(
    kafka_cluster: LocalKafkaCluster, unique_prefix: str
) -> None:
    with running_outbox(kafka_cluster, unique_prefix) as outbox:
        half_leader = kafka_cluster.leader_of(outbox.names.half, 1)
        _kill_and_restart(kafka_cluster, half_leader, outbox.sender)

        coordinator = kafka_cluster.transaction_coordinator_of(
            relay_transactional_id(outbox.settings.group_id, INSTANCE)
        )
        outbox.sender.wait_for_more(20)
        _kill_and_restart(kafka_cluster, coordinator, outbox.sender)
        outbox.sender.wait_for_more(50)


@pytest.mark.timeout(600)
def test_publication_goes_on_when_the_relay_groups_coordinator_is_killed(
    kafka_cluster: LocalKafkaCluster, unique_prefix: str
) -> None:
    """The relay commits its op offsets through the group coordinator of its consumer group
    inside each Kafka transaction; that node's death must not stall publication for long.

    librdkafka's ``send_offsets_to_transaction`` can block past its timeout while its
    cached group coordinator is gone (confluentinc/librdkafka#5456, #5511); the relay's
    own deadline then fences the stuck producer.
    """
    with running_outbox(kafka_cluster, unique_prefix) as outbox:
        group = relay_group(outbox.settings.group_id)
        coordinator = kafka_cluster.group_coordinator_of(group)
        coordinator.kill()
        outbox.sender.wait_for_more(20)
        committed_after_kill = set(outbox.sender.committed)
        try:
            wait_for(
                lambda: committed_after_kill <= set(outbox.published()),
                RESUME_SECONDS,
                f"publication to resume within {RESUME_SECONDS:.0f}s of the kill",
            )
        except AssertionError:
            faulthandler.dump_traceback(sys.__stderr__, all_threads=True)  # where it waits
            raise
        coordinator.start()
        kafka_cluster.wait_in_sync()
        outbox.sender.wait_for_more(20)
