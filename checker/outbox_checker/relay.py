"""The relay: RocketMQ's ``EndTransactionProcessor``, on Kafka's exactly-once machinery.

Producers only decide (an op record: commit or rollback); the relay is the one
publisher of real records. It consumes the op topic in its own consumer group
(``<checker group>.relay``), and for the *first* decision of each half that is
a commit, restores the real record from the half (topic, key, value, user
headers, transaction id and producer group) and writes it in a Kafka
transaction that also commits the consumed op offsets (consume → produce →
``send_offsets_to_transaction``). The transaction is fenced by the group's
generation (KIP-447): a replica that lost an op partition in a rebalance cannot
commit for it any more. So whatever crashes, each committed half reaches its
real topic exactly once, and a later decision for the same half (a late own
end, a second check answer, a database resolution) publishes nothing: which
decision came first is read from the op partition itself
(:mod:`outbox_checker.decision_memory`), and the memory of it is committed with the
offsets, in the same transaction.

Each publication observes RocketMQ's born-to-finish latency
(``outbox_finish_message_latency_seconds``): from the broker storing the half
(for a copy, the original) to the relay's clock once the transaction that
wrote the real record has committed, both on the cluster's side, so a
producer's clock plays no part. The op records an owned partition holds beyond
what was relayed are its lag (``outbox_checker_relay_lag``).

A half whose real record cannot be written (its topic is gone, it is larger
than the topic or the client allows, it no longer exists) would otherwise stop
its partition for good; it goes to the discard topic with the reason and the
relay moves on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from outbox.access import is_authorization_failure, principal_of
from outbox.errors import DuplicateInstanceError, KafkaUnavailableError, NotAuthorizedError
from outbox.protocol import Decision, OutgoingRecord, RawRecord, TopicNames
from outbox.size_limits import SizeLimits
from outbox.topic_catalog import TopicCatalog
from outbox_checker import metrics
from outbox_checker.errors import ShortHalfRead
from outbox_checker.half_lookup import HalfLookup
from outbox_checker.kafka_reader import TopicCursor, end_offsets
from outbox_checker.relay_batch import (
    BatchReport,
    HalfState,
    decide_batch,
    decode_op,
    shared_scans,
)
from outbox_checker.relay_lookups import RelayLookups
from outbox_checker.relay_partitions import OpPartitions
from outbox_checker.relay_records import RealRecords
from outbox_checker.relay_transaction import RelayTransactions
from outbox_checker.settings import CheckerSettings, built_from_settings, from_setting
from outbox_checker.transactional import transactional_config

__all__ = ["BatchReport", "HalfState", "Relay", "RelaySettings"]

log = logging.getLogger(__name__)

_MAX_BACKOFF = 2.0
_HALF_WAIT_PAUSE = 0.05
"""Pause between readings of an op partition held at a half it waits for."""
_OP_WAIT = metrics.RELAY_STAGE_SECONDS.labels("op_wait")
_HALF_END = metrics.RELAY_STAGE_SECONDS.labels("half_end")


def _log_failed_batch(problem: Exception, backoff: float) -> None:
    """A refusal is an error someone must act on (grant the ACL); anything else, a warning."""
    if isinstance(problem, NotAuthorizedError):
        log.error("relay batch refused, reading it again in %.1fs: %s", backoff, problem)
    else:
        log.warning("relay batch failed, reading it again in %.1fs: %s", backoff, problem)


@dataclass(frozen=True)
class RelaySettings:
    """The relay's knobs: :meth:`from_settings`, defaults from :class:`CheckerSettings`."""

    batch: int = from_setting("relay_batch")
    memory: int = from_setting("relay_memory")
    transaction_timeout_ms: int = from_setting("relay_transaction_timeout_ms")
    timeout: float = 30.0
    silence_seconds: float = 10.0
    """Idle this long while its op partitions have undelivered decisions: the consumer is wedged."""
    session_timeout_ms: int = from_setting("session_timeout_ms")
    """The relay consumer's session (:mod:`outbox_checker.membership`)."""
    transaction_deadline: float = 5.0
    """A batch's Kafka transaction still running this long is abandoned and its producer
    fenced (a new one's ``init_transactions`` aborts it, or lets a commit under way finish;
    the partitions then resume from what Kafka committed), so exactly-once does not hang on
    it. A batch commits in a few ms (``outbox_checker_relay_stage_seconds``), under 1 s at
    p99 on a loaded 2-core machine; one stuck past that waits for a client that lost its
    coordinator or a partition's leader (librdkafka 2.x can block in
    ``send_offsets_to_transaction`` for minutes). Waiting out the transaction timeout plus
    5 s (15 s) held publication that long after a coordinator's node was killed."""

    @classmethod
    def from_settings(cls, settings: CheckerSettings) -> RelaySettings:
        """The relay of a checker with ``settings``."""
        return built_from_settings(cls, settings)


class Relay:
    """One replica's relay; ``run()`` in a thread until ``stop()``, or ``pump()`` in tests.

    The loop that wires its collaborators: :class:`OpPartitions` (the group consumer,
    and each op partition's restore and memory), :class:`RelayLookups` (halves' ends,
    the op history), :func:`decide_batch` (what a batch publishes), :class:`RealRecords`
    (restoring real records from halves) and :class:`RelayTransactions` (the Kafka
    transaction that writes them and commits the op offsets).
    """

    def __init__(
        self,
        client_config: dict[str, Any],
        topics: TopicNames,
        *,
        group_id: str,
        transactional_id: str,
        settings: RelaySettings = RelaySettings(),
        now_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        instance_id: str | None = None,
    ) -> None:
        """``instance_id``: the replica's stable id, for static membership of the relay's
        group (:mod:`outbox_checker.membership`); ``None`` joins as a dynamic member."""
        self._topics = topics
        self.failure: DuplicateInstanceError | None = None
        """Why the relay stopped on its own: it cannot go on beside a replica of its id."""
        self._settings = settings
        self._now_ms = now_ms
        self._client_config = client_config
        self._group_id = group_id
        self._producer_config = {
            **transactional_config(
                client_config,
                transactional_id,
                linger_ms=1,
                transaction_timeout_ms=settings.transaction_timeout_ms,
            ),
            "partitioner": "murmur2_random",
        }
        self._waiting: dict[int, int] = {}
        """Per op partition, the op offset last said to wait for its half (logged once)."""
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_batch_at = time.monotonic()
        """When the relay last finished a batch or found nothing to do: its liveness."""
        self._halves = HalfLookup(lambda: TopicCursor(client_config, topics.half, settings.timeout))
        self._lookups = RelayLookups(
            client_config, topics, settings.timeout, clock=lambda: now_ms() / 1000
        )
        catalog = TopicCatalog(
            AdminClient(client_config), settings.timeout, principal_of(client_config)
        )
        limits = SizeLimits(catalog, self._producer_config)
        self._records = RealRecords(self._halves, catalog, limits, topics, now_ms)
        self._transactions = RelayTransactions(
            self._producer_config, settings.timeout, settings.transaction_deadline
        )
        self._partitions = OpPartitions(
            client_config,
            topics.op,
            self._lookups,
            group_id=group_id,
            instance_id=instance_id,
            session_timeout_ms=settings.session_timeout_ms,
            memory=settings.memory,
            timeout=settings.timeout,
            silence_seconds=settings.silence_seconds,
            on_release=self._release,
        )

    # ----------------------------------------------------------- lifecycle

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="outbox-relay", daemon=True)
        self._thread.start()

    def run(self) -> None:
        """Relay until :meth:`stop`. A failed batch is rolled back and read again."""
        backoff = 0.5
        while not self._stopping.is_set():
            try:
                self.pump(0.2)
                backoff = 0.5
            except DuplicateInstanceError as exc:
                log.error("relay stopped: %s", exc)
                self.failure = exc
                self._stopping.set()
                return
            except (KafkaException, KafkaUnavailableError, NotAuthorizedError) as exc:
                self._transactions.renew()
                problem = self._refusal(exc.args[0]) if isinstance(exc, KafkaException) else None
                _log_failed_batch(problem or exc, backoff)
            except Exception:  # a thread that died would stop publication in silence
                log.exception("relay batch failed unexpectedly, reading it again in %.1fs", backoff)
            else:
                continue
            self._stopping.wait(backoff)
            # At most 2 s: the wait after the last failure is a stall once Kafka is back, and
            # every attempt in between is a batch read again and its offsets asked for.
            backoff = min(backoff * 2, _MAX_BACKOFF)
            try:
                self.rewind()
            except Exception:
                log.exception("relay cannot resume yet")

    def _refusal(self, error: KafkaError) -> NotAuthorizedError | None:
        """What the authoriser refused, when it refused: the relay retries, so an ACL
        granted meanwhile lets it carry on without a restart."""
        if not is_authorization_failure(error):
            return None
        code = error.code()
        if code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
            operation, resource = (
                "WRITE",
                f"transactional id {self._producer_config['transactional.id']!r}",
            )
        elif code == KafkaError.GROUP_AUTHORIZATION_FAILED:
            operation, resource = "READ", f"group {self._group_id!r}"
        elif not self._transactions.in_transaction:
            operation, resource = "READ", f"topic {self._topics.op!r}"
        else:
            batch_topics = self._transactions.topics_written
            names = ", ".join(repr(topic) for topic in batch_topics)
            several = len(batch_topics) > 1
            operation, resource = "WRITE", f"one of topics {names}" if several else f"topic {names}"
        return NotAuthorizedError(operation, resource, principal_of(self._client_config))

    def stop(self) -> None:
        self._stopping.set()

    def close(self, timeout: float = 30.0) -> None:
        """Stop, let the batch under way finish, leave the group, close every client."""
        self.stop()
        if self._thread is not None:
            self._thread.join(timeout)
        for closer in (
            self._partitions.consumer.close,
            self._halves.close,
            *self._lookups.closers(),
        ):
            try:
                closer()
            except (KafkaException, RuntimeError) as exc:
                log.debug("closing the relay: %s", exc)
        self._transactions.flush(timeout)

    @property
    def partitions(self) -> list[int]:
        """Op partitions this replica relays now (or will, once it could read where to resume)."""
        return self._partitions.partitions

    @property
    def op_partitions(self) -> OpPartitions:
        """Its group consumer and owned op partitions (tests stand them aside, fence them)."""
        return self._partitions

    @property
    def lookups(self) -> RelayLookups:
        """Its questions to Kafka outside the group: halves' ends, watermarks, op history."""
        return self._lookups

    def rewind(self) -> None:
        """After a failed batch: abort, then resume every partition from what Kafka committed.

        The consumer stands past the aborted batch. Until a partition is put back
        at its committed offset its records are not relayed: relaying on from
        where it stands would commit offsets beyond decisions never published.
        Reading the committed offset fails while the group's coordinator moves;
        such a partition is put back before a later batch (:meth:`OpPartitions.resume`).
        """
        self._partitions.stand_all_aside()
        if self._transactions.abort():
            self._partitions.resume()

    def _release(self, partitions: list[int]) -> None:
        """Op partitions no longer relayed (revoked, lost, or a fresh consumer's to take):
        the next transaction starts on a fresh producer (see :meth:`RelayTransactions.prepare`)
        and their halves' cursors go."""
        self._transactions.renew()
        for partition in partitions:
            self._halves.forget(partition)

    # ----------------------------------------------------------- relaying

    def pump(self, timeout: float) -> BatchReport:
        """Relay one batch of decisions (waiting up to ``timeout`` for the first)."""
        if self._partitions.aside:
            self._partitions.resume()
        first = self._partitions.consumer.poll(timeout)
        if self._partitions.rejoin_after_session_timeout():
            return BatchReport()  # what it read is the group's again, read anew from its offsets
        if first is None:
            self._idle(time.monotonic())
            self._publish_lag()
            return BatchReport()
        self._partitions.silence.heard()
        rest = self._partitions.consumer.consume(self._settings.batch - 1, timeout=0)
        messages = [first, *rest]
        records = [RawRecord.from_kafka(m) for m in messages if self._partitions.usable(m)]
        relayed = self._partitions.memories
        records = [r for r in records if r.partition in relayed]
        if not records:
            return BatchReport()
        stored = [r.timestamp_ms for r in records if r.timestamp_ms is not None]
        if stored:
            _OP_WAIT.observe(max(0, self._now_ms() - min(stored)) / 1000)
        started = time.monotonic()
        report = self._relay(records)
        metrics.RELAY_BATCH_SECONDS.observe(time.monotonic() - started)
        metrics.RELAY_PUBLISHED.inc(report.published)
        metrics.RELAY_SECOND_DECISIONS.inc(report.second_decisions)
        metrics.RELAY_UNPUBLISHABLE.inc(report.unpublishable)
        finished_ms = self._now_ms()
        histograms: dict[tuple[str, str], Any] = {}
        for topic, group, stored_ms in report.finished:
            histogram = histograms.get((topic, group))
            if histogram is None:
                histogram = histograms[topic, group] = metrics.FINISH_LATENCY.labels(topic, group)
            histogram.observe(max(0, finished_ms - stored_ms) / 1000)
        self._publish_lag()
        self.last_batch_at = time.monotonic()
        return report

    def _idle(self, now: float) -> None:
        """Nothing to read: fine, unless committed decisions wait past what was read.

        After a broker freeze a librdkafka consumer can stay silent for good
        (:mod:`outbox_checker.silence`). Idle while an op partition's committed end
        lies beyond this relay's position, the consumer is replaced; the group
        hands the partitions to the new one, which resumes from the committed
        offsets.
        """
        # The watermark client's queue holds only log lines and errors, served here.
        self._lookups.watermark_client.poll(0)
        if not self._partitions.silence.time_to_ask(now):
            self.last_batch_at = now
            return
        behind = self._undelivered()
        if not behind:
            self.last_batch_at = now
            return
        log.warning(
            "relay idle while op partitions %s hold unread decisions: replacing its consumer",
            behind,
        )
        self._partitions.replace_consumer()

    def _undelivered(self) -> list[int]:
        """Op partitions whose committed end is beyond this relay's position."""
        relayed = self._partitions.relayed
        if not relayed:
            return []
        ends = end_offsets(
            AdminClient(self._client_config),
            self._topics.op,
            list(relayed),
            IsolationLevel.READ_COMMITTED,
            self._settings.timeout,
        )
        return sorted(p for p, end in ends.items() if end > self._done(p, end))

    def _done(self, partition: int, default: int) -> int:
        """Where this relay is done on an op partition: past what it relayed, and past the
        transaction markers its consumer stepped over (which are no decisions)."""
        relayed = self._partitions.relayed.get(partition)
        if relayed is None:
            return default
        tp = TopicPartition(self._topics.op, partition)
        (position,) = self._partitions.consumer.position([tp])
        return max(relayed, position.offset)

    def _publish_lag(self) -> None:
        """Per owned op partition: the records past what was relayed (its end as last fetched).

        The end is the consumer's cached high watermark, so this costs no
        request; a partition not fetched from yet has none and is left as it was.
        """
        for partition in self._partitions.relayed:
            tp = TopicPartition(self._topics.op, partition)
            _, end = self._partitions.consumer.get_watermark_offsets(tp, cached=True)
            if end >= 0:
                metrics.RELAY_LAG.labels(str(partition)).set(
                    max(0, end - self._done(partition, end))
                )

    def _relay(self, records: list[RawRecord]) -> BatchReport:
        decisions = [(raw, decode_op(raw)) for raw in records]
        asked = self._lookups.half_end_seconds
        self._lookups.ask_half_ends(decisions)
        scans = shared_scans(decisions, self._partitions.memories, self._lookups.history_reader)
        plan = decide_batch(decisions, self._lookups.half_state, self._partitions.learning, scans)
        for raw, decision, state in plan.waiting:
            self._note_wait(raw, decision, state)
        _HALF_END.observe(self._lookups.half_end_seconds - asked)
        report = plan.report
        if plan.next_offsets:
            try:
                outgoing = self._records.of_commits(plan.commits, report)
            except ShortHalfRead as short:
                # The end that made its halves readable may be wrong too (a recreated half
                # topic): the batch read again asks for it afresh.
                self._lookups.forget_end(short.partition)
                raise
            self._commit_batch(outgoing, plan.next_offsets)
        else:  # every op of the batch waits for its half: a short pause, not a spin
            self._stopping.wait(_HALF_WAIT_PAUSE)
        self._hold(plan.held, plan.next_offsets)
        report.waiting = len(plan.held)
        return report

    def _commit_batch(self, outgoing: list[OutgoingRecord], next_offsets: dict[int, int]) -> None:
        """Write ``outgoing`` and commit the op offsets with the memories, in one transaction."""
        self._transactions.prepare()
        offsets = self._partitions.offsets_to_commit(next_offsets)
        group = self._partitions.consumer.consumer_group_metadata()
        self._transactions.commit(outgoing, offsets, group)
        self._partitions.committed(next_offsets)

    def _note_wait(self, raw: RawRecord, decision: Decision, state: HalfState) -> None:
        """Say once per waiting op (not at every re-read) why its partition stands still."""
        if self._waiting.get(raw.partition) == raw.offset:
            return
        self._waiting[raw.partition] = raw.offset
        why = (
            "behind a transaction still open on the half partition"
            if state is HalfState.BEHIND_OPEN_TRANSACTION
            else f"{state.value} (asking again)"
        )
        log.info(
            "op at %s[%d] waits for its half %d:%d, %s",
            raw.topic,
            raw.offset,
            decision.half_partition,
            decision.half_offset,
            why,
        )

    def _hold(self, held: dict[int, int], advanced: dict[int, int]) -> None:
        """Read each held op partition again from its waiting op, once the batch committed.

        Nothing at or past the waiting op was relayed or committed; the consumer stood
        past it. A partition that cannot be put back stands aside and resumes from its
        committed offset, which is no later than the waiting op.
        """
        for partition, offset in held.items():
            self._partitions.hold(partition, offset)
        for partition in [p for p in advanced if p not in held]:
            self._waiting.pop(partition, None)
