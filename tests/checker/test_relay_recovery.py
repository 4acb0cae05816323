"""Publication goes on when a relaying replica dies, comes back, or has a twin.

Replicas run as ``outbox checker`` processes with their default group settings
(no session timeout passed through), killed with SIGKILL as a crash kills
them. Publication is judged on the real topic, as a downstream reader sees it.
"""

from __future__ import annotations

import logging
import time
import uuid

import pytest
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from outbox.config import kafka_client_config
from outbox.protocol import OpRecord, RealRecord, Resolution
from outbox_checker.membership import (
    FENCES_LIMIT,
    FENCES_WINDOW_SECONDS,
    Fences,
    SessionLog,
    group_consumer_config,
)
from outbox_checker.names import relay_group
from outbox_checker.settings import platform_instance_id
from tests.checker.support import pending_half, wait_for, write
from tests.checker.test_checker_processes import CheckerProcess
from tests.producer.conftest import OutboxTopics

DEFAULTS = {"OUTBOX_KAFKA_PROPERTIES": "{}"}
"""No session timeout passed through: the replicas' own defaults are under test."""


def commit_in_every_partition(topics: OutboxTopics, tag: str) -> set[str]:
    """A committed half in each half partition, decided by a COMMIT op; their ids."""
    halves = [pending_half(topics, f"{tag}-{p}-{uuid.uuid4().hex[:6]}") for p in range(3)]
    positions = write(topics, *(h.to_record(topics.names, p) for p, h in enumerate(halves)))
    write(
        topics,
        *(
            OpRecord(h.transaction_id, "orders", p, o, Resolution.COMMIT, 1, o).to_record(
                topics.names
            )
            for h, (p, o) in zip(halves, positions, strict=True)
        ),
    )
    return {h.transaction_id for h in halves}


def published(topics: OutboxTopics) -> set[str]:
    return {RealRecord.from_record(r).transaction_id for r in topics.read(topics.real_topic)}


def relaying(replica: CheckerProcess, topics: OutboxTopics) -> None:
    """Wait until ``replica`` has published a commit of every partition."""
    first = commit_in_every_partition(topics, "warm")
    wait_for(lambda: first <= published(topics), 90, "the replica to relay")


LONG_SESSION = {**DEFAULTS, "OUTBOX_SESSION_TIMEOUT_MS": "300000"}
"""A session no wait in these tests reaches: what comes before it cannot be its expiry."""


@pytest.mark.kafka
def test_a_replica_restarted_with_its_id_publishes_without_waiting_for_its_old_session(
    outbox_topics: OutboxTopics, processes
):
    """A restarted replica with its instance id is the same static member: it takes its
    partitions back at once. A new member would wait for the dead one's session (here
    300 s) to end first, so publication within this test's deadlines proves the former
    (the seconds it takes are measured in chaos, not asserted here)."""
    replica = CheckerProcess(outbox_topics, "steady", **LONG_SESSION)
    processes.append(replica)
    relaying(replica, outbox_topics)
    replica.kill()
    waiting = commit_in_every_partition(outbox_topics, "restart")
    again = CheckerProcess(outbox_topics, "steady", **LONG_SESSION)
    processes.append(again)
    wait_for(lambda: any("checker running" in line for line in again.lines), 120, "its start")
    wait_for(lambda: waiting <= published(outbox_topics), 120, "publication after the restart")


@pytest.mark.kafka
def test_the_survivor_of_two_takes_over_once_the_dead_ones_session_ends(
    outbox_topics: OutboxTopics, processes
):
    """A static member killed keeps its partitions until its session (6 s) ends, then the
    survivor takes them: it publishes without the dead one coming back (how soon is
    ``make chaos``'s to measure: publication_stall_s)."""
    a = CheckerProcess(outbox_topics, "pair-a", **DEFAULTS)
    b = CheckerProcess(outbox_topics, "pair-b", **DEFAULTS)
    processes.extend([a, b])
    wait_for(lambda: a.ready() and b.ready(), 90, "both replicas ready")
    relaying(a, outbox_topics)
    a.kill()
    waiting = commit_in_every_partition(outbox_topics, "takeover")
    wait_for(lambda: waiting <= published(outbox_topics), 120, "the survivor to publish")
    assert a.process.poll() is not None  # the dead one never came back


@pytest.mark.kafka
def test_a_second_replica_with_the_same_id_is_refused(outbox_topics: OutboxTopics, processes):
    first = CheckerProcess(outbox_topics, "twin", **DEFAULTS)
    processes.append(first)
    relaying(first, outbox_topics)
    second = CheckerProcess(outbox_topics, "twin", **DEFAULTS)
    processes.append(second)
    wait_for(lambda: first.process.poll() is not None, 90, "the replica whose id was taken to exit")
    assert first.process.returncode != 0
    wait_for(lambda: "another checker replica runs with instance id 'twin'" in first.log(), 60)
    # The one that took the id over publishes on alone.
    waiting = commit_in_every_partition(outbox_topics, "after")
    wait_for(lambda: waiting <= published(outbox_topics), 120, "the other twin to publish")
    assert second.process.poll() is None


@pytest.mark.kafka
def test_a_replica_fenced_once_joins_again_and_publishes_on(outbox_topics: OutboxTopics, processes):
    """A broker restart can fence a lone static member once (its join repeated after the
    answer was lost): that is no twin, and the replica must not exit for it."""
    replica = CheckerProcess(outbox_topics, "lone", **DEFAULTS)
    processes.append(replica)
    relaying(replica, outbox_topics)
    group = relay_group(f"{outbox_topics.names.prefix}.checker")
    intruder = Consumer(group_consumer_config(outbox_topics.client_config, group, "lone", 6000))
    intruder.subscribe([outbox_topics.names.op])
    try:
        deadline = time.monotonic() + 120
        while not intruder.assignment() and time.monotonic() < deadline:
            intruder.poll(0.2)
    finally:
        intruder.close()
    try:
        wait_for(lambda: "relay consumer fenced" in replica.log(), 120, "the replica to be fenced")
    except AssertionError:
        raise AssertionError(replica.log()[-3000:]) from None
    waiting = commit_in_every_partition(outbox_topics, "after-fence")
    wait_for(lambda: waiting <= published(outbox_topics), 120, "publication after the fence")
    assert replica.process.poll() is None, replica.log()


def test_only_repeated_fences_within_a_minute_make_a_twin():
    now = [0.0]
    fences = Fences(lambda: now[0])
    for _ in range(FENCES_LIMIT - 1):
        assert not fences.too_many()
        now[0] += FENCES_WINDOW_SECONDS / FENCES_LIMIT
    assert fences.too_many()
    now[0] += FENCES_WINDOW_SECONDS * 2  # long after: a fence of its own again
    assert not fences.too_many()


def test_the_pod_name_is_the_instance_id_under_kubernetes_only():
    pod = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "checker-0"}
    assert platform_instance_id(pod) == "checker-0"
    # Two replicas on one host share its name: no stable id there.
    assert platform_instance_id({"HOSTNAME": "build-host"}) is None


def test_a_passed_through_session_timeout_wins_over_the_default():
    config = group_consumer_config({"session.timeout.ms": "30000"}, "g", "r-0", 6000)
    assert config["session.timeout.ms"] == "30000"
    assert config["group.instance.id"] == "r-0"
    assert "group.instance.id" not in group_consumer_config({}, "g", None, 6000)


@pytest.mark.kafka
def test_a_consumer_whose_session_timed_out_is_known_for_it(own_kafka_broker):
    """librdkafka fences a static member by its own rejoin once its session timed out (the
    coordinator frozen or killed, the group moved): a three-node chaos run counted four such
    fences in 47 s, took the replica for a twin and stopped its relay. The session timeout is
    told by the line librdkafka logs for it (``SESSTMOUT``)."""
    client = kafka_client_config(own_kafka_broker.bootstrap_servers)
    admin = AdminClient(client)
    admin.create_topics([NewTopic("t", 1, 1)])["t"].result(30)
    config = group_consumer_config(client, "g", "lone", 6000)
    session = config["logger"]
    assert isinstance(session, SessionLog)
    consumer = Consumer(config)
    consumer.subscribe(["t"])
    try:
        wait_for(lambda: consumer.poll(0.2) is None and bool(consumer.assignment()), 60, "joined")
        assert not session.timed_out
        own_kafka_broker.freeze()
        try:
            wait_for(lambda: consumer.poll(0.2) is None and session.timed_out, 120)
        finally:
            own_kafka_broker.thaw()
    finally:
        consumer.close()


def test_the_session_log_passes_every_line_on_and_notes_only_the_timeout():
    forwarded = []

    class Keep(logging.Logger):
        def log(self, level, msg, *args, **kwargs):
            forwarded.append(args[0])

    session = SessionLog(Keep("k"))
    session.log(logging.INFO, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", "disconnected")
    assert not session.timed_out
    session.log(logging.WARNING, "%s [%s] %s", "SESSTMOUT", "rdkafka#consumer-1", "timed out")
    assert session.timed_out and forwarded == ["FAIL", "SESSTMOUT"]
