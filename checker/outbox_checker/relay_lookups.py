"""What the relay asks Kafka besides its group: half partitions' ends, watermarks, op history.

Whether a decision's half can be read decides whether the relay publishes it,
waits for it or ignores the op (:class:`~outbox_checker.relay_batch.HalfState`);
the op history is read again to rebuild a decision memory and to judge a
decision below a memory's floor. None of it goes through the group consumer,
from whose callbacks some of it is asked (:class:`~outbox_checker.relay_partitions.OpPartitions`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from outbox.errors import KafkaUnavailableError
from outbox.protocol import Decision, RawRecord, TopicNames
from outbox.reading import LEADER_PATIENCE, watermarks
from outbox_checker.decision_memory import ReadOps
from outbox_checker.kafka_reader import (
    EndOffsetClient,
    TopicCursor,
    end_offsets,
    watermark_client,
)
from outbox_checker.relay_batch import HalfState, decode_op

log = logging.getLogger("outbox_checker.relay")  # the relay's one logger, whichever module logs

PAST_END_PATIENCE_SECONDS = 30.0
"""How long the ends of a half partition must keep answering that a half lies past them
before an op naming it is taken for a bogus one and ignored. A half is stored before the
op that decides it is written, so only a bogus op or a stale answer says so: a leader cut
from its cluster, or deposed and not told yet, answers from a log that ends earlier, and
a committed transaction was once dropped on one such answer. Kafka fences a broker that
lost the controller within its session (9 s by default) and elects new leaders at once."""

_PAST_END_ASK_INTERVAL_SECONDS = 1.0
"""How often an op answered past its half partition's end asks again while it waits (each
asking starts an admin client; the held partition is re-read every 50 ms)."""


class RelayLookups:
    """The relay's questions to Kafka outside its group consumer, and what it learnt of them."""

    def __init__(
        self,
        client_config: dict[str, Any],
        topics: TopicNames,
        timeout: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``clock``: seconds, for how long a half has been answered past its partition's end."""
        self._client_config = client_config
        self._clock = clock
        self._past_end: dict[tuple[int, int], tuple[float, float]] = {}
        """Per (half partition, offset) answered past both its partition's ends: since when,
        and when last asked."""
        self._topics = topics
        self._ends = EndOffsetClient(client_config)
        """Asked the readable ends of several half partitions in one request per leader; a
        fresh client after a question it could not answer (a killed leader's partitions)."""
        self._timeout = timeout
        self._half_ends: dict[int, int] = {}
        """Per half partition, its last stable offset once read: halves below it are readable."""
        self._stored_ends: dict[int, int] = {}
        """Per half partition, its high watermark once read (asked only for an op past it)."""
        self._half_end_seconds = 0.0
        self._op_history = TopicCursor(client_config, topics.op, timeout)
        self._watermarks = watermark_client(client_config)
        """Asked for watermarks instead of the group consumer, from whose callbacks they are
        asked too (:func:`~outbox_checker.kafka_reader.watermark_client`). Never polled for
        records, its log lines wait in its queue: the relay serves them when idle."""

    @property
    def half_end_seconds(self) -> float:
        """Seconds spent asking half partitions' ends so far, in all."""
        return self._half_end_seconds

    @property
    def op_history(self) -> TopicCursor:
        """The cursor reading the op partitions' history (restores, decisions below a floor)."""
        return self._op_history

    @property
    def watermark_client(self) -> Any:
        """The client asked for watermarks; its queue holds only log lines and errors."""
        return self._watermarks

    def use_watermark_client(self, client: Any) -> None:
        """Ask ``client`` for watermarks from now on, closing the one before (tests point it
        at a broker that is gone, to see its log lines served)."""
        self._watermarks.close()
        self._watermarks = client

    def op_start(self, partition: int) -> int:
        """The first offset op ``partition`` still holds (its low watermark)."""
        tp = TopicPartition(self._topics.op, partition)
        low, _ = watermarks(self._watermarks, tp, self._timeout)
        return low

    def decisions(self, partition: int, start: int, end: int) -> Iterator[tuple[int, Decision]]:
        """(op offset, decision) of each op record of ``partition`` in [start, end)."""
        offset = start
        while offset < end:
            batch = self._op_history.read(partition, offset, 500)
            if not batch:
                return
            for raw in batch:
                if raw.offset >= end:
                    return
                decision = decode_op(raw)
                if decision is not None:
                    yield raw.offset, decision
            offset = batch[-1].offset + 1

    def history_reader(self, partition: int, wanted: set[int]) -> ReadOps:
        """The slow path for decisions below the memory's floor: read the op history."""

        def read(start: int, end: int) -> Iterator[tuple[int, int]]:
            log.info(
                "op partition %d: %d decisions below the relay's window; reading op history %d..%d",
                partition,
                len(wanted),
                start,
                end,
            )
            for offset, decision in self.decisions(partition, start, end):
                yield offset, decision.identity

        return read

    def ask_half_ends(self, decisions: Sequence[tuple[RawRecord, Decision | None]]) -> None:
        """Learn at once the readable end of each half partition the batch needs past the end
        known, instead of one question at a time in :meth:`half_state`.

        At the tail every batch names halves written since the last one, on most half
        partitions; asked one by one, each a round trip to its leader, they were a fixed
        cost of every batch. One ``ListOffsets`` per leader asks them together. It waits
        :data:`~outbox.reading.LEADER_PATIENCE` at most: a partition it did
        not learn is asked alone as before, where a lost leader is looked up again.
        """
        stale = {
            decision.half_partition
            for raw, decision in decisions
            if decision is not None
            and decision.half_partition == raw.partition
            and decision.identity <= decision.half_offset  # else no stored half: half_state
            and decision.half_offset >= self._half_ends.get(decision.half_partition, 0)
        }
        if len(stale) < 2:
            return
        asked = time.monotonic()
        try:
            self._half_ends.update(
                self._ends.ask(
                    self._topics.half, sorted(stale), IsolationLevel.READ_COMMITTED, LEADER_PATIENCE
                )
            )
        except (KafkaException, KafkaUnavailableError) as exc:
            log.debug("half partitions' ends not asked together: %s", exc)
        finally:
            self._half_end_seconds += time.monotonic() - asked

    def forget_end(self, partition: int) -> None:
        """Ask half ``partition``'s ends afresh before judging a half on it again."""
        self._half_ends.pop(partition, None)
        self._stored_ends.pop(partition, None)

    def half_state(self, decision: Decision) -> HalfState:
        """Whether the op can decide a half that is stored, and whether that half can be read.

        A bogus op (its origin later than the copy it names, or a huge offset) would
        otherwise be the highest identity in the memory's window, never dropped, pinning
        the window's op floor: it is no decision. A half past the last stable offset is
        stored all the same when it lies below the high watermark (a committed read
        cannot see it while a transaction opened before it is open): its decision waits.
        Taking the last stable offset for the end dropped such decisions as bogus. And a
        half past both ends is not taken for bogus on one answer: its decision waits until
        the answers have said so for :data:`PAST_END_PATIENCE_SECONDS` (a stale replica's).
        """
        if decision.identity > decision.half_offset:
            return HalfState.NOT_STORED
        partition = decision.half_partition
        if decision.half_offset < self._half_ends.get(partition, 0):
            return HalfState.READABLE
        half = (partition, decision.half_offset)
        seen = self._past_end.get(half)
        if seen is not None and self._clock() - seen[1] < _PAST_END_ASK_INTERVAL_SECONDS:
            return HalfState.PAST_ANSWERED_END  # asked a moment ago: no request every re-read
        state = self._ask_half_state(partition, decision.half_offset)
        if state is not HalfState.NOT_STORED:
            self._past_end.pop(half, None)
            return state
        now = self._clock()
        since = now if seen is None else seen[0]
        if now - since < PAST_END_PATIENCE_SECONDS:
            self._past_end[half] = (since, now)
            return HalfState.PAST_ANSWERED_END
        self._past_end.pop(half, None)
        return HalfState.NOT_STORED

    def _ask_half_state(self, partition: int, offset: int) -> HalfState:
        """Where ``offset`` stands against half ``partition``'s ends as Kafka answers them now."""
        # Past the end known: ask again (the half came first). The watermark client reads
        # committed, so the end it is told is the partition's last stable offset.
        asked = time.monotonic()
        try:
            tp = TopicPartition(self._topics.half, partition)
            _, self._half_ends[partition] = watermarks(self._watermarks, tp, self._timeout)
            if offset < self._half_ends[partition]:
                return HalfState.READABLE
            if offset >= self._stored_ends.get(partition, 0):
                (self._stored_ends[partition],) = end_offsets(
                    AdminClient(self._client_config),
                    self._topics.half,
                    [partition],
                    IsolationLevel.READ_UNCOMMITTED,
                    self._timeout,
                ).values()
        finally:
            self._half_end_seconds += time.monotonic() - asked
        if offset < self._stored_ends[partition]:
            return HalfState.BEHIND_OPEN_TRANSACTION
        return HalfState.NOT_STORED

    def closers(self) -> tuple[Callable[[], None], ...]:
        """What closes its clients, one by one (a failure of one leaves the others to close)."""
        return (self._op_history.close, lambda: self._watermarks.close())
