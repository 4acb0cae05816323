"""Reading half and op partitions for a round, sequentially, as committed data.

One consumer per topic, moved from partition to partition with ``assign``:
rounds handle one half partition at a time, and a fresh consumer per read
would cost a metadata round trip each time. Reads are ``read_committed`` so a
put-back copy or op in a Kafka transaction that has not committed (or was
aborted, e.g. by a crash) is never acted on. Ends are detected by partition-EOF
events, which for ``read_committed`` come at the last stable offset; whether
that is the whole op partition (no open Kafka transaction) is asked of the
broker with ``ListOffsets`` at both isolation levels.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import suppress
from typing import Any, Generic, Protocol, TypeVar, overload

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from outbox.errors import KafkaUnavailableError
from outbox.protocol import KafkaMessage, RawRecord, TopicNames
from outbox.reading import LEADER_PATIENCE
from outbox_checker.entries import HalfEntry, OpEntry
from outbox_checker.names import reader_group
from outbox_checker.silence import close_in_background, partitions_behind

log = logging.getLogger(__name__)

_BATCH = 500
SETTLE_PAUSE = 0.1
"""Between two looks at whether a partition's open Kafka transactions have ended."""
_SLICE = 0.02
_SHORT_LOOK = 0.1


def reader_config(client_config: dict[str, Any]) -> dict[str, Any]:
    """A consumer of the checker's that reads committed data in no group of its own."""
    return {
        **client_config,
        "group.id": reader_group(),
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
    }


def watermark_client(client_config: dict[str, Any]) -> Consumer:
    """A consumer asked only for :func:`watermarks` (and so metadata), never polled for
    records; its owner polls it now and then all the same, to serve its log lines.

    A group consumer must not be asked them from inside its own callbacks (the relay
    restores an op partition from ``on_assign``): confluent-kafka keeps one call state per
    consumer and thread, ``list_topics`` ends it, and the next callback the same ``poll``
    serves (a log line) finds none and aborts the process. It read ``read_committed``:
    the high watermark it is told is the last stable offset, as the group consumer's was.
    """
    return Consumer(reader_config(client_config))


class Positioned(Protocol):
    """What a :class:`TopicCursor` hands out: something at an offset of its partition."""

    @property
    def offset(self) -> int: ...


Item = TypeVar("Item", bound=Positioned)


class TopicCursor(Generic[Item]):
    """Sequential committed reads of one partition of one topic at a time.

    It hands out :class:`RawRecord` objects, or whatever ``convert`` makes of each
    client message (the rounds' half reader makes :class:`HalfEntry` objects that
    are copied out and decoded only if the round looks past their offset).
    """

    @overload
    def __init__(
        self: TopicCursor[RawRecord],
        client_config: dict[str, Any],
        topic: str,
        timeout: float = 30.0,
        *,
        end_check_seconds: float = 10.0,
    ) -> None: ...

    @overload
    def __init__(
        self,
        client_config: dict[str, Any],
        topic: str,
        timeout: float = 30.0,
        *,
        end_check_seconds: float = 10.0,
        convert: Callable[[KafkaMessage], Item],
    ) -> None: ...

    def __init__(
        self,
        client_config: dict[str, Any],
        topic: str,
        timeout: float = 30.0,
        *,
        end_check_seconds: float = 10.0,
        convert: Callable[[KafkaMessage], Any] = RawRecord.from_kafka,
    ) -> None:
        self._convert = convert
        self._topic = topic
        self._timeout = timeout
        self._end_check_seconds = end_check_seconds
        self._end_checked_at = time.monotonic()
        self._client_config = client_config
        self._consumer = self._new_consumer()
        self._partition: int | None = None
        self._next: int | None = None  # offset the caller's next read continues from
        self._fetched_to: int | None = None  # offset after the last record buffered
        self._buffer: deque[Item] = deque()
        self._at_end = False
        self.replacements = 0
        """Consumers replaced because they went silent: a wedged client, not an outage."""

    def _new_consumer(self) -> Consumer:
        return Consumer(
            {
                **reader_config(self._client_config),
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": 50,
            }
        )

    @property
    def consumer(self) -> Consumer:
        """The consumer reading now: replaced by a fresh one when it goes silent
        (:attr:`replacements`), so hold it no longer than a read."""
        return self._consumer

    def close(self) -> None:
        self._consumer.close()

    def _seek(self, partition: int, offset: int) -> None:
        if self._partition == partition and self._next == offset:
            return
        if self._partition is None:
            self._learn_leaders()
        self._consumer.assign([TopicPartition(self._topic, partition, offset)])
        self._partition, self._next, self._fetched_to = partition, offset, offset
        self._buffer.clear()
        self._at_end = False

    def _learn_leaders(self) -> None:
        """Ask for the topic's metadata before this consumer's first assignment.

        Assigned a partition of a topic it has no metadata for, librdkafka asks for
        it itself, but now and then only after about a second (its refresh back-off):
        a checker's first round waited that long for its first half (0.7 to 1.7 s of
        a 5.5 s bench-checker walk). Best effort: a consumer not told reads on as before.
        """
        with suppress(KafkaException):
            self._consumer.list_topics(self._topic, timeout=min(self._timeout, LEADER_PATIENCE))

    def _replace_consumer(self) -> None:
        """Read on with a fresh consumer from where the silent one stopped.

        A consumer wedged by a broker freeze stays so (:mod:`outbox_checker.silence`);
        a new client with new connections reads on.
        """
        log.warning(
            "reading %s[%s] at %s: no answer, reading on with a fresh consumer",
            self._topic,
            self._partition,
            self._fetched_to,
        )
        old, self._consumer = self._consumer, self._new_consumer()
        self.replacements += 1
        close_in_background(old)
        self._consumer.assign([TopicPartition(self._topic, self._partition, self._fetched_to)])

    def read(self, partition: int, start: int, limit: int) -> list[Item]:
        """Up to ``limit`` records from ``start``; fewer (maybe none) at the end."""
        self._seek(partition, start)
        records: list[Item] = []
        buffer = self._buffer
        while len(records) < limit:
            if not buffer and not self._fetch():
                break
            wanted = limit - len(records)
            if len(buffer) <= wanted:  # the usual case: all that arrived, at once
                records.extend(buffer)
                buffer.clear()
            else:
                records.extend(buffer.popleft() for _ in range(wanted))
        if records:
            self._next = records[-1].offset + 1
        return records

    def _fetch(self) -> bool:
        """Fill the buffer; False once the partition's committed end is reached.

        Past an end-of-partition event a short look suffices (the end moves
        while producers write); now and then the broker is asked whether the
        partition really ends where this consumer stands. Before one, silence
        means Kafka is not answering, or this consumer is wedged: a third of
        the way into the wait it is replaced once, and only silence from the
        fresh one too is reported as an outage.
        """
        was_at_end, self._at_end = self._at_end, False
        patience = _SHORT_LOOK if was_at_end else self._timeout
        started = time.monotonic()
        replace_at = None if was_at_end else started + patience / 3
        while True:
            try:
                messages = self._arrived()
            except KafkaException as exc:
                raise KafkaUnavailableError(f"reading {self._topic}: {exc}") from None
            buffer, convert = self._buffer, self._convert
            for message in messages:
                error = message.error()
                if error is None:
                    buffer.append(convert(message))
                elif error.code() == KafkaError._PARTITION_EOF:
                    self._at_end = True
                else:
                    self._note_fetched()
                    raise KafkaUnavailableError(f"reading {self._topic}: {error}")
            if buffer:
                self._note_fetched()
                return True
            if self._at_end:
                return False
            now = time.monotonic()
            if replace_at is not None and now >= replace_at:
                replace_at = None
                self._replace_consumer()
            if now - started >= patience:
                break
        if was_at_end:
            if self._end_is_behind():
                self._replace_consumer()
                return self._fetch()  # with the patience of a read that expects data
            self._at_end = True
            return False
        raise KafkaUnavailableError(
            f"reading {self._topic}[{self._partition}] returned nothing in {patience:g}s"
        )

    def _note_fetched(self) -> None:
        if self._buffer:
            self._fetched_to = self._buffer[-1].offset + 1

    def _arrived(self) -> list[Any]:
        """What the consumer holds now, else the first thing to arrive within a short slice.

        ``consume(n, timeout)`` waits for ``n`` messages or its whole timeout, so a
        read at the tail of a partition (the relay's halves, written milliseconds
        before the decisions naming them) would wait the slice out every time.
        """
        messages = self._consumer.consume(_BATCH, timeout=0)
        if messages:
            return messages
        first = self._consumer.poll(_SLICE)
        if first is None:
            return []
        return [first, *self._consumer.consume(_BATCH - 1, timeout=0)]

    def _end_is_behind(self) -> bool:
        """At most every ``end_check_seconds``: does the partition go on past this consumer?

        A wedged consumer at the end hears of no new records, so it would
        answer "at the end" for ever.
        """
        now = time.monotonic()
        if now - self._end_checked_at < self._end_check_seconds:
            return False
        self._end_checked_at = now
        try:
            return bool(partitions_behind(self._consumer, min(self._timeout, 5.0)))
        except KafkaException:
            return True  # it cannot even ask: a fresh consumer will tell


def half_cursor(
    client_config: dict[str, Any], topic: str, timeout: float = 30.0
) -> TopicCursor[HalfEntry]:
    """A cursor of half partitions for :class:`KafkaPartitionReader`: entries decoded lazily."""
    return TopicCursor(client_config, topic, timeout, convert=HalfEntry.of_message)


class KafkaPartitionReader:
    """The :class:`outbox_checker.rules.PartitionReader` of half partition p and op partition p."""

    def __init__(
        self,
        halves: TopicCursor[HalfEntry],
        ops: TopicCursor[RawRecord],
        partition: int,
        client_config: dict[str, Any],
        topics: TopicNames,
        timeout: float = 30.0,
    ) -> None:
        self._halves = halves
        self._ops = ops
        self._partition = partition
        self._client_config = client_config
        self._admin: AdminClient | None = None
        self._topics = topics
        self._timeout = timeout

    def ops(self, start: int, limit: int) -> list[OpEntry]:
        return [OpEntry.of(raw) for raw in self._ops.read(self._partition, start, limit)]

    def halves(self, start: int) -> Iterator[HalfEntry]:
        offset = start
        while True:
            batch = self._halves.read(self._partition, offset, _BATCH)
            if not batch:
                return
            yield from batch
            offset = batch[-1].offset + 1

    def settled_halves(self, start: int, pause: float = SETTLE_PAUSE) -> Iterator[HalfEntry]:
        """:meth:`halves` from ``start``, once every Kafka transaction open on the half
        partition now has ended: a ``read_committed`` read stops at the first open one, so
        without the wait a half another writer's transaction holds would look unwritten.

        Raises :class:`KafkaUnavailableError` if one is still open after the timeout."""
        stored = self.half_end()
        deadline = time.monotonic() + self._timeout
        while self._end_offset(self._topics.half, IsolationLevel.READ_COMMITTED) < stored:
            if time.monotonic() > deadline:
                raise KafkaUnavailableError(
                    f"a Kafka transaction open on {self._topics.half}[{self._partition}] did"
                    f" not end within {self._timeout:g}s"
                )
            time.sleep(pause)
        return self.halves(start)

    def ops_settled(self) -> bool:
        """The op partition's last stable offset is its high watermark."""
        stable = self._end_offset(self._topics.op, IsolationLevel.READ_COMMITTED)
        return stable >= self._end_offset(self._topics.op, IsolationLevel.READ_UNCOMMITTED)

    def half_end(self) -> int:
        return self._end_offset(self._topics.half, IsolationLevel.READ_UNCOMMITTED)

    def _end_offset(self, topic: str, isolation: IsolationLevel) -> int:
        """``ListOffsets`` through an admin client of this round's own.

        A long-lived admin client keeps a leader epoch from before a broker
        restart and is answered FENCED_LEADER_EPOCH ever after (seen with
        librdkafka 2.x); one per reader starts from fresh metadata each round.
        """
        if self._admin is None:
            self._admin = AdminClient(self._client_config)
        ends = end_offsets(self._admin, topic, [self._partition], isolation, self._timeout)
        return ends[self._partition]


def end_offsets(
    admin: AdminClient,
    topic: str,
    partitions: list[int],
    isolation: IsolationLevel,
    timeout: float,
) -> dict[int, int]:
    """``ListOffsets`` of ``partitions``: the last stable offset for ``READ_COMMITTED``.

    Raises :class:`KafkaUnavailableError` unless every partition's end was answered
    within ``timeout`` (plus :data:`END_OFFSETS_MARGIN_SECONDS`).
    """
    specs = {TopicPartition(topic, p): OffsetSpec.latest() for p in partitions}
    futures = admin.list_offsets(specs, isolation_level=isolation, request_timeout=timeout)
    deadline = time.monotonic() + timeout + END_OFFSETS_MARGIN_SECONDS
    ends = {}
    for tp, future in futures.items():
        where = f"{topic}[{tp.partition}]"
        try:
            offset = int(future.result(max(0.0, deadline - time.monotonic())).offset)
        except KafkaException as exc:
            raise KafkaUnavailableError(f"end offset of {where}: {exc}") from None
        except concurrent.futures.TimeoutError:
            waited = timeout + END_OFFSETS_MARGIN_SECONDS
            raise KafkaUnavailableError(
                f"end offset of {where}: no answer within {waited:.0f}s"
            ) from None
        if offset < 0:
            # librdkafka answers a request that timed out with OFFSET_INVALID (-1001), not
            # an error: taken for an end, it would say every transaction had ended.
            raise KafkaUnavailableError(
                f"end offset of {where}: no answer within {timeout:g}s (offset {offset})"
            )
        ends[tp.partition] = offset
    return ends


END_OFFSETS_MARGIN_SECONDS = 3.0
"""How long past its request timeout :func:`end_offsets` still waits for the admin client's
answer. The request timeout does not bound the wait: librdkafka's ``list_offsets`` once left
its future unanswered with a node killed under a three-node cluster, and the relay, waiting
on it, published nothing for over 35 s."""


class EndOffsetClient:
    """``ListOffsets`` through one admin client kept between questions, replaced after a
    question it could not answer.

    An admin client sends ``ListOffsets`` to the leader in its metadata and does not look
    again when that leader dies: after a ``kill -9`` of a partition's leader, one kept
    client was answered "-1001" (no answer) for 60 s, though the controller had elected a
    new leader within 6 s; a fresh client answers at once (tests/checker/
    test_leader_failover.py). A client per question would pay a connection each time, so
    the client is kept while it answers and replaced when it does not.
    """

    def __init__(self, client_config: dict[str, Any]) -> None:
        self._client_config = client_config
        self._admin = AdminClient(client_config)

    def ask(
        self, topic: str, partitions: list[int], isolation: IsolationLevel, timeout: float
    ) -> dict[int, int]:
        """:func:`end_offsets` of ``partitions``; the next question goes through a fresh
        client if this one raised :class:`KafkaUnavailableError`."""
        try:
            return end_offsets(self._admin, topic, partitions, isolation, timeout)
        except KafkaUnavailableError:
            self._admin = AdminClient(self._client_config)
            raise
