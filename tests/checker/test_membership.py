"""How the checker's consumer groups hand out partitions, on a real broker.

Raw consumers built with the replicas' own group settings
(:func:`outbox_checker.membership.group_consumer_config`) play the replicas, so each
step of a rebalance can be held where a fault struck it in a chaos run.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from outbox.config import kafka_client_config
from outbox_checker.membership import (
    ASSIGNMENT_STRATEGY,
    JOIN_STALL_SECONDS,
    GroupMember,
    JoinRefusals,
    group_consumer_config,
)
from tests.checker.support import wait_for

PARTITIONS = 4


class Member:
    """A group consumer polled in a thread of its own, recording what it owns."""

    def __init__(self, client: dict, group: str, instance: str, topic: str, **hooks) -> None:
        self.config = group_consumer_config(client, group, instance, 6000)
        # Cooperative as the groups were in 0.1.0, eager as they are now.
        self.cooperative = self.config["partition.assignment.strategy"] == "cooperative-sticky"
        self.owned: set[int] = set()
        self.fenced = False
        self._before_revoke = hooks.get("before_revoke")
        self._consumer = Consumer(self.config)
        self._consumer.subscribe(
            [topic], on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._revoked
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        (consumer.incremental_assign if self.cooperative else consumer.assign)(partitions)
        self.owned |= {tp.partition for tp in partitions}

    def _revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self._before_revoke is not None:
            self._before_revoke(self, partitions)
        if self.cooperative:
            consumer.incremental_unassign(partitions)
        else:
            consumer.unassign()
        given = {tp.partition for tp in partitions} if self.cooperative else self.owned
        self.owned = self.owned - given

    def _poll(self) -> None:
        while not self._stop.is_set():
            message = self._consumer.poll(0.2)
            if message is not None and message.error() is not None and message.error().fatal():
                self.fenced, self.owned = True, set()
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()


@pytest.mark.kafka
def test_a_member_fenced_before_it_rejoins_leaves_no_partition_without_an_owner(
    kafka_bootstrap: str, kafka_admin: AdminClient, unique_prefix: str
):
    """A replica owning every partition starts giving some back to a newcomer, and a fresh
    consumer with its instance id (a replica's own after a fence) joins before it has: the
    fresh one gets the assignment stored for that id. Under ``cooperative-sticky`` that
    was the first phase's, without the partitions being handed over, and nobody started
    the second phase: a three-node chaos run left two half partitions so for 13 minutes."""
    topic, group = f"{unique_prefix}-half", f"{unique_prefix}.checker"
    kafka_admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    client = kafka_client_config(kafka_bootstrap)
    members: list[Member] = []
    fresh_joined = threading.Event()

    def fence_first(member: Member, partitions: list[TopicPartition]) -> None:
        if member is members[0] and len(members) == 2 and partitions:
            fresh = Member(client, group, "replica-0", topic)
            members.append(fresh)
            wait_for(lambda: bool(fresh.owned), 30, "the fresh consumer's assignment")
            fresh_joined.set()

    try:
        members.append(Member(client, group, "replica-0", topic, before_revoke=fence_first))
        wait_for(lambda: len(members[0].owned) == PARTITIONS, 60, "the first replica's partitions")
        members.append(Member(client, group, "replica-1", topic))
        assert fresh_joined.wait(60), "the first replica was never asked to give partitions back"
        fresh, newcomer = members[2], members[1]

        def owners() -> set[int]:
            return fresh.owned | newcomer.owned

        try:
            wait_for(lambda: owners() == set(range(PARTITIONS)), 20, "every partition owned")
        except AssertionError:
            raise AssertionError(
                f"partitions without an owner: {sorted(set(range(PARTITIONS)) - owners())}"
                f" (fresh {sorted(fresh.owned)}, newcomer {sorted(newcomer.owned)})"
            ) from None
        assert fresh.owned.isdisjoint(newcomer.owned)
    finally:
        for member in members:
            member.close()


def test_the_groups_assign_eagerly():
    assert ASSIGNMENT_STRATEGY == "range"
    config = group_consumer_config({}, "g", "r-0", 6000)
    assert config["partition.assignment.strategy"] == "range"


def test_a_group_refusing_another_protocol_is_explained_once_a_minute(caplog):
    now = [0.0]
    refusals = JoinRefusals("orders.checker", lambda: now[0])
    refused = KafkaError(KafkaError.INCONSISTENT_GROUP_PROTOCOL, "JoinGroup failed")
    assert not refusals.refusing()
    with caplog.at_level(logging.WARNING, logger="outbox_checker.membership"):
        assert refusals.explains(refused)
        now[0] += 3.0
        assert refusals.explains(refused)  # repeated joins: not said again yet
        now[0] += 60.0
        assert refusals.explains(refused)
    assert not refusals.explains(KafkaError(KafkaError._PARTITION_EOF))
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2
    assert "group 'orders.checker' refuses this replica" in said[0]
    assert "replicas of kafka-outbox 0.1.0 assign cooperatively" in said[0]
    assert refusals.refusing()  # a replica waiting so is ready: a rolling upgrade goes on
    now[0] += 30.0
    assert not refusals.refusing()


@pytest.mark.kafka
def test_a_replica_waits_out_an_older_one_of_the_other_protocol_then_takes_its_partitions(
    kafka_bootstrap: str, kafka_admin: AdminClient, unique_prefix: str
):
    """Mid-upgrade from 0.1.0 (cooperative) the group refuses a new replica's joins; it
    keeps asking and takes every partition once the old one has gone."""
    topic, group = f"{unique_prefix}-half", f"{unique_prefix}.checker"
    kafka_admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    client = kafka_client_config(kafka_bootstrap)
    old_config = group_consumer_config(client, group, "old-0", 6000)
    old = Consumer({**old_config, "partition.assignment.strategy": "cooperative-sticky"})
    old.subscribe([topic])
    new: Member | None = None
    try:
        deadline = time.monotonic() + 60
        while not old.assignment() and time.monotonic() < deadline:
            old.poll(0.2)
        new = Member(client, group, "new-0", topic)
        end = time.monotonic() + 5
        while time.monotonic() < end:
            old.poll(0.2)
        assert not new.owned and not new.fenced
    finally:
        old.close()  # a static member: its session ends 6 s later
    try:
        wait_for(lambda: new.owned == set(range(PARTITIONS)), 60, "the new replica to take over")
    finally:
        new.close()


@pytest.mark.kafka
def test_a_fresh_member_the_group_never_gives_partitions_is_replaced_after_the_stall(
    kafka_bootstrap: str, kafka_admin: AdminClient, unique_prefix: str
):
    """A fresh consumer (a replica's first, or one made by a rejoin) whose join never goes
    through was never watched: only a revocation started the stall period. A fresh-clone
    suite run had a rounds' consumer, replaced while its broker was frozen, still without
    partitions two minutes after the thaw. Here the group's other member stops polling
    mid-rebalance, so the join waits out that member's 300 s poll interval."""
    topic, group = f"{unique_prefix}-half", f"{unique_prefix}.checker"
    kafka_admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    client = kafka_client_config(kafka_bootstrap)
    holder = Consumer(
        {**group_consumer_config(client, group, "holder-0", 6000), "max.poll.interval.ms": 300000}
    )
    holder.subscribe([topic])
    member: GroupMember | None = None
    try:
        wait_for(lambda: holder.poll(0.2) is None and bool(holder.assignment()), 60, "the holder")
        now = [0.0]
        member = GroupMember(
            client,
            topic,
            group=group,
            instance="fresh-0",
            session_timeout_ms=6000,
            on_assign=lambda consumer, partitions: None,
            on_revoke=lambda consumer, partitions: None,
            on_rejoin=lambda: None,
            role="rounds' consumer",
            group_label=f"group {group!r}",
            clock=lambda: now[0],
        )
        first = member.consumer
        end = time.monotonic() + 5
        while time.monotonic() < end:
            first.poll(0.2)
        assert not first.assignment(), "the join went through: nothing here to replace"
        assert not member.rejoin_if_stalled()
        now[0] += JOIN_STALL_SECONDS + 1
        assert member.rejoin_if_stalled()
        assert member.consumer is not first
    finally:
        if member is not None:
            member.consumer.close()
        holder.close()
