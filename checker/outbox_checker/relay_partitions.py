"""The op partitions one relay replica owns: its group membership, restores, standing aside.

The relay consumes the op topic in its own consumer group; each op partition it
is assigned is restored at its committed offset, its decision memory rebuilt
from the offset's metadata (:mod:`outbox_checker.decision_memory`) or kept from before.
A partition whose committed offset cannot be read (the coordinator moving, a
failed batch) stands aside, relaying nothing, until it can be put back there:
relaying on from where the consumer stands would commit offsets beyond
decisions never published.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from types import MappingProxyType
from typing import Any

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka import Message as KafkaMessage

from outbox.errors import KafkaUnavailableError
from outbox_checker import metrics
from outbox_checker.decision_memory import DecisionMemory
from outbox_checker.membership import GroupMember
from outbox_checker.relay_batch import HalfState
from outbox_checker.relay_lookups import RelayLookups
from outbox_checker.silence import SilenceWatch

log = logging.getLogger("outbox_checker.relay")  # the relay's one logger, whichever module logs


class OpPartitions:
    """The relay's group consumer and, per owned op partition, its memory and relayed offset."""

    def __init__(
        self,
        client_config: dict[str, Any],
        op_topic: str,
        lookups: RelayLookups,
        *,
        group_id: str,
        instance_id: str | None,
        session_timeout_ms: int,
        memory: int,
        timeout: float,
        silence_seconds: float,
        on_release: Callable[[list[int]], None],
    ) -> None:
        """``instance_id``: the replica's stable id, for static membership of the relay's
        group (:mod:`outbox_checker.membership`); ``None`` joins as a dynamic member.
        ``on_release``: told the partitions this replica stops relaying (a revocation, a
        fresh consumer), before they are shelved."""
        self._op_topic = op_topic
        self._lookups = lookups
        self._capacity = memory
        self._timeout = timeout
        self._silence_seconds = silence_seconds
        self._on_release = on_release
        self._memories: dict[int, DecisionMemory] = {}
        self._relayed: dict[int, int] = {}
        """Per owned op partition, the offset after the last decision relayed and committed."""
        self._unrestored: set[int] = set()
        """Owned op partitions not yet put back at their committed offset: their records wait."""
        self._dirty: set[int] = set()
        """Op partitions whose memory learned decisions not committed yet (the batch under way,
        or one that failed): such a memory is no longer the committed offset's."""
        self._shelf: dict[int, tuple[int, DecisionMemory]] = {}
        """Memories of partitions this replica stopped relaying (a fence, a rebalance, a failed
        batch), each with the committed offset it is exact at: taken back on a restore
        instead of re-reading the op partition from the memory's floor."""
        self._aside_since: float | None = None
        """Since when partitions stand aside unresumed (see :meth:`resume`)."""
        self._silence = SilenceWatch(silence_seconds)
        self._member = GroupMember(
            client_config,
            op_topic,
            group=group_id,
            instance=instance_id,
            session_timeout_ms=session_timeout_ms,
            on_assign=self.on_assign,
            on_revoke=self.on_revoke,
            on_rejoin=self._release_all,
            role="relay consumer",
            group_label=f"relay group {group_id!r}",
        )

    @property
    def consumer(self) -> Consumer:
        """The group consumer now: replaced when it goes silent, is fenced or cannot put
        partitions back."""
        return self._member.consumer

    @property
    def silence(self) -> SilenceWatch:
        """Whether the consumer has been silent long enough to ask the cluster about it."""
        return self._silence

    @property
    def partitions(self) -> list[int]:
        """Op partitions this replica relays now (or will, once it could read where to resume)."""
        return sorted({*self._memories, *self._unrestored})

    @property
    def memories(self) -> Mapping[int, DecisionMemory]:
        """Per op partition relayed now, its decision memory (read-only)."""
        return MappingProxyType(self._memories)

    @property
    def relayed(self) -> Mapping[int, int]:
        """Per op partition relayed now, the offset after the last decision relayed and
        committed (read-only)."""
        return MappingProxyType(self._relayed)

    @property
    def aside(self) -> list[int]:
        """Owned op partitions standing aside until :meth:`resume` puts them back."""
        return sorted(self._unrestored)

    def learning(self, partition: int) -> DecisionMemory:
        """The memory of ``partition``, about to learn decisions of the batch under way: no
        longer the committed offset's until :meth:`committed`."""
        self._dirty.add(partition)
        return self._memories[partition]

    def offsets_to_commit(self, next_offsets: Mapping[int, int]) -> list[TopicPartition]:
        """The op offsets of a batch, each with its shrunk memory in the metadata."""
        self._dirty.update(next_offsets)  # cleared by committed(): only if the batch commits
        offsets = []
        for partition, offset in next_offsets.items():
            memory = self._memories[partition]
            memory.shrink(offset)
            offsets.append(
                TopicPartition(self._op_topic, partition, offset, metadata=memory.metadata())
            )
        return offsets

    def committed(self, next_offsets: Mapping[int, int]) -> None:
        """The batch's transaction committed: its memories are the committed offsets' again."""
        self._relayed.update(next_offsets)
        self._dirty.difference_update(next_offsets)

    # ----------------------------------------------------------- membership

    def usable(self, message: KafkaMessage) -> bool:
        """Whether ``message`` is a record; an error is handled (a fence joins again with a
        fresh consumer), and one the relay cannot go on with is raised."""
        error = message.error()
        if error is None:
            return True
        if self._member.handled(error):
            return False
        if error.code() == KafkaError._AUTO_OFFSET_RESET:
            # The broker answering has no record at the consumer's position: a replica
            # with an older log, or retention. Read again from the committed offsets
            # (restore starts at the partition's first op if retention removed it).
            raise KafkaUnavailableError(
                f"reading {self._op_topic}[{message.partition()}]: {error.str()}; "
                "the batch is read again from the committed offsets"
            )
        if error.code() != KafkaError._PARTITION_EOF:
            raise KafkaException(error)
        return False

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """The group's assignment callback: restore each partition at its committed offset."""
        starts = []
        for tp in partitions:
            position = self._try_restore(tp.partition)
            if position is None:
                self._unrestored.add(tp.partition)
                starts.append(TopicPartition(self._op_topic, tp.partition))
                continue
            starts.append(TopicPartition(self._op_topic, tp.partition, position))
        consumer.assign(starts)  # eager: the whole assignment
        # Silence counts from the next idle poll: the seconds spent restoring were not the
        # consumer's, and its first fetch from the restored offsets is still to come.
        self._silence.heard()
        log.info("relaying op partitions %s", sorted(tp.partition for tp in partitions))

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """The group's revocation callback (and a lost assignment's): shelve the partitions."""
        released = [tp.partition for tp in partitions]
        self._on_release(released)  # lost in an outage, maybe: a fresh producer next
        for partition in released:
            self._shelve(partition)
            self._unrestored.discard(partition)
            with suppress(KeyError):  # not reported yet; older prometheus clients raise then
                metrics.RELAY_LAG.remove(str(partition))  # another replica reports it now
        consumer.unassign()  # eager: everything goes back
        log.info("stopped relaying op partitions %s", sorted(released))

    def rejoin_after_session_timeout(self) -> bool:
        """A fresh consumer at once if this static member's session timed out (see
        :meth:`GroupMember.rejoin_after_session_timeout`); whether it was replaced."""
        return self._member.rejoin_after_session_timeout()

    def replace_consumer(self) -> None:
        """Join the group again with a fresh consumer; it resumes from the committed offsets."""
        self._member.rejoin()

    def _release_all(self) -> None:
        """A fresh consumer joined: every partition relayed or waiting is the group's again."""
        self._on_release(list(self._memories))
        for partition in list(self._memories):
            self._shelve(partition)
        self._unrestored.clear()

    # ----------------------------------------------------------- restore

    def _try_restore(self, partition: int) -> int | None:
        """:meth:`restore`, or ``None`` when it failed: the partition must wait for a retry.

        Any failure, not only Kafka's (the op history unreadable, a checkpoint not
        understood): an assigned partition in neither the memories nor the waiting
        set would be orphaned, its decisions never published, its lag unseen.
        """
        try:
            return self.restore(partition)
        except Exception as exc:
            log.warning("relay cannot resume op partition %d yet: %s", partition, exc)
            return None

    def restore(self, partition: int) -> int:
        """Rebuild a partition's decision memory from its committed offset; return that offset.

        Reading the committed offset of a ``read_committed`` consumer waits
        for any transaction still open on it (KIP-447), so a predecessor's
        last batch is either in it or aborted, never half-seen.
        """
        tp = TopicPartition(self._op_topic, partition)
        (committed,) = self.consumer.committed([tp], timeout=self._timeout)
        low = self._lookups.op_start(partition)
        position = committed.offset
        if position == OFFSET_INVALID or position < 0:
            position = low
            metadata = None
        else:
            metadata = committed.metadata
            if position < low:
                log.warning(
                    "op partition %d: ops %d..%d were removed by retention before the relay "
                    "read them; resuming at %d",
                    partition,
                    position,
                    low - 1,
                    low,
                )
                position = low
        kept = self._kept_memory(partition, position, low)
        if kept is None:
            memory = DecisionMemory.from_metadata(metadata, self._capacity, low)
            offset = memory.op_floor
        else:
            memory, offset = kept
        rebuilt = 0
        for op_offset, decision in self._lookups.decisions(partition, offset, position):
            if self._lookups.half_state(decision) is not HalfState.NOT_STORED:
                memory.learn(decision.identity, op_offset)
                rebuilt += 1
        memory.shrink(position)
        self._memories[partition] = memory
        self._relayed[partition] = position
        log.info(
            "op partition %d: relay resumes at %d, %d decisions re-read%s",
            partition,
            position,
            rebuilt,
            "" if kept is None else " (its memory kept)",
        )
        return position

    def _shelve(self, partition: int) -> None:
        """Stop relaying ``partition``; keep its memory if it is the committed offset's."""
        memory = self._memories.pop(partition, None)
        relayed = self._relayed.pop(partition, None)
        if memory is not None and relayed is not None and partition not in self._dirty:
            self._shelf[partition] = (relayed, memory)
        self._dirty.discard(partition)

    def _kept_memory(
        self, partition: int, position: int, low: int
    ) -> tuple[DecisionMemory, int] | None:
        """The shelved memory of ``partition``, with the op offset to read on from, if it can
        be made exact at the committed ``position``; ``None``: rebuild it from the metadata.

        Shelved at offset ``kept``, it holds the first decision of every identity above its
        floor among the ops below ``kept``: a fact of the op partition, whoever committed
        what. Learning the ops another replica relayed meanwhile, [kept, position), makes
        it exact at ``position``, if the partition still holds them (``low``); a committed
        offset behind it (none, or reset) is not this memory's.
        """
        shelved = self._shelf.pop(partition, None)
        if shelved is None:
            return None
        kept, memory = shelved
        if low <= kept <= position:
            return memory, kept
        return None

    # ----------------------------------------------------------- standing aside

    def stand_all_aside(self) -> None:
        """Stand aside every partition relayed now (after a failed batch)."""
        for partition in list(self._memories):
            self.stand_aside(partition)

    def stand_aside(self, partition: int) -> None:
        """Relay nothing of ``partition`` until :meth:`resume` puts it back."""
        self._shelve(partition)
        self._unrestored.add(partition)
        if self._aside_since is None:
            self._aside_since = time.monotonic()

    def hold(self, partition: int, offset: int) -> None:
        """Read ``partition`` again from ``offset``; stand it aside if it cannot be put there."""
        try:
            self.consumer.seek(TopicPartition(self._op_topic, partition, offset))
        except KafkaException as exc:
            log.warning("relay cannot hold op partition %d at %d: %s", partition, offset, exc)
            self.stand_aside(partition)

    def resume(self) -> None:
        """Put each partition standing aside back at its committed offset, where it can be read."""
        resumed = False
        for partition in sorted(self._unrestored):
            position = self._try_restore(partition)
            if position is not None:
                try:
                    self.consumer.seek(TopicPartition(self._op_topic, partition, position))
                except KafkaException as exc:
                    log.warning("relay cannot resume op partition %d yet: %s", partition, exc)
                    position = None
            if position is None:
                self.stand_aside(partition)
                continue
            self._unrestored.discard(partition)
            resumed = True
        if resumed:  # as after an assignment: the seeks' first fetch is still to come
            self._silence.heard()
        self._replace_if_stuck_aside(time.monotonic())

    def _replace_if_stuck_aside(self, now: float) -> None:
        """Partitions that cannot be put back for ``silence_seconds``: a fresh consumer.

        After a lost session a consumer can be left with op partitions it cannot seek
        ("Erroneous state": its assignment's offset fetch failed) or whose committed
        offsets never come (each ask times out): standing aside for good, their commits
        would never be published. The group hands them to the new consumer, which
        restores them from the committed offsets, as after a silent one (the relay's idle).
        """
        if not self._unrestored:
            self._aside_since = None
            return
        if self._aside_since is None:
            self._aside_since = now
            return
        if now - self._aside_since < self._silence_seconds:
            return
        log.warning(
            "relay cannot put op partitions %s back (%.0fs): replacing its consumer",
            sorted(self._unrestored),
            now - self._aside_since,
        )
        self._aside_since = None
        self.replace_consumer()
