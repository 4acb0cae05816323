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
(:mod:`checker.decision_memory`), and the memory of it is committed with the
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
from collections import defaultdict
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka import Message as KafkaMessage
from confluent_kafka.admin import AdminClient
from outbox_checker import metrics
from outbox_checker.decision_memory import DecisionMemory, SharedScan
from outbox_checker.half_lookup import HalfLookup
from outbox_checker.kafka_reader import TopicCursor, end_offsets, watermark_client
from outbox_checker.membership import (
    Fences,
    JoinRefusals,
    group_consumer_config,
    group_member,
    must_rejoin,
)
from outbox_checker.settings import CHECKER_DEFAULTS, CheckerSettings
from outbox_checker.silence import SilenceWatch, close_in_background
from outbox_checker.transactional import transactional_config
from outbox_checker.watchdog import StuckError, call_with_deadline

from outbox.access import is_authorization_failure, principal_of
from outbox.acked_writer import produce_when_room
from outbox.errors import (
    DuplicateInstanceError,
    InvalidMessageError,
    KafkaUnavailableError,
    NotAuthorizedError,
)
from outbox.protocol import (
    Decision,
    DiscardReason,
    DiscardRecord,
    Header,
    MalformedRecordError,
    OutgoingRecord,
    RawRecord,
    TopicNames,
    half_stored_ms,
    real_record_of_half,
)
from outbox.protocol.headers import int_header, text_header
from outbox.reading import LEADER_PATIENCE, watermarks
from outbox.size_limits import SizeLimits
from outbox.topic_catalog import TopicCatalog

log = logging.getLogger(__name__)

_PRODUCER_GROUP = Header.PRODUCER_GROUP.value
_TRANSACTION_ID = Header.TRANSACTION_ID.value
_MAX_BACKOFF = 2.0
_HALF_WAIT_PAUSE = 0.05
"""Pause between readings of an op partition held at a half behind an open transaction."""
_STAGE = {stage: metrics.RELAY_STAGE_SECONDS.labels(stage) for stage in metrics.RELAY_STAGES}


def relay_group(checker_group: str) -> str:
    """The relay's consumer group, beside the rounds' group of the same replicas."""
    return f"{checker_group}.relay"


def _log_failed_batch(problem: Exception, backoff: float) -> None:
    """A refusal is an error someone must act on (grant the ACL); anything else, a warning."""
    if isinstance(problem, NotAuthorizedError):
        log.error("relay batch refused, reading it again in %.1fs: %s", backoff, problem)
    else:
        log.warning("relay batch failed, reading it again in %.1fs: %s", backoff, problem)


def relay_transactional_id(checker_group: str, instance: str) -> str:
    """A replica's relay ``transactional.id``: the same across its restarts, so a new
    incarnation fences the old one's open transaction (and names its coordinator)."""
    return f"{relay_group(checker_group)}.{instance}"


class HalfState(Enum):
    """Where the half an op names stands on its half partition."""

    READABLE = "readable"
    """Below the last stable offset: a committed read returns it (or finds it aborted)."""
    BEHIND_OPEN_TRANSACTION = "behind an open transaction"
    """Stored, but past the last stable offset: a transaction opened before it (a round
    writer's put-back chunk, a frozen or killed writer's) is still open on its partition."""
    NOT_STORED = "not stored"
    """Past everything the partition holds, or before its own origin: a bogus op."""


@dataclass
class BatchReport:
    """What one relay transaction did."""

    decisions: int = 0
    """Op records relayed (the ones waiting for their half not counted)."""
    published: int = 0
    second_decisions: int = 0
    rollbacks: int = 0
    unpublishable: int = 0
    waiting: int = 0
    """Op partitions held at a decision whose half is behind an open transaction."""
    by_partition: dict[int, int] = field(default_factory=dict)
    finished: list[tuple[str, str, int]] = field(default_factory=list)
    """(real topic, producer group, half stored ms) of each publication, for the latency."""


@dataclass(frozen=True)
class RelaySettings:
    """The relay's knobs: :meth:`from_settings`, defaults from :class:`CheckerSettings`."""

    batch: int = CHECKER_DEFAULTS.relay_batch
    memory: int = CHECKER_DEFAULTS.relay_memory
    transaction_timeout_ms: int = CHECKER_DEFAULTS.relay_transaction_timeout_ms
    timeout: float = 30.0
    silence_seconds: float = 10.0
    """Idle this long while its op partitions have undelivered decisions: the consumer is wedged."""
    session_timeout_ms: int = CHECKER_DEFAULTS.session_timeout_ms
    """The relay consumer's session (:mod:`checker.membership`)."""
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
        return cls(
            batch=settings.relay_batch,
            memory=settings.relay_memory,
            transaction_timeout_ms=settings.relay_transaction_timeout_ms,
            session_timeout_ms=settings.session_timeout_ms,
        )


class Relay:
    """One replica's relay; ``run()`` in a thread until ``stop()``, or ``pump()`` in tests."""

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
        group (:mod:`checker.membership`); ``None`` joins as a dynamic member."""
        self._topics = topics
        self._instance_id = instance_id
        self.failure: DuplicateInstanceError | None = None
        """Why the relay stopped on its own: it cannot go on beside a replica of its id."""
        self._fences = Fences()
        self._refusals = JoinRefusals(group_id)
        self._settings = settings
        self._now_ms = now_ms
        self._client_config = client_config
        self._producer_config = {
            **transactional_config(
                client_config,
                transactional_id,
                linger_ms=1,
                transaction_timeout_ms=settings.transaction_timeout_ms,
            ),
            "partitioner": "murmur2_random",
        }
        self._memories: dict[int, DecisionMemory] = {}
        self._relayed: dict[int, int] = {}
        """Per owned op partition, the offset after the last decision relayed and committed."""
        self._half_ends: dict[int, int] = {}
        """Per half partition, its last stable offset once read: halves below it are readable."""
        self._stored_ends: dict[int, int] = {}
        """Per half partition, its high watermark once read (asked only for an op past it)."""
        self._half_end_seconds = 0.0
        """Seconds the batch under way spent asking half partitions' ends."""
        self._waiting: dict[int, int] = {}
        """Per op partition, the op offset last said to wait for its half (logged once)."""
        self._unrestored: set[int] = set()
        """Owned op partitions not yet put back at their committed offset: their records wait."""
        self._dirty: set[int] = set()
        """Op partitions whose memory learned decisions not committed yet (the batch under way,
        or one that failed): such a memory is no longer the committed offset's."""
        self._shelf: dict[int, tuple[int, DecisionMemory]] = {}
        """Memories of partitions this replica stopped relaying (a fence, a rebalance, a failed
        batch), each with the committed offset it is exact at: taken back on a restore
        instead of re-reading the op partition from the memory's floor."""
        self._in_transaction = False
        self._stage = ""
        """The call the transaction under way is in: what a stuck one names."""
        self._batch_topics: list[str] = []
        """Topics the transaction under way writes: what a refused WRITE names."""
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_batch_at = time.monotonic()
        """When the relay last finished a batch or found nothing to do: its liveness."""
        self._halves = HalfLookup(lambda: TopicCursor(client_config, topics.half, settings.timeout))
        self._op_history = TopicCursor(client_config, topics.op, settings.timeout)
        self._watermarks = watermark_client(client_config)
        """Asked for watermarks instead of the group consumer, from whose callbacks they are
        asked too (:func:`~outbox_checker.kafka_reader.watermark_client`). Never polled for
        records, its log lines wait in its queue: :meth:`_idle` serves them."""
        self._admin = AdminClient(client_config)
        """Asked the readable ends of several half partitions in one request per leader."""
        self._catalog = TopicCatalog(self._admin, settings.timeout, principal_of(client_config))
        self._limits = SizeLimits(self._catalog, self._producer_config)
        self._producer = self._new_producer()
        self._aside_since: float | None = None
        """Since when partitions stand aside unresumed (see :meth:`_resume`)."""
        self._renew_producer = False
        """Start the next transaction on a fresh producer: set after a failed batch and a
        revoked or lost assignment (see :meth:`_fresh_producer`)."""
        self._group_id = group_id
        self._silence = SilenceWatch(settings.silence_seconds)
        self._consumer = self._new_consumer()

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
                self._renew_producer = True
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
                self._rewind()
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
        elif not self._in_transaction:
            operation, resource = "READ", f"topic {self._topics.op!r}"
        else:
            names = ", ".join(repr(topic) for topic in self._batch_topics)
            several = len(self._batch_topics) > 1
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
            self._consumer.close,
            self._halves.close,
            self._op_history.close,
            self._watermarks.close,
        ):
            try:
                closer()
            except (KafkaException, RuntimeError) as exc:
                log.debug("closing the relay: %s", exc)
        self._producer.flush(timeout)

    @property
    def partitions(self) -> list[int]:
        """Op partitions this replica relays now (or will, once it could read where to resume)."""
        return sorted({*self._memories, *self._unrestored})

    # ----------------------------------------------------------- membership

    def _new_consumer(self) -> Consumer:
        config = group_consumer_config(
            self._client_config,
            self._group_id,
            self._instance_id,
            self._settings.session_timeout_ms,
        )
        consumer, self._session_log = group_member(
            config, self._topics.op, self._on_assign, self._on_revoke
        )
        return consumer

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if consumer is not self._consumer:
            return  # a replaced consumer's last word
        starts = []
        for tp in partitions:
            position = self._try_restore(tp.partition)
            if position is None:
                self._unrestored.add(tp.partition)
                starts.append(TopicPartition(self._topics.op, tp.partition))
                continue
            starts.append(TopicPartition(self._topics.op, tp.partition, position))
        consumer.assign(starts)  # eager: the whole assignment
        # Silence counts from the next idle poll: the seconds spent restoring were not the
        # consumer's, and its first fetch from the restored offsets is still to come.
        self._silence.heard()
        log.info("relaying op partitions %s", sorted(tp.partition for tp in partitions))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if consumer is not self._consumer:
            return
        self._renew_producer = True  # lost in an outage, maybe: see _fresh_producer
        for tp in partitions:
            self._shelve(tp.partition)
            self._halves.forget(tp.partition)
            self._unrestored.discard(tp.partition)
            with suppress(KeyError):  # not reported yet; older prometheus clients raise then
                metrics.RELAY_LAG.remove(str(tp.partition))  # another replica reports it now
        consumer.unassign()  # eager: everything goes back
        log.info("stopped relaying op partitions %s", sorted(tp.partition for tp in partitions))

    def _try_restore(self, partition: int) -> int | None:
        """:meth:`_restore`, or ``None`` when it failed: the partition must wait for a retry.

        Any failure, not only Kafka's (the op history unreadable, a checkpoint not
        understood): an assigned partition in neither the memories nor the waiting
        set would be orphaned, its decisions never published, its lag unseen.
        """
        try:
            return self._restore(partition)
        except Exception as exc:
            log.warning("relay cannot resume op partition %d yet: %s", partition, exc)
            return None

    def _restore(self, partition: int) -> int:
        """Rebuild a partition's decision memory from its committed offset; return that offset.

        Reading the committed offset of a ``read_committed`` consumer waits
        for any transaction still open on it (KIP-447), so a predecessor's
        last batch is either in it or aborted, never half-seen.
        """
        tp = TopicPartition(self._topics.op, partition)
        (committed,) = self._consumer.committed([tp], timeout=self._settings.timeout)
        low, _ = watermarks(self._watermarks, tp, self._settings.timeout)
        position = committed.offset
        if position == OFFSET_INVALID or position < 0:
            position = low
            metadata = None
        else:
            metadata = committed.metadata
        kept = self._kept_memory(partition, position, low)
        if kept is None:
            memory = DecisionMemory.from_metadata(metadata, self._settings.memory, low)
            offset = memory.op_floor
        else:
            memory, offset = kept
        rebuilt = 0
        while offset < position:
            batch = self._op_history.read(partition, offset, 500)
            if not batch:
                break
            for raw in batch:
                if raw.offset >= position:
                    break
                decision = _decode(raw)
                if decision is not None and self._half_state(decision) is not HalfState.NOT_STORED:
                    memory.learn(decision.identity, raw.offset)
                    rebuilt += 1
            offset = batch[-1].offset + 1
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

    def _rewind(self) -> None:
        """After a failed batch: abort, then resume every partition from what Kafka committed.

        The consumer stands past the aborted batch. Until a partition is put back
        at its committed offset its records are not relayed: relaying on from
        where it stands would commit offsets beyond decisions never published.
        Reading the committed offset fails while the group's coordinator moves;
        such a partition is put back before a later batch (:meth:`_resume`).
        """
        for partition in list(self._memories):
            self._stand_aside(partition)
        try:
            if self._in_transaction:
                # Within the deadline, not the client timeout (30 s): an abort blocks while
                # the transaction's coordinator is frozen or dead, and a fresh producer's
                # init_transactions aborts the transaction as well, at its new coordinator.
                self._producer.abort_transaction(self._settings.transaction_deadline)
                self._in_transaction = False
        except KafkaException as exc:
            log.warning("relay abort failed (%s); starting a fresh producer", exc)
            self._in_transaction = False
            try:
                self._producer = self._new_producer()
                self._renew_producer = False
            except KafkaUnavailableError as again:
                log.warning("relay producer not ready yet: %s", again)
                return
        self._resume()

    def _stand_aside(self, partition: int) -> None:
        """Relay nothing of ``partition`` until :meth:`_resume` puts it back."""
        self._shelve(partition)
        self._unrestored.add(partition)
        if self._aside_since is None:
            self._aside_since = time.monotonic()

    def _resume(self) -> None:
        """Put each partition standing aside back at its committed offset, where it can be read."""
        resumed = False
        for partition in sorted(self._unrestored):
            position = self._try_restore(partition)
            if position is not None:
                try:
                    self._consumer.seek(TopicPartition(self._topics.op, partition, position))
                except KafkaException as exc:
                    log.warning("relay cannot resume op partition %d yet: %s", partition, exc)
                    position = None
            if position is None:
                self._stand_aside(partition)
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
        restores them from the committed offsets, as after a silent one (:meth:`_idle`).
        """
        if not self._unrestored:
            self._aside_since = None
            return
        if self._aside_since is None:
            self._aside_since = now
            return
        if now - self._aside_since < self._settings.silence_seconds:
            return
        log.warning(
            "relay cannot put op partitions %s back (%.0fs): replacing its consumer",
            sorted(self._unrestored),
            now - self._aside_since,
        )
        self._aside_since = None
        self._replace_consumer()

    def _fresh_producer(self) -> None:
        """A fresh producer for the transaction after a failure or a lost assignment.

        After an outage librdkafka can keep a decommissioned broker as the producer's
        group coordinator (a broker missing from one metadata answer, as a restarted one
        is until it has registered: confluentinc/librdkafka#5511), and
        ``send_offsets_to_transaction`` then waits for it past any timeout, until the
        transaction deadline abandons it (5 s of publication). A new producer looks the
        coordinator up again; its ``init_transactions`` also fences the old one's open
        transaction. Raises KafkaUnavailableError while Kafka cannot start one (the batch
        is read again).
        """
        if self._renew_producer:
            self._producer = self._new_producer()
            self._renew_producer = False

    def _new_producer(self) -> Producer:
        producer = Producer(self._producer_config)
        try:
            # Fences an earlier producer with this transactional.id, aborting its open batch.
            producer.init_transactions(self._settings.timeout)
        except KafkaException as exc:
            raise KafkaUnavailableError(f"cannot start the relay's producer: {exc}") from None
        return producer

    # ----------------------------------------------------------- relaying

    def pump(self, timeout: float) -> BatchReport:
        """Relay one batch of decisions (waiting up to ``timeout`` for the first)."""
        if self._unrestored:
            self._resume()
        first = self._consumer.poll(timeout)
        if first is None:
            self._idle(time.monotonic())
            self._publish_lag()
            return BatchReport()
        self._silence.heard()
        messages = [first, *self._consumer.consume(self._settings.batch - 1, timeout=0)]
        records = [RawRecord.from_kafka(m) for m in messages if self._usable(m)]
        records = [r for r in records if r.partition in self._memories]
        if not records:
            return BatchReport()
        stored = [r.timestamp_ms for r in records if r.timestamp_ms is not None]
        if stored:
            _STAGE["op_wait"].observe(max(0, self._now_ms() - min(stored)) / 1000)
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
        (:mod:`checker.silence`). Idle while an op partition's committed end
        lies beyond this relay's position, the consumer is replaced; the group
        hands the partitions to the new one, which resumes from the committed
        offsets.
        """
        self._watermarks.poll(0)  # its queue holds only log lines and errors, served here
        if not self._silence.time_to_ask(now):
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
        self._replace_consumer()

    def _replace_consumer(self) -> None:
        """Join the group again with a fresh consumer; it resumes from the committed offsets."""
        old, self._consumer = self._consumer, self._new_consumer()
        self._renew_producer = True
        for partition in list(self._memories):
            self._halves.forget(partition)
            self._shelve(partition)
        self._unrestored.clear()
        close_in_background(old)

    def _undelivered(self) -> list[int]:
        """Op partitions whose committed end is beyond this relay's position."""
        if not self._relayed:
            return []
        ends = end_offsets(
            AdminClient(self._client_config),
            self._topics.op,
            list(self._relayed),
            IsolationLevel.READ_COMMITTED,
            self._settings.timeout,
        )
        return sorted(p for p, end in ends.items() if end > self._done(p, end))

    def _done(self, partition: int, default: int) -> int:
        """Where this relay is done on an op partition: past what it relayed, and past the
        transaction markers its consumer stepped over (which are no decisions)."""
        relayed = self._relayed.get(partition)
        if relayed is None:
            return default
        (position,) = self._consumer.position([TopicPartition(self._topics.op, partition)])
        return max(relayed, position.offset)

    def _publish_lag(self) -> None:
        """Per owned op partition: the records past what was relayed (its end as last fetched).

        The end is the consumer's cached high watermark, so this costs no
        request; a partition not fetched from yet has none and is left as it was.
        """
        for partition in self._relayed:
            tp = TopicPartition(self._topics.op, partition)
            _, end = self._consumer.get_watermark_offsets(tp, cached=True)
            if end >= 0:
                metrics.RELAY_LAG.labels(str(partition)).set(
                    max(0, end - self._done(partition, end))
                )

    def _relay(self, records: list[RawRecord]) -> BatchReport:
        report = BatchReport()
        commits: dict[int, list[Decision]] = defaultdict(list)
        next_offsets: dict[int, int] = {}
        decisions = [(raw, _decode(raw)) for raw in records]
        self._half_end_seconds = 0.0
        self._ask_half_ends(decisions)
        scans = self._shared_scans(decisions)
        held: dict[int, int] = {}
        """Per op partition, the op whose half cannot be read yet: it and what follows wait."""
        for raw, decision in decisions:
            if raw.partition in held:
                continue
            if decision is not None and decision.half_partition == raw.partition:
                state = self._half_state(decision)
                if state is HalfState.BEHIND_OPEN_TRANSACTION:
                    held[raw.partition] = raw.offset
                    self._note_wait(raw, decision)
                    continue
            next_offsets[raw.partition] = raw.offset + 1
            report.decisions += 1
            if decision is None or decision.half_partition != raw.partition:
                if decision is not None:
                    log.warning(
                        "op at %s[%d] names half partition %d; ignored",
                        raw.topic,
                        raw.offset,
                        decision.half_partition,
                    )
                continue
            if state is HalfState.NOT_STORED:
                log.warning(
                    "op at %s[%d] names half %d:%d (origin %d), which its half partition "
                    "cannot hold; ignored",
                    raw.topic,
                    raw.offset,
                    decision.half_partition,
                    decision.half_offset,
                    decision.identity,
                )
                continue
            memory = self._memories[raw.partition]
            self._dirty.add(raw.partition)
            if not memory.is_first(decision.identity, raw.offset, scans[raw.partition]):
                report.second_decisions += 1
                continue
            if decision.commit:
                commits[raw.partition].append(decision)
            else:
                report.rollbacks += 1
        _STAGE["half_end"].observe(self._half_end_seconds)
        if next_offsets:
            self._commit_batch(self._restore_records(commits, report), next_offsets)
        else:  # every op of the batch waits for its half: a short pause, not a spin
            self._stopping.wait(_HALF_WAIT_PAUSE)
        self._hold(held, next_offsets)
        report.waiting = len(held)
        return report

    def _commit_batch(self, outgoing: list[OutgoingRecord], next_offsets: dict[int, int]) -> None:
        """Write ``outgoing`` and commit the op offsets with the memories, in one transaction."""
        self._fresh_producer()
        self._dirty.update(next_offsets)  # shrunk below: the committed memory only if it commits
        self._batch_topics = sorted({record.topic for record in outgoing})
        offsets = []
        for partition, offset in next_offsets.items():
            memory = self._memories[partition]
            memory.shrink(offset)
            offsets.append(
                TopicPartition(self._topics.op, partition, offset, metadata=memory.metadata())
            )
        producer, group = self._producer, self._consumer.consumer_group_metadata()
        self._in_transaction = True
        try:
            call_with_deadline(
                lambda: self._transact(producer, outgoing, offsets, group),
                self._settings.transaction_deadline,
                "outbox-relay-transaction",
            )
        except StuckError as exc:
            log.error(
                "a relay transaction is stuck in %s; fencing its producer: %s", self._stage, exc
            )
            self._in_transaction = False
            self._producer = self._new_producer()
            raise KafkaUnavailableError(f"relay transaction abandoned: {exc}") from None
        self._in_transaction = False
        self._relayed.update(next_offsets)
        self._dirty.difference_update(next_offsets)

    def _transact(
        self,
        producer: Producer,
        outgoing: list[OutgoingRecord],
        offsets: list[TopicPartition],
        group: object,
    ) -> None:
        """The batch's Kafka transaction: real records, discards, op offsets with the memory."""
        started = time.monotonic()
        self._stage = "begin_transaction"
        producer.begin_transaction()
        self._stage = "produce"
        for record in outgoing:
            produce_when_room(producer, **record.produce_kwargs())
        produced = time.monotonic()
        _STAGE["produce"].observe(produced - started)
        self._stage = "send_offsets_to_transaction"
        producer.send_offsets_to_transaction(offsets, group, self._settings.timeout)
        self._stage = "commit_transaction"
        producer.commit_transaction(self._settings.timeout)
        _STAGE["commit"].observe(time.monotonic() - produced)

    def _restore_records(
        self, commits: dict[int, list[Decision]], report: BatchReport
    ) -> list[OutgoingRecord]:
        """The real records of the commits, in op order; discards for those that cannot be."""
        outgoing: list[OutgoingRecord] = []
        for partition, ops in commits.items():
            started = time.monotonic()
            halves = self._halves.fetch(partition, (op.half_offset for op in ops))
            _STAGE["half_lookup"].observe(time.monotonic() - started)
            for op in ops:
                record, problem = self._real_record(op, halves.get(op.half_offset))
                if record is not None:
                    outgoing.append(record)
                    report.published += 1
                    report.by_partition[partition] = report.by_partition.get(partition, 0) + 1
                    _note_finish(report, record, halves[op.half_offset])
                    continue
                report.unpublishable += 1
                log.error(
                    "committed transaction %s cannot be published (%s); kept on %s",
                    op.transaction_id,
                    problem,
                    self._topics.discard,
                )
                raw = halves.get(op.half_offset)
                if raw is None or raw.header_text(_TRANSACTION_ID) != op.transaction_id:
                    # Never another transaction's half: `outbox discard resume` publishes
                    # what an unpublishable discard holds, as the committed transaction's.
                    raw = _stand_in_half(self._topics, op)
                discard = DiscardRecord.of_half(
                    raw, DiscardReason.UNPUBLISHABLE, self._now_ms(), problem
                )
                outgoing.append(discard.to_record(self._topics))
        return outgoing

    def _real_record(
        self, op: Decision, raw: RawRecord | None
    ) -> tuple[OutgoingRecord | None, str]:
        if raw is None:
            return None, f"its half {op.half_partition}:{op.half_offset} is not in the half topic"
        try:
            transaction_id, record = real_record_of_half(raw)
        except MalformedRecordError as exc:
            return None, f"its half does not decode: {exc}"
        if transaction_id != op.transaction_id:
            return None, (
                f"the op names half {op.half_partition}:{op.half_offset}, which belongs to "
                f"transaction {transaction_id}"
            )
        problem = real_record_problem(self._catalog, self._limits, record)
        if problem is not None:
            return None, problem
        return record, ""

    def _ask_half_ends(self, decisions: list[tuple[RawRecord, Decision | None]]) -> None:
        """Learn at once the readable end of each half partition the batch needs past the end
        known, instead of one question at a time in :meth:`_half_state`.

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
            and decision.identity <= decision.half_offset  # else no stored half: _half_state
            and decision.half_offset >= self._half_ends.get(decision.half_partition, 0)
        }
        if len(stale) < 2:
            return
        asked = time.monotonic()
        try:
            self._half_ends.update(
                end_offsets(
                    self._admin,
                    self._topics.half,
                    sorted(stale),
                    IsolationLevel.READ_COMMITTED,
                    LEADER_PATIENCE,
                )
            )
        except (KafkaException, KafkaUnavailableError) as exc:
            log.debug("half partitions' ends not asked together: %s", exc)
        finally:
            self._half_end_seconds += time.monotonic() - asked

    def _half_state(self, decision: Decision) -> HalfState:
        """Whether the op can decide a half that is stored, and whether that half can be read.

        A bogus op (its origin later than the copy it names, or a huge offset) would
        otherwise be the highest identity in the memory's window, never dropped, pinning
        the window's op floor: it is no decision. A half past the last stable offset is
        stored all the same when it lies below the high watermark (a committed read
        cannot see it while a transaction opened before it is open): its decision waits.
        Taking the last stable offset for the end dropped such decisions as bogus.
        """
        if decision.identity > decision.half_offset:
            return HalfState.NOT_STORED
        partition = decision.half_partition
        if decision.half_offset < self._half_ends.get(partition, 0):
            return HalfState.READABLE
        # Past the end known: ask again (the half came first). The watermark client reads
        # committed, so the end it is told is the partition's last stable offset.
        asked = time.monotonic()
        try:
            tp = TopicPartition(self._topics.half, partition)
            _, self._half_ends[partition] = watermarks(self._watermarks, tp, self._settings.timeout)
            if decision.half_offset < self._half_ends[partition]:
                return HalfState.READABLE
            if decision.half_offset >= self._stored_ends.get(partition, 0):
                (self._stored_ends[partition],) = end_offsets(
                    AdminClient(self._client_config),
                    self._topics.half,
                    [partition],
                    IsolationLevel.READ_UNCOMMITTED,
                    self._settings.timeout,
                ).values()
        finally:
            self._half_end_seconds += time.monotonic() - asked
        if decision.half_offset < self._stored_ends[partition]:
            return HalfState.BEHIND_OPEN_TRANSACTION
        return HalfState.NOT_STORED

    def _note_wait(self, raw: RawRecord, decision: Decision) -> None:
        """Say once per waiting op (not at every re-read) why its partition stands still."""
        if self._waiting.get(raw.partition) == raw.offset:
            return
        self._waiting[raw.partition] = raw.offset
        log.info(
            "op at %s[%d] waits for its half %d:%d, behind a transaction still open on the "
            "half partition",
            raw.topic,
            raw.offset,
            decision.half_partition,
            decision.half_offset,
        )

    def _hold(self, held: dict[int, int], advanced: dict[int, int]) -> None:
        """Read each held op partition again from its waiting op, once the batch committed.

        Nothing at or past the waiting op was relayed or committed; the consumer stood
        past it. A partition that cannot be put back stands aside and resumes from its
        committed offset, which is no later than the waiting op.
        """
        for partition, offset in held.items():
            try:
                self._consumer.seek(TopicPartition(self._topics.op, partition, offset))
            except KafkaException as exc:
                log.warning("relay cannot hold op partition %d at %d: %s", partition, offset, exc)
                self._stand_aside(partition)
        for partition in [p for p in advanced if p not in held]:
            self._waiting.pop(partition, None)

    def _usable(self, message: KafkaMessage) -> bool:
        error = message.error()
        if error is None:
            return True
        group, session = f"relay group {self._group_id!r}", self._session_log
        if must_rejoin(error, self._instance_id, session, self._fences, "relay consumer", group):
            self._replace_consumer()
            return False
        if self._refusals.explains(error):
            return False
        if error.code() != KafkaError._PARTITION_EOF:
            raise KafkaException(error)
        return False

    def _shared_scans(
        self, decisions: list[tuple[RawRecord, Decision | None]]
    ) -> dict[int, SharedScan]:
        """Per op partition, one reading of its history for the batch's decisions below the
        memory's floor (rare: decisions days late; a burst of them is read once)."""
        below: dict[int, set[int]] = defaultdict(set)
        spans: dict[int, tuple[int, int]] = {}
        for raw, decision in decisions:
            memory = self._memories[raw.partition]
            if decision is not None and decision.identity < memory.origin_floor:
                below[raw.partition].add(decision.identity)
                low, _ = spans.get(raw.partition, (raw.offset, raw.offset))
                spans[raw.partition] = (min(low, memory.lower_bound(decision.identity)), raw.offset)
        scans = {}
        for partition in {raw.partition for raw, _ in decisions}:
            wanted = below[partition]
            reader = self._history_reader(partition, wanted)
            scans[partition] = SharedScan(reader, wanted, spans.get(partition))
        return scans

    def _history_reader(self, partition: int, wanted: set[int]) -> Callable[[int, int], Any]:
        """The slow path for decisions below the memory's floor: read the op history."""

        def read(start: int, end: int) -> Any:
            log.info(
                "op partition %d: %d decisions below the relay's window; reading op history %d..%d",
                partition,
                len(wanted),
                start,
                end,
            )
            offset = start
            while offset < end:
                batch = self._op_history.read(partition, offset, 500)
                if not batch:
                    return
                for raw in batch:
                    if raw.offset >= end:
                        return
                    decision = _decode(raw)
                    if decision is not None:
                        yield raw.offset, decision.identity
                offset = batch[-1].offset + 1

        return read


def real_record_problem(
    catalog: TopicCatalog, limits: SizeLimits, record: OutgoingRecord
) -> str | None:
    """Why the real record of a committed half cannot be written now; None when it can.

    The relay's test before it publishes, and `outbox discard resume`'s before it
    publishes an unpublishable discard once its cause is fixed: one test, so the
    two never disagree on what "fixed" means.
    """
    try:
        facts = catalog.get(record.topic)
    except InvalidMessageError as exc:
        return str(exc)
    if record.partition is not None and record.partition >= facts.partitions:
        return f"partition {record.partition} of {record.topic!r} does not exist"
    return limits.problem("real record", record)


def _decode(raw: RawRecord) -> Decision | None:
    try:
        return Decision.from_record(raw)
    except MalformedRecordError as exc:
        log.warning("ignoring a malformed op record: %s", exc)
        return None


def _note_finish(report: BatchReport, record: OutgoingRecord, raw: RawRecord) -> None:
    stored_ms = half_stored_ms(raw)
    # The real record names its producer group last (``real_record_of_half``).
    group = next((v for n, v in reversed(record.headers) if n == _PRODUCER_GROUP), None)
    if stored_ms is not None and group:
        report.finished.append((record.topic, group.decode("utf-8", "replace"), stored_ms))


def _stand_in_half(topics: TopicNames, op: Decision) -> RawRecord:
    """What a discard can say of a half that is gone: the op's own facts."""
    return RawRecord(
        topic=topics.half,
        partition=op.half_partition,
        offset=op.half_offset,
        headers=(
            text_header(Header.TRANSACTION_ID, op.transaction_id),
            int_header(Header.ORIGIN_OFFSET, op.identity),
        ),
    )
