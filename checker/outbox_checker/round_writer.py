"""Writing a round's decisions: copies, check requests, discards and the checkpoint, atomically.

Each chunk of a round is one Kafka transaction: the put-back copies, the check
requests naming those copies, the discard records, and the new half checkpoint
(the committed offset of the checker's consumer group, with the op checkpoint
in its metadata: :func:`outbox_checker.names.encode_checkpoint`) become visible
together or not at all. A crash mid-chunk therefore neither duplicates a copy nor
skips a half, and a replica that lost its partition in a rebalance is fenced by the
group metadata (KIP-447).

The commit (``commit_transaction``: the check requests' acknowledgements, then
the broker ending the transaction) is left to the chunk's thread while the round
reads and decides the next chunk; the round settles it before writing another
(:class:`PendingChunk`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from outbox.errors import KafkaUnavailableError
from outbox.protocol import (
    CheckRequest,
    DiscardReason,
    DiscardRecord,
    HalfRecord,
    OpRecord,
    OutgoingRecord,
    Resolution,
    TopicNames,
)
from outbox.protocol.sizes import record_size, records_a_half_becomes
from outbox.size_limits import GROWTH_BYTES, SizeLimits
from outbox.topic_catalog import TopicCatalog
from outbox_checker.entries import HalfEntry
from outbox_checker.errors import FencedError
from outbox_checker.names import encode_checkpoint
from outbox_checker.rules import Discard, RoundChunk
from outbox_checker.transactional import remember_offset, transactional_config

log = logging.getLogger(__name__)

_ATTEMPT_SECONDS = 5.0
"""One attempt to start the transactional producer: between attempts, a stop is heard."""

OFFSETS_DEADLINE_SECONDS = 5.0
"""A chunk still in ``send_offsets_to_transaction`` this long is abandoned and its producer
fenced. The call is two round trips (milliseconds), but librdkafka 2.x can block in it far
past its timeout when its group coordinator went away (confluentinc/librdkafka#5456, the
relay's ``transaction_deadline`` for the same hang): caught by a broker restart, a chunk sat
in it 80 s, until the watchdog's three client timeouts ran out. The chunk sends its offsets
before it writes any record, so a chunk waiting here holds no half partition's last stable
offset (the relay publishes on behind it); the deadline bounds how long its round waits."""

_WATCH_SECONDS = 0.1
"""How often the watchdog looks at a chunk that has not reached its commit yet."""

_FRESH_SECONDS = 10.0
"""A producer started this recently, and unused since, serves a round as it is
(:meth:`RoundWriter.renew_for_round`)."""


@dataclass
class ChunkResult:
    checks_sent: int = 0
    put_backs: int = 0
    discards: dict[str, int] = field(default_factory=dict)
    drained: list[tuple[str, int]] = field(default_factory=list)
    """(transaction id, offset) of each parked half written, with its COMMIT op."""


class RoundWriter:
    """The checker's transactional producer."""

    def __init__(
        self,
        client_config: dict[str, Any],
        transactional_id: str,
        topics: TopicNames,
        catalog: TopicCatalog,
        *,
        timeout: float = 30.0,
        transaction_timeout_ms: int = 60_000,
        stopping: threading.Event | None = None,
        producer_factory: Callable[[dict[str, Any]], Producer] = Producer,
    ) -> None:
        """``stopping``: once set, starting a producer is given up at once, so a checker told
        to stop while Kafka is away exits within seconds rather than three timeouts.
        ``producer_factory`` makes the transactional producer from its configuration; the
        protocol model (tests/model) passes one over its in-memory partitions."""
        self._topics = topics
        self._producer_factory = producer_factory
        self._timeout = timeout
        self._stopping = stopping or threading.Event()
        self._config = transactional_config(
            client_config,
            transactional_id,
            linger_ms=5,
            transaction_timeout_ms=transaction_timeout_ms,
        )
        self._limits = SizeLimits(catalog, self._config)
        self._producer_lock = threading.RLock()
        """Held while the current producer is replaced or recovered, and to ask which it is."""
        self._fresh_until = 0.0
        """Until when the current producer, started and not used since, needs no renewal."""
        self._renew_at_write = False
        """A round began (:meth:`renew_for_round`) and has not written yet."""
        self._producer = self._new_producer()

    def _new_producer(self) -> Producer:
        """A producer of this replica's transactional id, initialised.

        Its ``init_transactions`` fences any earlier producer of the id and aborts
        that one's open transaction; while the broker is still aborting it, it
        answers CONCURRENT_TRANSACTIONS (retriable), so this asks again until
        three timeouts have passed.
        """
        deadline = time.monotonic() + self._timeout * 3
        while True:
            producer = self._producer_factory(self._config)
            try:
                producer.init_transactions(min(self._timeout, _ATTEMPT_SECONDS))
                self._fresh_until = time.monotonic() + _FRESH_SECONDS
                return producer
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if self._stopping.is_set():
                    raise KafkaUnavailableError(
                        f"stopping before the checker's producer could start: {error.str()}"
                    ) from None
                if not error.retriable() or time.monotonic() > deadline:
                    raise KafkaUnavailableError(
                        f"cannot start the checker's transactional producer: {error.str()}"
                    ) from None
                log.info("the checker's producer is not ready yet, asking again: %s", error)
                self._stopping.wait(0.2)

    def renew(self) -> None:
        """Start over with a fresh producer (the checker does so every round).

        A librdkafka transactional producer that lived through a broker restart
        can block in ``send_offsets_to_transaction`` past its timeout; a fresh
        one does not, and its ``init_transactions`` fences the old one.
        """
        with self._producer_lock:
            self._producer = self._new_producer()

    def renew_for_round(self) -> None:
        """:meth:`renew` before the round's first write, unless the producer was started
        moments ago and has written nothing.

        A checker's first round follows its start by a group join: the producer it
        started then (which fenced any earlier one of its id) is as fresh as a new
        one, and starting another costs up to half a second (librdkafka looks for
        the transaction coordinator again, after a back-off when no connection is up
        yet), a tenth of a 100 000-half walk. A round that writes nothing (an idle
        partition's early round, one per transaction timeout) starts none.
        """
        with self._producer_lock:
            self._renew_at_write = True

    def close(self) -> None:
        self._producer.flush(self._timeout)

    def write(
        self,
        chunk: RoundChunk,
        group_metadata: Any,
        now_ms: Callable[[], int],
        answer: Callable[[HalfRecord, int, int], list[OutgoingRecord]] | None = None,
    ) -> ChunkResult:
        """Write one chunk in one Kafka transaction; raise on failure (nothing visible)."""
        return self.start(chunk, group_metadata, now_ms, answer).result()

    def start(
        self,
        chunk: RoundChunk,
        group_metadata: Any,
        now_ms: Callable[[], int],
        answer: Callable[[HalfRecord, int, int], list[OutgoingRecord]] | None = None,
    ) -> PendingChunk:
        """Write one chunk in one Kafka transaction, returning once only the commit is left.

        The records are produced, the checkpoint's offsets sent and the copies'
        offsets awaited before this returns; the commit (the check requests'
        acknowledgements and the broker ending the transaction, during which the
        client holds no Python lock) goes on in the background while the caller
        reads and decides the next chunk. The caller
        must settle the returned chunk (:meth:`PendingChunk.result`) before it
        starts another: a transaction is begun only once the previous one is over.

        Runs under a watchdog: a call stuck past every timeout (in the client,
        or in ``answer``) is abandoned, and the fresh producer that replaces it
        fences it, so it can never commit late. The abandoned call keeps its own
        producer: when it fails at last, its recovery touches only that one,
        never the producer of a chunk written since.
        """
        with self._producer_lock:
            if self._renew_at_write:
                self._renew_at_write = False
                if time.monotonic() >= self._fresh_until:
                    self._producer = self._new_producer()
            producer = self._producer
            self._fresh_until = 0.0
        abandoned = threading.Event()
        progress = _Progress()
        outcome: list[ChunkResult | BaseException] = []

        def attempt() -> None:
            try:
                outcome.append(
                    self._write(
                        producer, abandoned, progress, chunk, group_metadata, now_ms, answer
                    )
                )
            except BaseException as exc:
                outcome.append(exc)
            finally:
                progress.committing.set()

        deadline = time.monotonic() + self._timeout * 3
        worker = threading.Thread(target=attempt, name="checker-chunk-writer", daemon=True)
        worker.start()
        while not progress.committing.wait(_WATCH_SECONDS) and time.monotonic() < deadline:
            since = progress.sending_offsets_since
            if since is not None and time.monotonic() - since > OFFSETS_DEADLINE_SECONDS:
                log.error(
                    "a chunk is stuck in send_offsets_to_transaction (over %.0fs)",
                    OFFSETS_DEADLINE_SECONDS,
                )
                deadline = time.monotonic()
                break
        return PendingChunk(self, worker, outcome, abandoned, deadline)

    def _write(
        self,
        producer: Producer,
        abandoned: threading.Event,
        progress: _Progress,
        chunk: RoundChunk,
        group_metadata: Any,
        now_ms: Callable[[], int],
        answer: Callable[[HalfRecord, int, int], list[OutgoingRecord]] | None = None,
    ) -> ChunkResult:
        """The chunk's Kafka transaction.

        ``answer``, when given, resolves a due half itself (the checker's
        resolve-from-database mode) and returns the records that end it, or
        an empty list to fall back to asking the producers. ``progress`` tells the
        watchdog when the offsets are being sent and when every record is produced
        (only the broker's part is left).
        """
        result = ChunkResult()
        to_check, to_requeue, to_discard = self._screen(chunk)
        try:
            producer.begin_transaction()
            checkpoint = TopicPartition(
                self._topics.half,
                chunk.partition,
                chunk.half_checkpoint,
                metadata=encode_checkpoint(chunk.op_checkpoint),
            )
            # The offsets before any record: librdkafka can wait in this call on a group
            # coordinator it lost, past its timeout, until the watchdog abandons the chunk;
            # a copy already written would hold the half partition's last stable offset
            # all that time, and the relay (reading committed) publish nothing behind it.
            # It is also why a zombie is fenced: a chunk holds records only once the group
            # coordinator took its offsets under a generation still current. A replica
            # frozen before that is refused them when it resumes (stale generation) and
            # aborts; one frozen after it keeps the partition's offsets unstable, and the
            # new owner's checkpoint load (OffsetFetch of a read_committed consumer, KIP-447)
            # waits until this transaction ends before it reads or writes the partition
            # (the parked drain in outbox_checker.rounds waits so too).
            progress.sending_offsets_since = time.monotonic()
            producer.send_offsets_to_transaction([checkpoint], group_metadata, self._timeout)
            progress.sending_offsets_since = None
            copies: list[tuple[HalfRecord, list[int]]] = []
            for entry in to_check:
                assert entry.half is not None
                copy = entry.half.put_back(entry.offset, entry.stored_ms)
                offset: list[int] = []
                producer.produce(
                    **copy.to_record(self._topics, chunk.partition).produce_kwargs(),
                    on_delivery=remember_offset(offset),
                )
                copies.append((copy, offset))
            for entry in to_requeue:
                assert entry.half is not None
                moved = entry.half.requeued(entry.offset, entry.stored_ms)
                producer.produce(**moved.to_record(self._topics, chunk.partition).produce_kwargs())
            for discard in to_discard:
                record = DiscardRecord.of_half(
                    discard.entry.raw, discard.reason, now_ms(), discard.detail
                ).to_record(self._topics)
                problem = self._limits.problem("discard record", record)
                if problem is not None:
                    log.error(
                        "half %d:%d (transaction %s) cannot be kept on %s either (%s);"
                        " passing it, it stays on %s until retention",
                        chunk.partition,
                        discard.entry.offset,
                        discard.entry.half.transaction_id if discard.entry.half else "?",
                        self._topics.discard,
                        problem,
                        self._topics.half,
                    )
                    continue
                producer.produce(**record.produce_kwargs())
                result.discards[discard.reason.value] = (
                    result.discards.get(discard.reason.value, 0) + 1
                )
            drained: list[tuple[HalfRecord, list[int]]] = []
            for parked in chunk.to_drain:
                offset = []
                producer.produce(
                    **parked.to_record(self._topics, chunk.partition).produce_kwargs(),
                    on_delivery=remember_offset(offset),
                )
                drained.append((parked, offset))
            result.put_backs = len(copies) + len(to_requeue)
            if drained:
                self._decide_drained(producer, chunk.partition, drained, now_ms(), result)
            if copies:
                if producer.flush(self._timeout) > 0:
                    raise KafkaException(
                        KafkaError(KafkaError._TIMED_OUT, "put-back copies not acknowledged")
                    )
                requested = now_ms()
                for copy, offset in copies:
                    if not offset:
                        raise KafkaException(
                            KafkaError(
                                KafkaError._FAIL, "a put-back copy was not stored at a known offset"
                            )
                        )
                    ended = answer(copy, chunk.partition, offset[0]) if answer else []
                    records = ended or [
                        CheckRequest(copy, chunk.partition, offset[0], requested).to_record(
                            self._topics
                        )
                    ]
                    for record in records:
                        producer.produce(**record.produce_kwargs())
                    result.checks_sent += 0 if ended else 1
            progress.committing.set()
            producer.commit_transaction(self._timeout)
            return result
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            self._recover(producer, abandoned, error)
            if error.code() in (KafkaError.FENCED_INSTANCE_ID, KafkaError._FENCED) or (
                "fenced" in str(error).lower() or error.code() == KafkaError.ILLEGAL_GENERATION
            ):
                raise FencedError(str(error)) from None
            raise

    def _decide_drained(
        self,
        producer: Producer,
        partition: int,
        drained: list[tuple[HalfRecord, list[int]]],
        ended_ms: int,
        result: ChunkResult,
    ) -> None:
        """A COMMIT op for each parked half written in this transaction: the relay publishes
        it as any committed half, and it is never checked (its op is there as soon as it is)."""
        if producer.flush(self._timeout) > 0:
            raise KafkaException(
                KafkaError(KafkaError._TIMED_OUT, "parked halves not acknowledged")
            )
        for half, offset in drained:
            if not offset:
                raise KafkaException(
                    KafkaError(KafkaError._FAIL, "a parked half was not stored at a known offset")
                )
            op = OpRecord(
                half.transaction_id,
                half.producer_group,
                partition,
                offset[0],
                Resolution.COMMIT,
                ended_ms,
                origin_offset=offset[0],
            )
            producer.produce(**op.to_record(self._topics).produce_kwargs())
            result.drained.append((half.transaction_id, offset[0]))

    def _screen(self, chunk: RoundChunk) -> tuple[list[HalfEntry], list[HalfEntry], list[Discard]]:
        """The chunk's halves to check and to requeue, less those whose copies cannot be written.

        A half whose put-back copy or check request is over a size limit (a
        producer with other limits wrote it, or a topic's limit was lowered)
        would fail every round and stop its partition; it is discarded instead.
        """
        to_check: list[HalfEntry] = []
        to_requeue: list[HalfEntry] = []
        to_discard = list(chunk.to_discard)
        for entries, kept, requeued in (
            (chunk.to_check, to_check, False),
            (chunk.to_requeue, to_requeue, True),
        ):
            for entry in entries:
                problem = self._oversize(entry, chunk.partition, requeued)
                if problem is None:
                    kept.append(entry)
                else:
                    log.error("half %d:%d is discarded: %s", chunk.partition, entry.offset, problem)
                    to_discard.append(Discard(entry, DiscardReason.OVERSIZE, problem))
        return to_check, to_requeue, to_discard

    def _oversize(self, entry: HalfEntry, partition: int, requeued: bool) -> str | None:
        assert entry.half is not None
        written_to = (
            (self._topics.half,)
            if requeued
            else (self._topics.half, self._topics.check(entry.half.producer_group))
        )
        if record_size(entry.raw) + GROWTH_BYTES <= self._limits.smallest(written_to):
            return None  # the usual case: far from every limit, no record need be built
        if requeued:
            moved = entry.half.requeued(entry.offset, entry.stored_ms)
            return self._limits.problem("moved copy", moved.to_record(self._topics, partition))
        for what, record in records_a_half_becomes(entry.half, self._topics, partition):
            if what in ("put-back copy", "check request"):
                problem = self._limits.problem(what, record)
                if problem is not None:
                    return problem
        return None

    def _recover(self, producer: Producer, abandoned: threading.Event, error: KafkaError) -> None:
        """Make ``producer`` usable again after a failed chunk, if it is still the current one.

        An abandoned attempt's producer was replaced (and fenced) already:
        renewing or aborting now would hit the chunk being written since.
        """
        with self._producer_lock:
            if abandoned.is_set() or producer is not self._producer:
                log.info("an abandoned chunk failed (its producer was fenced): %s", error)
                return
            try:
                if error.fatal():
                    self.renew()
                else:
                    producer.abort_transaction(self._timeout)
            except KafkaException as exc:
                log.error("could not abort the checker's transaction: %s", exc)
                self.renew()


@dataclass
class _Progress:
    """How far a chunk's attempt has got, for the watchdog in :meth:`RoundWriter.start`."""

    committing: threading.Event = field(default_factory=threading.Event)
    """Every record produced: only the broker's part (the commit) is left."""
    sending_offsets_since: float | None = None
    """When the attempt entered ``send_offsets_to_transaction``, while it is in it."""


class PendingChunk:
    """A chunk whose records are produced and whose commit may still be under way."""

    def __init__(
        self,
        writer: RoundWriter,
        worker: threading.Thread,
        outcome: list[ChunkResult | BaseException],
        abandoned: threading.Event,
        deadline: float,
    ) -> None:
        self._writer = writer
        self._worker = worker
        self._outcome = outcome
        self._abandoned = abandoned
        self._deadline = deadline

    def result(self) -> ChunkResult:
        """Wait for the commit; the chunk's counts, or its failure (then nothing is visible).

        Past the watchdog's deadline the chunk is abandoned and its producer fenced.
        """
        self._worker.join(max(0.0, self._deadline - time.monotonic()))
        if not self._outcome:
            log.error("writing a chunk is stuck; abandoning it and fencing its producer")
            self._abandoned.set()
            self._writer.renew()
            raise KafkaUnavailableError("writing a chunk got stuck; it was abandoned and fenced")
        if isinstance(self._outcome[0], BaseException):
            raise self._outcome[0]
        return self._outcome[0]
