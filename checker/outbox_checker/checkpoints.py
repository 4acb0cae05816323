"""Where a round on a half partition starts: its checkpoint, and the offsets around it.

The owner of half partition p commits its half checkpoint as the group offset of p,
with the op checkpoint in the commit's metadata (:mod:`outbox_checker.round_writer`
writes both in a round's Kafka transaction, in the format of
:func:`outbox_checker.names.encode_checkpoint`). Loading one, as a replica does the first
time it works on a partition it was given, clamps it to what retention left (saying
loudly what was deleted unread) and re-reads the recent op history, so copies of
transactions that already ended stay skipped (RocketMQ's ``removeMap``, rebuilt).

Everything is asked of the group consumer the replica already has (committed offsets,
watermarks, offsets for a time) and of its half cursor and op readers: the protocol
model (tests/model) gives the same loader stand-ins for those.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException, TopicPartition
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_fixed

from outbox.errors import KafkaUnavailableError
from outbox.protocol import TopicNames
from outbox.reading import watermarks
from outbox_checker import metrics
from outbox_checker.ended import EndedTransactions
from outbox_checker.entries import HalfEntry, OpEntry
from outbox_checker.names import decode_checkpoint

log = logging.getLogger(__name__)

HISTORY_BATCH = 500
"""Op records read at a time while the ended transactions are rebuilt."""
RETRIABLE_ATTEMPTS = 10
RETRIABLE_PAUSE_SECONDS = 0.5
"""A passing refusal is asked again this often, this far apart (4.5 s in all): a stale
leader epoch took 3.7 s to clear after a broker's restart (librdkafka refreshes the
metadata itself)."""
PASSING_REFUSALS = frozenset(
    {
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
    }
)
"""Refusals of a client whose metadata is behind the cluster's: librdkafka does not call
FENCED_LEADER_EPOCH retriable, but it passes once the metadata is refreshed."""


@dataclass
class Checkpoint:
    half: int
    op: int


class GroupOffsets(Protocol):
    """What is asked of the replica's group consumer (a confluent-kafka ``Consumer``)."""

    def committed(
        self, partitions: list[TopicPartition], timeout: float
    ) -> list[TopicPartition]: ...

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float
    ) -> tuple[int, int]: ...

    def offsets_for_times(
        self, partitions: list[TopicPartition], timeout: float
    ) -> list[TopicPartition]: ...


class HalfCursor(Protocol):
    def read(self, partition: int, start: int, limit: int) -> list[HalfEntry]: ...


class OpHistory(Protocol):
    def ops(self, start: int, limit: int) -> list[OpEntry]: ...


class CheckpointLoader:
    """Loads a half partition's checkpoint and answers the offsets a round needs.

    Every Kafka failure is a :class:`~outbox.errors.KafkaUnavailableError`: the
    caller's round backs off and tries again.
    """

    def __init__(
        self,
        consumer: Callable[[], GroupOffsets],
        topics: TopicNames,
        halves: HalfCursor,
        op_history: Callable[[int], OpHistory],
        ended: EndedTransactions,
        op_history_margin_seconds: float,
    ) -> None:
        """``consumer`` gives the group consumer of the moment (a replica replaces a fenced
        one); ``op_history`` reads op partition p."""
        self._consumer = consumer
        self._topics = topics
        self._halves = halves
        self._op_history = op_history
        self._ended = ended
        self._margin_ms = int(op_history_margin_seconds * 1000)

    def load(self, partition: int) -> Checkpoint:
        """The committed checkpoints, clamped to what retention left; rebuild ended ids."""
        try:
            (committed,) = self._consumer().committed(
                [TopicPartition(self._topics.half, partition)], timeout=30
            )
        except KafkaException as exc:
            raise KafkaUnavailableError(f"reading checkpoints: {exc}") from None
        half_low = self.low_offset(self._topics.half, partition)
        op_low = self.low_offset(self._topics.op, partition)
        if committed.offset == OFFSET_INVALID or committed.offset < 0:
            log.info("partition %d has no checkpoint: starting at the beginning", partition)
            return Checkpoint(half_low, op_low)
        op = decode_checkpoint(committed.metadata)
        if committed.offset < half_low:
            _report_lost_to_retention(partition, committed.offset, half_low)
        checkpoint = Checkpoint(max(committed.offset, half_low), max(op or op_low, op_low))
        self.rebuild_ended(partition, checkpoint)
        return checkpoint

    def rebuild_ended(self, partition: int, checkpoint: Checkpoint) -> None:
        """Re-read recent op history, so copies of ended transactions stay skipped."""
        first = self._halves.read(partition, checkpoint.half, 1)
        stored_ms = first[0].raw.timestamp_ms if first else None
        if stored_ms is None:
            return
        since_ms = stored_ms - self._margin_ms
        start = self.offset_for_time(self._topics.op, partition, since_ms)
        history = self._op_history(partition)
        count = 0
        while start < checkpoint.op:
            entries = history.ops(start, HISTORY_BATCH)
            if not entries:
                break
            for entry in entries:
                if entry.offset >= checkpoint.op:
                    break
                if entry.op is not None:
                    self._ended.add((entry.op.half_partition, entry.op.identity))
                    count += 1
            start = entries[-1].offset + 1
        log.info("partition %d: %d ended halves rebuilt from op history", partition, count)

    def low_offset(self, topic: str, partition: int) -> int:
        low, _ = self.watermarks(topic, partition)
        return low

    def end_offset(self, topic: str, partition: int) -> int | None:
        """The end, or None when Kafka does not say (the round then reads to what it finds)."""
        try:
            return self.watermarks(topic, partition)[1]
        except KafkaUnavailableError:
            return None

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        try:
            return watermarks(self._consumer(), TopicPartition(topic, partition), timeout=30)
        except KafkaException as exc:
            raise KafkaUnavailableError(f"watermarks of {topic}[{partition}]: {exc}") from None

    def offset_for_time(self, topic: str, partition: int, timestamp_ms: int) -> int:
        """The first offset at or after ``timestamp_ms``. A retriable refusal is asked again
        a few times: right after a broker's restart the consumer's leader epoch is stale
        for a moment (FENCED_LEADER_EPOCH), and failing would cost the caller its turn (a
        round backs off; the parked sends' drain waits for the next one)."""
        asked = [TopicPartition(topic, partition, max(0, timestamp_ms))]
        try:
            (found,) = Retrying(
                retry=retry_if_exception(_retriable),
                stop=stop_after_attempt(RETRIABLE_ATTEMPTS),
                wait=wait_fixed(RETRIABLE_PAUSE_SECONDS),
                reraise=True,
            )(self._consumer().offsets_for_times, asked, timeout=30)
        except KafkaException as exc:
            raise KafkaUnavailableError(f"offsets for time in {topic}: {exc}") from None
        if found.offset < 0:  # nothing that recent: nothing to rebuild
            return self.watermarks(topic, partition)[1]
        return int(found.offset)


def _retriable(exc: BaseException) -> bool:
    if not isinstance(exc, KafkaException) or not exc.args:
        return False
    error = exc.args[0]
    return bool(error.retriable() or error.code() in PASSING_REFUSALS)


def _report_lost_to_retention(partition: int, checkpoint: int, low: int) -> None:
    """Halves deleted before any round read them were never checked: say so loudly."""
    lost = low - checkpoint
    metrics.HALVES_LOST_TO_RETENTION.labels(str(partition)).inc(lost)
    log.error(
        "half partition %d: %d half records (offsets %d..%d) were deleted by retention "
        "before the checker read them; any without a decision is lost: keep the checker "
        "running, or raise the half topic's retention.ms above the longest outage",
        partition,
        lost,
        checkpoint,
        low - 1,
    )
