"""How a checker replica belongs to its consumer groups (the rounds' and the relay's).

Both groups hand a killed replica's partitions to the others once its session
expires, so the session timeout is how long a kill stops those partitions:
librdkafka's default (45 s) held publication that long; the broker's floor
(``group.min.session.timeout.ms``, 6 s by default) is the default here.
Heartbeats come from librdkafka's own thread, so a busy Python process does not
miss them.

A replica with a stable instance id joins as a *static member* (KIP-345,
``group.instance.id``): restarted within the session, it takes its partitions
back with no rebalance, and its Kafka transactional ids (derived from the same
id) fence its predecessor's open transactions at once. Two running replicas
given the same id would take the membership from each other for ever; the
broker tells the older one (``FENCED_INSTANCE_ID``, fatal to its consumer),
which refuses to go on (:class:`outbox.errors.DuplicateInstanceError`) once
it has been fenced again and again (:class:`Fences`): a single fence also
happens to a lone replica, when a broker restart loses its group's answer to a
join that librdkafka then repeats. And a static member whose session timed out
(its group's coordinator frozen or killed, and the group moved to another node)
is fenced by its own rejoin, fatally (librdkafka 2.x, confluentinc/librdkafka#3437):
a three-node chaos run saw four such fences in 47 s, one per node fault, and the
relay took itself for a twin and stopped. Such a fence follows the consumer's
session timeout (:class:`SessionLog`), 0 to 19 s later in another run, and the
consumer does nothing useful meanwhile: so a static member whose session timed
out joins again with a fresh consumer at once (:meth:`GroupMember.rejoin_after_session_timeout`),
which joined in under a second in those runs, and a fence before its next
assignment is its own, not counted; a twin's fence comes while the session is
alive. A replica with a random id stays a dynamic member, which leaves its group when
it closes: a static member does not, and one that never returns would hold its
partitions for a session.

The groups assign eagerly (``range``: every rebalance revokes everything and hands
every partition out in one phase), not cooperatively. A static member that joins
again with a fresh consumer is given back the assignment last stored for its id,
with no rebalance; under ``cooperative-sticky`` that can be the first phase's,
which leaves out the partitions the member was revoking, and if that member was
the only one revoking, no second phase ever hands them out: a three-node chaos run
left two half partitions with no owner for 13 minutes so. Under ``range`` the
stored assignment is always whole. A group refuses members of both kinds at once
(``INCONSISTENT_GROUP_PROTOCOL``), so in a rolling upgrade from 0.1.0, whose replicas
assign cooperatively, the new replicas wait (:class:`JoinRefusals`) while the old ones
go on, and join once the last has left.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from outbox.config import KAFKA_LOGGER_NAME
from outbox.errors import DuplicateInstanceError
from outbox_checker.silence import close_in_background

log = logging.getLogger(__name__)

FENCES_LIMIT = 4
FENCES_WINDOW_SECONDS = 60.0
ASSIGNMENT_STRATEGY = "range"
"""Eager: assignments are whole (:class:`Consumer.assign`, ``unassign``), never incremental."""
JOIN_STALL_SECONDS = 30.0
"""A member revoked this long ago and given no assignment since (an empty one counts) is
stuck joining, at least this long, or three sessions if they are longer."""
REFUSAL_LOG_SECONDS = 60.0
REFUSAL_FRESH_SECONDS = 10.0
"""librdkafka repeats a refused join every 2 s: a refusal this recent means it goes on."""


def process_instance_id() -> str:
    """An id for a replica with no stable one: unique to this process (host, pid, random)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def group_consumer_config(
    client_config: dict[str, Any],
    group: str,
    instance: str | None,
    session_timeout_ms: int,
) -> dict[str, Any]:
    """A group consumer's librdkafka settings; pass-through properties win over the session's."""
    config: dict[str, Any] = {
        "session.timeout.ms": session_timeout_ms,
        "heartbeat.interval.ms": max(100, session_timeout_ms // 3),
        **client_config,
        "group.id": group,
        "enable.auto.commit": False,
        # Never a silent jump: a replica with an older log (a leader cut from its cluster)
        # answers "out of range" for an offset it has not got, and a reset to the earliest
        # had the relay re-read and re-publish decisions it had published (its owner
        # restores each partition at an explicit offset; see OpPartitions.usable).
        "auto.offset.reset": "error",
        "isolation.level": "read_committed",
        "partition.assignment.strategy": ASSIGNMENT_STRATEGY,
    }
    if instance is not None:
        config["group.instance.id"] = instance
    config["logger"] = SessionLog(client_config.get("logger"))
    return config


Rebalance = Callable[[Consumer, list[TopicPartition]], None]


def group_member(
    config: dict[str, Any], topic: str, on_assign: Rebalance, on_revoke: Rebalance
) -> tuple[Consumer, SessionLog]:
    """A consumer of ``config`` (:func:`group_consumer_config`) subscribed to ``topic``, and
    its session log. Eager assignments: a lost one is handled as a revocation."""
    consumer = Consumer(config)
    consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)
    return consumer, config["logger"]


class GroupMember:
    """A replica's member of one consumer group, subscribed to one topic: the rounds'
    (:class:`outbox_checker.ownership.HalfOwnership`) and the relay's
    (:class:`outbox_checker.relay_partitions.OpPartitions`) are each one.

    Its consumer is configured by :func:`group_consumer_config` and subscribed by
    :func:`group_member`. A static member fenced by its own rejoin joins again with a fresh
    consumer, one fenced by a twin ends the replica (:func:`must_rejoin`); a join the group
    refuses mid-upgrade is waited out (:class:`JoinRefusals`). The assignment callbacks
    hear only the consumer of the moment: a replaced consumer's last word is dropped.
    """

    def __init__(
        self,
        client_config: dict[str, Any],
        topic: str,
        *,
        group: str,
        instance: str | None,
        session_timeout_ms: int,
        on_assign: Rebalance,
        on_revoke: Rebalance,
        on_rejoin: Callable[[], None],
        role: str,
        group_label: str,
        overrides: dict[str, Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``instance``: the replica's stable id, for static membership (``None``: a dynamic
        member). ``on_rejoin`` is told once a fresh consumer replaced a fenced one, before
        the old one closes: what it owned is the new one's to be given. ``role`` and
        ``group_label`` name the consumer and its group in the fence's warning and error
        ("relay consumer", "relay group 'x'"); ``overrides``: librdkafka properties over
        the group consumer's; ``clock``: the seconds :meth:`rejoin_if_stalled` measures
        with (the checker passes its own, which tests move)."""
        self._client_config = client_config
        self._topic = topic
        self._group = group
        self._instance = instance
        self._session_timeout_ms = session_timeout_ms
        self._on_assign = on_assign
        self._on_revoke = on_revoke
        self._on_rejoin = on_rejoin
        self._role = role
        self._group_label = group_label
        self._overrides = overrides or {}
        self._fences = Fences()
        self.refusals = JoinRefusals(group)
        """Whether the group refuses this replica's joins lately (it waits, and is ready)."""
        self._clock = clock
        self._revoked_at: float | None = clock()
        """When the group last took this member's partitions (or its consumer was made), until
        it gives it some again: a fresh consumer whose join never goes through is watched
        as one whose partitions were taken."""
        self._session_lost = False
        """Its session timed out and the group has not given it partitions since: a fence
        meanwhile is its own rejoin's (or its replaced consumer's), not a twin's."""
        self._consumer, self._session_log = self._join()

    @property
    def consumer(self) -> Consumer:
        """The group consumer now: replaced by :meth:`rejoin`."""
        return self._consumer

    def _join(self) -> tuple[Consumer, SessionLog]:
        config = group_consumer_config(
            self._client_config, self._group, self._instance, self._session_timeout_ms
        )
        return group_member(
            {**config, **self._overrides}, self._topic, self._assigned, self._revoked
        )

    def _assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if consumer is self._consumer:  # not a replaced consumer's last word
            self._revoked_at = None
            self._session_lost = False
            self._on_assign(consumer, partitions)

    def _revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if consumer is self._consumer:
            self._revoked_at = self._clock()
            self._on_revoke(consumer, partitions)

    def rejoin(self) -> None:
        """Join the group again with a fresh consumer; the old one closes in the background."""
        old, (self._consumer, self._session_log) = self._consumer, self._join()
        self._revoked_at = self._clock()
        self._on_rejoin()
        close_in_background(old)

    def rejoin_after_session_timeout(self) -> bool:
        """:meth:`rejoin` at once when this static member's consumer lost its session.

        librdkafka's own rejoin of a static member after a session timeout ends in a fatal
        fence of its own making (confluentinc/librdkafka#3437): in a three-node chaos run
        4 of 5 session timeouts did, 0 to 19 s later, and the consumer held no partitions
        meanwhile; the fresh consumer made after each fence joined within a second. A
        dynamic member's rejoin has no such fault and is left to librdkafka. Call it after
        each poll: the timeout is heard in the consumer's log, which a poll serves."""
        if self._instance is None or not self._session_log.timed_out:
            return False
        log.warning(
            "%s lost its session in %s: joining again with a fresh one",
            self._role,
            self._group_label,
        )
        self.rejoin()
        self._session_lost = True
        return True

    def rejoin_if_stalled(self) -> bool:
        """:meth:`rejoin` when the group took this member's partitions, or never gave its
        consumer any, and has given it none since, for :data:`JOIN_STALL_SECONDS` or three
        sessions, whichever is longer.

        Eager rebalances give every member an assignment (maybe empty) once its join is
        through, a few seconds after the revocation. After a broker's pause (SIGSTOP, a
        stalled VM) librdkafka can leave a consumer that lost its session with its join
        request queued for a coordinator connection that never comes up again: 2 minutes
        and more without partitions, while the relay's consumer in the same process, stuck
        too, had been replaced by its own watchdog after 10 s. A fresh consumer looks the
        coordinator up anew. While the
        brokers are away this replaces a consumer that could not join either, at most
        once a stall period."""
        revoked_at = self._revoked_at
        stall = max(JOIN_STALL_SECONDS, 3 * self._session_timeout_ms / 1000)
        if revoked_at is None or self._clock() - revoked_at < stall:
            return False
        log.warning(
            "%s has had no partitions for %.0fs in %s: joining again with a fresh one",
            self._role,
            self._clock() - revoked_at,
            self._group_label,
        )
        self.rejoin()
        return True

    def handled(self, error: KafkaError) -> bool:
        """Whether ``error`` was the group's to deal with, and is dealt with: a fence of this
        static member (it joined again, :meth:`rejoin`) or a refused join (waited out).
        Raises DuplicateInstanceError when another replica has this one's id."""
        own = self._session_lost or self._session_log.timed_out
        fenced = must_rejoin(
            error, self._instance, own, self._fences, self._role, self._group_label
        )
        if fenced:
            self.rejoin()
            self._session_lost = own  # the fresh consumer's fence may still be the old one's
            return True
        return self.refusals.explains(error)


def must_rejoin(
    error: KafkaError,
    instance: str | None,
    own: bool,
    fences: Fences,
    role: str,
    group: str,
) -> bool:
    """Whether ``error`` fenced this static member, which must join again with a fresh
    consumer (said in one warning naming ``role``). ``own``: its session timed out and it
    has had no assignment since, so the fence is its own rejoin's. Fenced too often
    otherwise, another replica has its id: DuplicateInstanceError."""
    if instance is None or not is_instance_fenced(error):
        return False
    if not own and fences.too_many():
        raise DuplicateInstanceError(instance, group)
    log.warning(
        "%s fenced%s (%s): joining again with a fresh one",
        role,
        " after its session timed out" if own else "",
        error.str(),
    )
    return True


class SessionLog(logging.Logger):
    """One group consumer's librdkafka log lines, passed on to the client's logger (else
    ``outbox.kafka``), noting whether the consumer's session timed out (``SESSTMOUT``).

    confluent-kafka calls ``log(level, "%s [%s] %s", facility, client, message)``.
    """

    def __init__(self, forward: logging.Logger | None = None) -> None:
        self._forward = forward or logging.getLogger(KAFKA_LOGGER_NAME)
        super().__init__(self._forward.name)
        self.timed_out = False
        """Whether this consumer's group session timed out (its static membership is then
        lost to its own rejoin: :meth:`GroupMember.rejoin_after_session_timeout`)."""

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        if args and args[0] == "SESSTMOUT":
            self.timed_out = True
        self._forward.log(level, msg, *args, **kwargs)


def is_instance_fenced(error: KafkaError) -> bool:
    """Whether the broker gave this consumer's static membership to another consumer."""
    if error.code() == KafkaError.FENCED_INSTANCE_ID:
        return True
    # librdkafka reports it as a fatal consumer error that names the cause.
    return error.code() == KafkaError._FATAL and "group.instance.id" in error.str()


class JoinRefusals:
    """Why the group refuses this consumer's joins, when its other members assign partitions
    another way: replicas of 0.1.0 (``cooperative-sticky``) mid-upgrade.

    Such a replica is fine and waits, so it counts as ready (:meth:`refusing`): a rolling
    upgrade that waited for it to get partitions would wait for ever, since it gets
    them only once the last old replica has left. Said at most once a minute, since
    librdkafka repeats the join every few seconds.
    """

    def __init__(self, group: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._group = group
        self._clock = clock
        self._said_at: float | None = None
        self._refused_at: float | None = None

    def explains(self, error: KafkaError) -> bool:
        """Whether ``error`` is such a refusal (then said, now and then); others are not."""
        if error.code() != KafkaError.INCONSISTENT_GROUP_PROTOCOL:
            return False
        now = self._refused_at = self._clock()
        if self._said_at is None or now - self._said_at >= REFUSAL_LOG_SECONDS:
            self._said_at = now
            log.warning(
                "group %r refuses this replica: its other members assign partitions another"
                " way (replicas of kafka-outbox 0.1.0 assign cooperatively); it waits and"
                " joins once they have left",
                self._group,
            )
        return True

    def refusing(self) -> bool:
        """Whether the group refused this consumer's join lately."""
        at = self._refused_at
        return at is not None and self._clock() - at <= REFUSAL_FRESH_SECONDS


class Fences:
    """How often a consumer of this replica lost its static membership lately.

    A twin running with the same id takes it back every few seconds (each
    fenced consumer joins again with a fresh one, fencing the other), so it
    reaches ``FENCES_LIMIT`` within ``FENCES_WINDOW_SECONDS``; a broker restart
    fences a lone replica once.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._times: deque[float] = deque()

    def too_many(self) -> bool:
        """Count a fence now; whether that makes too many for a lone replica."""
        now = self._clock()
        self._times.append(now)
        while now - self._times[0] > FENCES_WINDOW_SECONDS:
            self._times.popleft()
        return len(self._times) >= FENCES_LIMIT
