"""Which half partitions this replica owns, and the checkpoint known for each.

Replicas share the half partitions through one consumer group, subscribed to the
half topic with every partition paused: membership and fencing are all the group is
for (the rounds read with cursors of their own). A partition's checkpoint is loaded
at its first round after it was assigned and kept while it stays here; a revocation
forgets it, a fence makes the next round load it again from what Kafka committed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, TopicPartition

from outbox.access import is_authorization_failure
from outbox.errors import NotAuthorizedError
from outbox_checker.checkpoints import Checkpoint
from outbox_checker.membership import GroupMember
from outbox_checker.settings import CheckerSettings

log = logging.getLogger(__name__)


class HalfOwnership:
    """The rounds' group member and what it owns. Thread-safe: the rebalance callbacks
    run in ``poll``, while the health probe reads the owned partitions from another thread.
    """

    def __init__(
        self,
        settings: CheckerSettings,
        static_id: str | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``static_id``: the replica's id if it survives restarts, making it a static member
        (:mod:`outbox_checker.membership`); ``clock``: the checker's clock in seconds, for
        how long a join has been stuck (:meth:`GroupMember.rejoin_if_stalled`)."""
        self._settings = settings
        self._owned: dict[int, Checkpoint | None] = {}
        self._lock = threading.Lock()
        self.assigned = threading.Event()
        """Set once the group has given this replica its first assignment."""
        self.generation = 0
        """How many assignments the group has given this replica (one per rebalance)."""
        self._member = GroupMember(
            settings.client_config(),
            settings.topics.half,
            group=settings.group_id,
            instance=static_id,
            session_timeout_ms=settings.session_timeout_ms,
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_rejoin=self._forget_owned,
            role="group consumer",
            group_label=f"group {settings.group_id!r}",
            overrides={"max.poll.interval.ms": 600_000},
            clock=clock,
        )
        self.refusals = self._member.refusals
        """Whether the group refuses this replica's joins lately (it waits, and is ready)."""

    @property
    def consumer(self) -> Consumer:
        """The group consumer now (a fenced one is replaced)."""
        return self._member.consumer

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.assign(partitions)  # eager: the whole assignment
        consumer.pause(partitions)  # membership only: the rounds read with their own cursors
        with self._lock:
            for tp in partitions:
                self._owned[tp.partition] = None  # checkpoint loaded at its first round
        log.info("assigned half partitions %s", sorted(tp.partition for tp in partitions))
        self.generation += 1
        self.assigned.set()

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        with self._lock:
            for tp in partitions:
                self._owned.pop(tp.partition, None)
        consumer.unassign()  # eager: everything goes back
        log.info("revoked half partitions %s", sorted(tp.partition for tp in partitions))

    def _forget_owned(self) -> None:
        """A fresh consumer joins: what the fenced one owned, the group hands out again."""
        with self._lock:
            self._owned.clear()

    def partitions(self) -> list[int]:
        with self._lock:
            return sorted(self._owned)

    def known_checkpoint(self, partition: int) -> Checkpoint | None:
        """The checkpoint kept for an owned partition; None until its first round loads it."""
        with self._lock:
            return self._owned.get(partition)

    def remember(self, partition: int, checkpoint: Checkpoint | None) -> None:
        """Keep (or, with None, forget) a partition's checkpoint, if it is still owned."""
        with self._lock:
            if partition in self._owned:
                self._owned[partition] = checkpoint

    def group_metadata(self) -> object:
        """The group generation this replica knows; a chunk committed with a stale one is fenced."""
        return self.consumer.consumer_group_metadata()

    def poll(self, timeout: float) -> None:
        """Serve rebalances (and keep the group session alive).

        A member stuck joining, or a static member that lost its session or was fenced by
        its own rejoin, gets a fresh consumer; fenced too often, another replica has its id
        (DuplicateInstanceError).
        A refusal by the authoriser ends the replica: without its group or the half topic
        it would wait for partitions forever.
        """
        message = self.consumer.poll(timeout)
        if self._member.rejoin_after_session_timeout() or self._member.rejoin_if_stalled():
            return
        error = message.error() if message is not None else None
        if error is None or self._member.handled(error):
            return
        if is_authorization_failure(error):
            settings = self._settings
            resource = (
                f"group {settings.group_id!r}"
                if error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED
                else f"topic {settings.topics.half!r}"
            )
            raise NotAuthorizedError("READ", resource, settings.principal)
