"""The rounds of one replica over the half partitions it owns, and the parked sends it drains.

A round walks each owned half partition from its checkpoint:
:func:`~outbox_checker.rules.iter_round` decides chunk by chunk, and the
:class:`~outbox_checker.round_writer.RoundWriter` writes each chunk in one Kafka
transaction with its checkpoint, while the next chunk is read and decided. The
checkpoint each chunk committed is remembered while the partition stays here
(:class:`~outbox_checker.ownership.HalfOwnership`), and loaded from Kafka after an
assignment or a fence (:class:`~outbox_checker.checkpoints.CheckpointLoader`).

The replica (:class:`outbox_checker.service.Checker`) says when: it keeps the group
served between the chunks (``serve_group``), schedules the rounds and runs the relay
beside them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from outbox.protocol import HalfRecord, OutgoingRecord
from outbox.topic_catalog import TopicCatalog
from outbox_checker import metrics
from outbox_checker.check_topics import CheckTopics
from outbox_checker.checkpoints import Checkpoint, CheckpointLoader
from outbox_checker.ended import EndedTransactions
from outbox_checker.entries import HalfEntry
from outbox_checker.errors import FencedError
from outbox_checker.kafka_reader import KafkaPartitionReader, TopicCursor, half_cursor
from outbox_checker.names import round_transactional_id
from outbox_checker.ownership import HalfOwnership
from outbox_checker.parked import DrainReport, ParkedDrain
from outbox_checker.round_writer import PendingChunk, RoundWriter
from outbox_checker.rules import RoundChunk, RoundRules, iter_round
from outbox_checker.settings import CheckerSettings

log = logging.getLogger("outbox_checker.service")  # the rounds' logger, as before their module

Resolver = Callable[[HalfRecord, int, int], list[OutgoingRecord]]
"""Resolves a due half itself (``resolve_from_db``): the records that end it, or none."""

ProducerFactory = Callable[[dict[str, Any]], Producer]
"""Makes a transactional producer from its librdkafka configuration."""


@dataclass
class PartitionReport:
    partition: int
    checks_sent: int = 0
    put_backs: int = 0
    discards: int = 0
    skipped_ended: int = 0
    stop_reason: str = ""
    half_checkpoint: int = 0
    op_checkpoint: int = 0
    due_again_ms: int | None = None
    """When a round could go past this partition's stop before the interval is up."""


@dataclass
class RoundReport:
    partitions: list[PartitionReport] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def checks_sent(self) -> int:
        return sum(p.checks_sent for p in self.partitions)


class Rounds:
    """Rounds over the half partitions ``ownership`` owns: :meth:`run` one pass,
    :meth:`drain_parked` between passes; both in the replica's loop thread."""

    def __init__(
        self,
        settings: CheckerSettings,
        ownership: HalfOwnership,
        admin: AdminClient,
        instance: str,
        clock: Callable[[], float],
        *,
        serve_group: Callable[[], None],
        stopping: threading.Event,
        drain: ParkedDrain | None = None,
        resolver: Resolver | None = None,
        rules: RoundRules | None = None,
        producer_factory: ProducerFactory = Producer,
        writer_timeout: float = 30.0,
    ) -> None:
        """``instance`` names the round writer's transactional id, ``clock`` is the replica's
        wall clock (halves' ages, the drained halves' times); ``serve_group`` polls the
        group between chunks (and raises what ends the replica); ``stopping``, once set,
        ends a round after the partition under way. ``rules``: default
        :meth:`RoundRules.from_settings`; ``producer_factory`` and ``writer_timeout`` are the
        :class:`RoundWriter`'s (its producer, and each of its calls' timeout)."""
        self._settings = settings
        self._topics = topics = settings.topics
        self._ownership = ownership
        self._clock = clock
        self._serve_group = serve_group
        self._stopping = stopping
        self._resolver = resolver
        self._drain = drain
        self._rules = rules or RoundRules.from_settings(settings)
        self._ended = EndedTransactions(settings.ended_cache_size)
        client = settings.client_config()
        self._check_topics = CheckTopics(admin, topics)
        self._halves = half_cursor(client, topics.half)
        self._ops = TopicCursor(client, topics.op)
        self._checkpoints = CheckpointLoader(
            lambda: ownership.consumer,
            topics,
            self._halves,
            self._reader,
            self._ended,
            settings.op_history_margin_seconds,
        )
        self._writer = RoundWriter(
            client,
            round_transactional_id(settings.group_id, instance),
            topics,
            TopicCatalog(admin, 30.0, settings.principal),
            timeout=writer_timeout,
            transaction_timeout_ms=settings.kafka_transaction_timeout_ms,
            stopping=stopping,
            producer_factory=producer_factory,
        )

    @property
    def writer(self) -> RoundWriter:
        """The round writer: its transactional producer writes every chunk and parked drain
        (:meth:`RoundWriter.renew` starts a fresh one, fencing the last)."""
        return self._writer

    def closers(self) -> list[Callable[[], None]]:
        """What closes the rounds' clients: the writer (flushed) and the cursors."""
        return [self._writer.close, self._halves.close, self._ops.close]

    def run(self, *, early: bool = False) -> RoundReport:
        """One pass over every owned half partition.

        ``early``: run before the check interval is up, for halves never asked about;
        put-back copies keep the interval's cadence (:attr:`RoundRules.recheck_after_ms`).
        """
        started = time.monotonic()
        report = RoundReport()
        rules = self._rules
        if early:
            rules = replace(
                rules, recheck_after_ms=int(self._settings.check_interval_seconds * 1000)
            )
        self._writer.renew_for_round()
        for partition in self._ownership.partitions():
            if self._stopping.is_set() and report.partitions:
                break
            report.partitions.append(self._round_on(partition, rules))
            self._serve_group()
        if not report.partitions:
            # Every partition revoked (a session lost in an outage's back-off): this was no
            # round, and the next one stays due, as soon as the group gives some back.
            return report
        report.seconds = time.monotonic() - started
        metrics.ROUND_SECONDS.observe(report.seconds)
        return report

    def _round_on(self, partition: int, rules: RoundRules) -> PartitionReport:
        checkpoint = self._checkpoint(partition)
        reader = self._reader(partition)
        report = PartitionReport(
            partition, half_checkpoint=checkpoint.half, op_checkpoint=checkpoint.op
        )
        half_end = self._checkpoints.end_offset(self._topics.half, partition)
        if half_end is not None:  # before the reading, so a failing round still shows growth
            metrics.CHECKPOINT_LAG.labels(str(partition)).set(max(0, half_end - checkpoint.half))
        chunks = iter_round(
            reader,
            partition=partition,
            half_checkpoint=checkpoint.half,
            op_checkpoint=checkpoint.op,
            ended=self._ended,
            rules=rules,
            now_ms=self._now_ms,
            half_end=half_end,
        )
        # A chunk is written while the next one is read and decided: its commit (the
        # broker's part) is settled before the next chunk is written, and before the
        # round ends however it ends, so the checkpoint remembered is the one committed.
        pending: tuple[RoundChunk, PendingChunk] | None = None
        try:
            for chunk in chunks:
                if pending is not None:
                    due, pending = pending, None  # settled once, whatever it raises
                    settled = self._settle(partition, report, *due)
                    if settled is None:
                        break
                    checkpoint = settled
                if partition not in self._ownership.partitions():
                    log.info(
                        "partition %d revoked mid-round; leaving it to its new owner", partition
                    )
                    break
                self._check_topics.ensure({e.half.producer_group for e in chunk.to_check if e.half})
                if chunk.decisions or (chunk.half_checkpoint, chunk.op_checkpoint) != (
                    checkpoint.half,
                    checkpoint.op,
                ):
                    written = self._writer.start(
                        chunk, self._ownership.group_metadata(), self._now_ms, self._resolver
                    )
                    pending = chunk, written
                else:
                    self._count_chunk(partition, report, chunk)
            if pending is not None:
                due, pending = pending, None
                checkpoint = self._settle(partition, report, *due) or checkpoint
        finally:
            if pending is not None:  # reading the next chunk failed while this one committed
                try:
                    self._settle(partition, report, *pending)
                except Exception as exc:  # the reading's failure is the one raised
                    log.info("the chunk written when the round failed failed too: %s", exc)
        report.half_checkpoint, report.op_checkpoint = checkpoint.half, checkpoint.op
        if half_end is not None:
            metrics.CHECKPOINT_LAG.labels(str(partition)).set(max(0, half_end - checkpoint.half))
        busy = report.checks_sent or report.put_backs or report.discards or report.skipped_ended
        log.log(
            logging.INFO if busy else logging.DEBUG,
            "round on partition %d: checks=%d put_backs=%d discards=%d skipped=%d stop=%s",
            partition,
            report.checks_sent,
            report.put_backs,
            report.discards,
            report.skipped_ended,
            report.stop_reason,
        )
        return report

    def _settle(
        self, partition: int, report: PartitionReport, chunk: RoundChunk, pending: PendingChunk
    ) -> Checkpoint | None:
        """Wait for a written chunk's commit and count it: its checkpoint, or None if fenced.

        A failure other than a fence (Kafka unavailable, a stuck chunk) is raised:
        the round is interrupted and retried from the committed checkpoint.
        """
        try:
            written = pending.result()
        except FencedError as exc:
            # Ownership changes only through the rebalance callbacks: the
            # assignor may well keep this partition here. Forget the cached
            # checkpoint (the next round reloads what Kafka committed) and
            # serve the group so a pending rebalance completes.
            log.warning("fenced on partition %d, retrying next round: %s", partition, exc)
            self._ownership.remember(partition, None)
            self._serve_group()
            return None
        report.checks_sent += written.checks_sent
        report.put_backs += written.put_backs
        report.discards += sum(written.discards.values())
        metrics.CHECKS_SENT.inc(written.checks_sent)
        metrics.PUT_BACKS.inc(written.put_backs)
        for reason, count in written.discards.items():
            metrics.DISCARDS.labels(reason).inc(count)
        checkpoint = Checkpoint(chunk.half_checkpoint, chunk.op_checkpoint)
        self._ownership.remember(partition, checkpoint)
        self._count_chunk(partition, report, chunk)
        return checkpoint

    def _count_chunk(self, partition: int, report: PartitionReport, chunk: RoundChunk) -> None:
        """What a chunk settled (written, or with nothing to write) adds to the report."""
        report.skipped_ended += chunk.skipped_ended
        if chunk.stop_reason is not None:
            report.stop_reason = chunk.stop_reason.value
            report.due_again_ms = chunk.due_again_ms
            metrics.record_pending(partition, chunk)
        self._serve_group()

    def drain_parked(self) -> list[DrainReport]:
        """Publish the parked sends (``park_when_unavailable``) of every owned half partition,
        through the round writer's transaction, fenced as a round's chunk is
        (:mod:`outbox_checker.parked`); none without a transaction log to drain."""
        if self._drain is None:
            return []
        return [
            self._drain.drain(
                partition,
                lambda p=partition: self._checkpoints.watermarks(self._topics.half, p)[1],
                lambda start, p=partition: self._settled_halves(p, start),
                self._write_drained,
            )
            for partition in self._drain.waiting(self._ownership.partitions())
        ]

    def _settled_halves(self, partition: int, start: int) -> Iterator[HalfEntry]:
        """The halves of ``partition`` from ``start``, as Kafka has settled them: what the
        drain decides is written already, and so does not write again.

        A replica frozen mid-drain (or mid-chunk) and resumed after its partition moved
        here may still commit the Kafka transaction it had open: its offsets went to the
        group coordinator before its first record (:meth:`RoundWriter.start`), while its
        generation was current. Loading the checkpoint asks for the partition's offsets
        as a ``read_committed`` group consumer does, which Kafka answers only once no
        transaction holding an offset commit of the partition is open (KIP-447: a
        zombie's transaction ends, committed or aborted, before this returns); the
        halves are then read once every transaction open on the partition has ended.
        A zombie whose offsets were not sent yet is refused them (stale generation)
        and aborts. Either way the halves read here are all that will ever be
        committed of the zombie's drain.
        """
        self._checkpoint(partition)
        return self._reader(partition).settled_halves(start)

    def _write_drained(self, partition: int, halves: list[HalfRecord]) -> list[tuple[str, int]]:
        checkpoint = self._checkpoint(partition)
        chunk = RoundChunk(
            partition,
            to_drain=halves,
            half_checkpoint=checkpoint.half,
            op_checkpoint=checkpoint.op,
        )
        return self._writer.write(chunk, self._ownership.group_metadata(), self._now_ms).drained

    # ----------------------------------------------------------- checkpoints

    def _checkpoint(self, partition: int) -> Checkpoint:
        known = self._ownership.known_checkpoint(partition)
        if known is not None:
            return known
        checkpoint = self._checkpoints.load(partition)
        self._ownership.remember(partition, checkpoint)
        return checkpoint

    def _reader(self, partition: int) -> KafkaPartitionReader:
        return KafkaPartitionReader(
            self._halves, self._ops, partition, self._settings.client_config(), self._topics
        )

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)
