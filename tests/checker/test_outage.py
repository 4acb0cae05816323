"""A broker outage pauses the checker; it resumes where its checkpoints are."""

from __future__ import annotations

import faulthandler
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client import REGISTRY

from outbox.admin import TopicSpec, ensure_topics, plan_topics
from outbox.config import kafka_client_config
from outbox.errors import DuplicateInstanceError, KafkaUnavailableError
from outbox.protocol import RealRecord, TopicNames
from outbox_checker.membership import FENCES_LIMIT, JOIN_STALL_SECONDS, GroupMember
from outbox_checker.service import Checker
from outbox_checker.settings import CheckerSettings
from tests.checker.support import (
    SkewedClock,
    check_requests,
    pending_half,
    running_checker,
    wait_for,
    write,
)
from tests.producer.conftest import OutboxTopics

pytestmark = pytest.mark.kafka

LONG_WRITER_TIMEOUT = 200.0
"""The round writer's client timeout where a test tells "over" from "waited out": its
retries and its watchdog then last three of them (600 s), far past any wait here."""


@dataclass
class _Running:
    topics: OutboxTopics
    checker: Checker
    clock: SkewedClock
    loop: threading.Thread
    """The thread running :meth:`Checker.run`."""
    stopped: bool = False
    """The test stopped the checker itself."""


@contextmanager
def _running_checker(
    broker, prefix: str, writer_timeout: float = 30.0, **settings
) -> Iterator[_Running]:
    """A checker on its own thread over fresh outbox topics, one half already pending."""
    names = TopicNames(prefix)
    topics = OutboxTopics(broker.bootstrap_servers, names, f"{prefix}-events")
    admin = AdminClient(topics.client_config)
    ensure_topics(
        admin, [*plan_topics(names, 3, 1, ("orders",)), TopicSpec(topics.real_topic, 1, 1)]
    )
    write(topics, pending_half(topics, "before").to_record(names, 0))
    clock = SkewedClock(60)
    checker = Checker(
        CheckerSettings(
            bootstrap_servers=topics.bootstrap,
            topic_prefix=prefix,
            http_address="",
            check_interval_seconds=0.5,
            **settings,
        ),
        clock=clock,
        writer_timeout=writer_timeout,
    )
    loop = threading.Thread(target=checker.run, daemon=True)
    loop.start()
    try:
        wait_for(lambda: len(check_requests(topics)) >= 1, 60, "the first check")
        running = _Running(topics, checker, clock, loop)
        yield running
        assert loop.is_alive() or running.stopped
    finally:
        checker.stop()
        loop.join(60)
    assert not loop.is_alive()


def _wait_for_check_of_half_written_now(topics: OutboxTopics) -> None:
    write(topics, pending_half(topics, "after").to_record(topics.names, 1))
    wait_for(
        lambda: "after" in {r.half.transaction_id for r in check_requests(topics)},
        120,
        "a check of the half written after the restart",
    )


def test_checker_survives_a_broker_restart(own_kafka_broker):
    with _running_checker(own_kafka_broker, "outage") as running:
        own_kafka_broker.stop()
        time.sleep(3)  # the loop meets the outage and backs off
        own_kafka_broker.start()
        _wait_for_check_of_half_written_now(running.topics)
    first_checks = [
        r.half.transaction_id for r in check_requests(running.topics) if r.half.check_times == 1
    ]
    assert sorted(first_checks) == ["after", "before"]


def test_checker_rejoins_its_group_after_an_outage_longer_than_its_session(own_kafka_broker):
    """Down longer than the group session: the replica loses its membership and must rejoin.

    Every offset commit with the old member id fails (UNKNOWN_MEMBER_ID); only
    polling the group while backing off lets the replica hear it and join again.
    """
    timeouts = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "1000"}
    with _running_checker(own_kafka_broker, "longoutage", kafka_properties=timeouts) as running:
        own_kafka_broker.kill()
        time.sleep(12)  # twice the session: the group forgets this member
        own_kafka_broker.start()
        _wait_for_check_of_half_written_now(running.topics)


def test_checker_recovers_from_a_broker_frozen_longer_than_its_read_timeout(own_kafka_broker):
    """SIGSTOP, not a crash: connections stay open and go silent, then the broker resumes.

    A librdkafka consumer waiting on a frozen broker can stay wedged after it
    resumes; the checker must notice and read with a fresh one, without a restart.
    """
    with _running_checker(own_kafka_broker, "freeze") as running:
        with own_kafka_broker.frozen():
            time.sleep(15)
        # Thawed, the node's controller finds its own broker's session expired and fences
        # it: for a moment its partitions have no leader, and a read of the check topic
        # fails then (NOT_LEADER_FOR_PARTITION, _UNKNOWN_PARTITION) instead of waiting.
        write(
            running.topics, pending_half(running.topics, "after").to_record(running.topics.names, 1)
        )
        wait_for(
            lambda: "after" in _checked_so_far(running.topics),
            120,
            "a check of the half written after the thaw",
        )


def test_a_group_consumer_stuck_joining_gets_a_fresh_one(own_kafka_broker, caplog):
    """A consumer whose session ran out in a broker's pause, and whose join then did not go
    through for 2 minutes (the rounds' consumer after a thaw, beside a relay consumer that
    had joined again in 10 s), is replaced once its join has been stuck the stall period:
    the checker's clock is moved past it while the broker is still frozen, so no join can
    have gone through; after the thaw the fresh consumer gets the partitions."""
    with (
        caplog.at_level("WARNING", logger="outbox_checker.membership"),
        _running_checker(own_kafka_broker, "stall") as running,
    ):
        ownership = running.checker.ownership
        stuck = ownership.consumer
        with own_kafka_broker.frozen():
            wait_for(lambda: not ownership.partitions(), 60, "the session to run out")
            running.clock.skew += JOIN_STALL_SECONDS + 5
            wait_for(lambda: ownership.consumer is not stuck, 60, "a fresh group consumer")
        _wait_for_check_of_half_written_now(running.topics)
    assert any("has had no partitions for" in r.getMessage() for r in caplog.records)


def test_a_static_relay_consumer_that_lost_its_session_is_replaced_at_once(
    own_kafka_broker, caplog
):
    """librdkafka's own rejoin of a static member after a session timeout ends in a fence
    of its own making (confluentinc/librdkafka#3437): in a three-node chaos run 4 of 5
    session timeouts did, 0 to 19 s later, with no partitions held meanwhile. The relay's
    consumer is replaced as soon as the timeout is heard, while the broker is still frozen,
    and the fresh one takes the partitions after the thaw: publication and checks go on,
    each commit published once. (The rounds' consumer goes the same way, through the same
    ``GroupMember``, when its own timeout is heard between rounds; whether its session
    times out before the thaw, or the broker ends it after, is a race, so it is not
    asserted here.)"""
    prefix = f"lost{uuid.uuid4().hex[:6]}"
    with (
        caplog.at_level("WARNING", logger="outbox_checker.membership"),
        _running_checker(own_kafka_broker, prefix, instance_id="lost-session") as running,
    ):
        from tests.checker.test_relay_recovery import commit_in_every_partition, published

        topics, checker = running.topics, running.checker
        assert checker.relay is not None
        relay = checker.relay
        warm = commit_in_every_partition(topics, "warm")
        wait_for(lambda: warm <= published(topics), 90, "the relay to publish")
        relay_consumer = relay.op_partitions.consumer
        with own_kafka_broker.frozen():
            wait_for(
                lambda: relay.op_partitions.consumer is not relay_consumer,
                30,
                "a fresh relay consumer while the broker is frozen",
            )
        after = commit_in_every_partition(topics, "after")
        wait_for(lambda: after <= published(topics), 90, "publication by the fresh consumer")
        _wait_for_check_of_half_written_now(topics)
    lost = [r.getMessage() for r in caplog.records if "lost its session" in r.getMessage()]
    assert any(m.startswith("relay consumer lost its session") for m in lost), lost
    copies = Counter(
        RealRecord.from_record(r).transaction_id for r in topics.read(topics.real_topic)
    )
    assert all(copies[transaction] == 1 for transaction in warm | after), copies


def test_a_fence_after_a_lost_session_is_its_own_until_the_group_assigns_again(own_kafka_broker):
    """Such a fence came 6.0, 11.4 and 18.8 s after the session timeout in that run, and a
    fence counted as a twin's brings the replica nearer to stopping as a duplicate
    (:class:`DuplicateInstanceError` at the fourth in a minute). Until the group assigns the
    member partitions again, a fence is its own rejoin's (or its replaced consumer's), however
    late; once assigned, fences count again."""
    client = kafka_client_config(own_kafka_broker.bootstrap_servers)
    topic = f"fence-{uuid.uuid4().hex[:6]}"
    admin = AdminClient(client)
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    assignments: list[int] = []
    revocations: list[int] = []
    member = GroupMember(
        client,
        topic,
        group=f"{topic}.group",
        instance="lone",
        session_timeout_ms=6000,
        on_assign=lambda _, partitions: assignments.append(len(partitions)),
        on_revoke=lambda *_: revocations.append(1),
        on_rejoin=lambda: None,
        role="relay consumer",
        group_label="relay group",
    )
    fence = KafkaError(KafkaError.FENCED_INSTANCE_ID)
    try:
        wait_for(lambda: member.consumer.poll(0.2) is None and bool(assignments), 60, "joined")
        with own_kafka_broker.frozen():
            wait_for(
                lambda: member.consumer.poll(0.2) is None and bool(revocations),
                30,
                "the session to time out (its partitions taken as lost)",
            )
            time.sleep(6)  # later than a fence was once taken for the rejoin's (5 s)
            for _ in range(FENCES_LIMIT + 1):
                assert member.handled(fence)  # its own: no DuplicateInstanceError
        joined = len(assignments)
        wait_for(
            lambda: member.consumer.poll(0.2) is None and len(assignments) > joined, 60, "rejoined"
        )
        with pytest.raises(DuplicateInstanceError):
            for _ in range(FENCES_LIMIT):
                member.handled(fence)
    finally:
        member.consumer.close()


def _checked_so_far(topics: OutboxTopics) -> set[str]:
    """Transaction ids checked so far; none while the broker cannot answer (issue 39)."""
    try:
        return {r.half.transaction_id for r in check_requests(topics)}
    except KafkaUnavailableError:
        return set()


def test_health_turns_bad_while_rounds_fail(own_kafka_broker):
    """Rounds that stop completing make /healthz and /readyz fail, and their age shows."""
    stall = {"health_stall_seconds": 30.0, "max_process_seconds": 5.0}
    with _running_checker(own_kafka_broker, "health", **stall) as running:
        checker, clock = running.checker, running.clock
        wait_for(checker.is_ready, 30, "the first complete round")
        assert checker.is_healthy()
        own_kafka_broker.stop()
        time.sleep(2)  # the loop meets the outage
        clock.skew += 100  # past 30 s + 5 s for each of the 3 partitions
        assert not checker.is_healthy()
        assert not checker.is_ready()
        assert REGISTRY.get_sample_value("outbox_checker_seconds_since_last_round") >= 100
        own_kafka_broker.start()
        wait_for(checker.is_healthy, 120, "health after the broker came back")
        assert checker.is_ready()


STOP_PATIENCE_SECONDS = 300.0
"""Kubernetes SIGKILLs a replica still running 30 s (terminationGracePeriodSeconds) after
SIGTERM, which a rolling update sends while the brokers may be away. How soon it exits is
measured in ``make chaos``; here the retries it must not wait out last 600 s."""


def test_a_stopped_checker_exits_without_waiting_out_its_retries_while_the_broker_is_down(
    own_kafka_broker,
):
    """Told to stop while its broker is gone, the checker retried its transactional
    producer's start for three client timeouts (90 s) and its relay's as long: minutes.
    Its client timeout is made long here (600 s of retries): an exit before it is a stop
    that ended the retries."""
    with _running_checker(
        own_kafka_broker, "stopping", writer_timeout=LONG_WRITER_TIMEOUT
    ) as running:
        own_kafka_broker.stop()
        time.sleep(5)  # the loop meets the outage and backs off; the relay is failing too
        started = time.monotonic()
        running.stopped = True
        running.checker.stop()
        running.loop.join(STOP_PATIENCE_SECONDS)
        took = time.monotonic() - started
        exited = not running.loop.is_alive()
        if not exited:
            faulthandler.dump_traceback(sys.__stderr__, all_threads=True)  # where it waits
        own_kafka_broker.start()
    assert exited, f"still running {took:.0f}s after stop()"


@pytest.mark.parametrize("stage", ["send_offsets_to_transaction", "flush", "commit_transaction"])
def test_a_chunk_caught_by_a_broker_restart_is_over_once_the_broker_returns(
    own_kafka_broker, stage: str
):
    """A round chunk whose Kafka transaction was open when its broker restarted holds the
    half partition's last stable offset (the relay cannot read on past it) until it ends.

    Measured after a broker restart: a chunk stuck in ``send_offsets_to_transaction``
    held publication 85 s, until the chunk watchdog's three client timeouts ran out.
    """
    prefix = f"chunk-{uuid.uuid4().hex[:6]}"
    names = TopicNames(prefix)
    topics = OutboxTopics(own_kafka_broker.bootstrap_servers, names, f"{prefix}-events")
    ensure_topics(
        AdminClient(topics.client_config),
        [*plan_topics(names, 3, 1, ("orders",)), TopicSpec(topics.real_topic, 1, 1)],
    )
    write(topics, *(pending_half(topics, f"t{i}").to_record(names, 0) for i in range(3)))
    at_offsets, stopped = threading.Event(), threading.Event()

    class RestartedAtItsOffsets(Producer):
        """The real producer; the broker stops as it enters ``stage``, and comes back."""

        def _stage(self, name: str, *args: Any) -> Any:
            if name == stage and not at_offsets.is_set():
                at_offsets.set()
                stopped.wait(60)
            return getattr(super(), name)(*args)

        def send_offsets_to_transaction(self, *args: Any) -> None:
            self._stage("send_offsets_to_transaction", *args)

        def flush(self, *args: Any) -> int:
            return self._stage("flush", *args)

        def commit_transaction(self, *args: Any) -> None:
            self._stage("commit_transaction", *args)

    with running_checker(
        topics,
        SkewedClock(60),
        producer_factory=RestartedAtItsOffsets,
        writer_timeout=LONG_WRITER_TIMEOUT,  # a chunk waited out would take 600 s
    ) as checker:
        outcome: list[object] = []

        def round_() -> None:
            try:
                outcome.append(checker.run_round())
            except Exception as exc:  # the round may fail: it is retried from its checkpoint
                outcome.append(exc)

        walking = threading.Thread(target=round_, daemon=True)
        walking.start()
        assert at_offsets.wait(60), "the round wrote no chunk"
        own_kafka_broker.stop()  # from this thread: the broker's process dies with its starter
        stopped.set()
        time.sleep(5)
        own_kafka_broker.start()
        walking.join(300)  # far below the watchdog's 600 s: over, not waited out
    assert outcome, "the round never ended"


def test_the_relay_publishes_after_an_outage_longer_than_its_session_with_none_hung(
    own_kafka_broker, caplog
):
    """librdkafka keeps a decommissioned broker as a producer's group coordinator after an
    outage (confluentinc/librdkafka#5511): the relay's first ``send_offsets_to_transaction``
    then waits until its deadline abandons it (5 s). Its first transaction after a failure or
    a lost assignment must run on a fresh producer instead.

    How soon after the broker's return a commit written then is published (``make chaos``
    measures it; this test asserts no relay transaction hung): the relay rejoins at once (a
    static member) and its first transaction must not wait out a hang.

    About 1.2 s on a quiet machine, 2-3 s with both cores busy, 5-7 s beside four busy loops
    (the broker itself then takes 45 s to start). A round chunk can hang too, in its
    ``send_offsets_to_transaction`` until its watchdog abandons it after 5 s; it sends its
    offsets before it writes any record, so that hang holds no half back from the relay
    (``test_round_writer.py``). It did, before: 5.1 s in a fresh-clone suite run."""
    from tests.checker.test_relay_recovery import commit_in_every_partition, published

    timeouts = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "1000"}
    with (
        caplog.at_level("INFO", logger="outbox_checker.relay"),
        _running_checker(
            own_kafka_broker,
            f"relayback{uuid.uuid4().hex[:6]}",
            kafka_properties=timeouts,
            instance_id="relay-back",
        ) as running,
    ):
        topics = running.topics
        warm = commit_in_every_partition(topics, "warm")
        wait_for(lambda: warm <= published(topics), 90, "the relay to publish")
        own_kafka_broker.stop()
        time.sleep(10)  # past the session: the relay loses its assignment
        own_kafka_broker.start()
        after = commit_in_every_partition(topics, "after")
        wait_for(lambda: after <= published(topics), 180, "the commits written after the return")
    stuck = [
        r.getMessage()
        for r in caplog.records
        if r.name == "outbox_checker.relay" and "stuck in" in r.getMessage()
    ]
    assert not stuck, f"a relay transaction hung after the outage: {stuck}"
