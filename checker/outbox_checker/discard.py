"""``outbox discard list|resume``: halves the checker gave up on, and putting them back.

The checker discards a half after ``check_max`` unanswered checks, past the
retention horizon, or when it does not decode, by copying it verbatim to
``<prefix>.discard`` (:class:`~outbox.protocol.DiscardRecord`). Once the cause
is fixed (the producer group is running again, the listener answers), an
operator resumes it: the original half goes back to the end of its half
partition with the check count reset to 0, and the checker asks about it again
in its next round. This is RocketMQ's ``RESUME_CHECK_HALF_MESSAGE``.

Resuming must be idempotent: a resume run twice (a retry after a timeout, two
operators at once) must not put two halves back. The choice here is a *resume
marker* on the discard topic itself:

- a record with ``outbox-kind: discard-resumed``, keyed by the transaction id,
  no value, naming the discard record it settles (``outbox-discard-partition``,
  ``outbox-discard-offset``) and where the half went back
  (``outbox-half-partition``, ``outbox-half-offset``, ``outbox-resumed-ms``);
- the resumed halves and their markers are written in **one Kafka transaction**,
  so a crash leaves either both or neither;
- every resume uses the same transactional id (``<prefix>.discard-resume``)
  and reads the discard topic only after ``init_transactions``: a second
  resume running at the same time fences the first (whose commit then fails),
  or, if the first committed already, reads its markers and skips those
  discards. Two concurrent resumes therefore never both put a half back.

A marker names one discard record, not just a transaction id, so a half that was
resumed and later discarded again can be resumed again. Comparing with the
halves already in the half topic was the alternative; it needs a scan of the
whole half topic and cannot tell a resumed copy from a put-back one.

Readers of the discard topic must skip records whose kind is not ``discard``
(``list`` does). A discarded half that was malformed cannot be resumed: there is
nothing valid to put back; it stays listed with the decoding problem.

**Unpublishable discards are published, not put back.** The relay discards a
*committed* half whose real record the real topic refuses (the topic is gone,
the record is over its ``max.message.bytes``). Put back, such a half would only
collect a second decision, which the relay ignores; so once the cause is fixed
the resume publishes the real record itself, the very record the relay would
have (:meth:`HalfRecord.to_real_record`), exactly once by the same construction
as a put-back: the real record and its marker (naming the real topic, partition
and offset) are written in one Kafka transaction under the shared resume id, and
markers are read only after ``init_transactions``. So:

- two resumes at once: the later ``init_transactions`` aborts the earlier's open
  transaction and fences it (its commit fails), or waits for its commit to
  complete and then reads its marker; never both publish;
- a crash anywhere: the record and its marker are committed together or not at
  all; nothing comes after the commit that a crash could lose;
- op retention: nothing here reads the op topic. The relay cannot publish the
  half a second time either: it discarded it at the half's *first* commit, in the
  transaction that committed that op's offset, and no copy is put back to be
  decided again. (Retention of the discard topic deletes a discard before its
  marker, which is written later.)

Before it writes, the resume asks the same question the relay did
(:func:`~outbox_checker.publishable.real_record_problem`: the topic exists, the
partition too, the record fits the topic's and the client's limits); a record
that still does not fit is refused in one line naming the cause, nothing is
written, and it stays resumable.

The markers are read up to the discard topic's high watermark, not its last
stable offset: a transaction opened on the discard topic before a marker (a
relay or a round writing discards) and still open holds the last stable offset
below that marker, and a resume reading only that far would not see it and put
back or publish a second time. The resume waits for such a transaction to end.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from outbox.access import principal_of
from outbox.config import KafkaSettings
from outbox.errors import KafkaUnavailableError, TopicAdminError
from outbox.protocol import (
    DiscardReason,
    DiscardRecord,
    HalfRecord,
    Header,
    MalformedRecordError,
    OutgoingRecord,
    RawRecord,
    RecordKind,
    TopicNames,
)
from outbox.reading import read_topic
from outbox.size_limits import SizeLimits
from outbox.topic_catalog import TopicCatalog
from outbox_checker.errors import ResumeFencedError
from outbox_checker.kafka_reader import SETTLE_PAUSE, end_offsets
from outbox_checker.names import resume_history_group, resume_transactional_id
from outbox_checker.publishable import real_record_problem
from outbox_checker.transactional import remember_offset, transactional_config

log = logging.getLogger(__name__)

RESUMED_KIND = RecordKind.DISCARD_RESUMED.value
DISCARD_PARTITION_HEADER = Header.DISCARD_PARTITION.value
DISCARD_OFFSET_HEADER = Header.DISCARD_OFFSET.value
RESUMED_MS_HEADER = Header.RESUMED_MS.value
CHUNK = 500
"""Halves resumed per Kafka transaction: bounded transactions, progress kept on a crash."""
RESUME_TRANSACTION_TIMEOUT_MS = 60_000
"""librdkafka's default ``transaction.timeout.ms``, which a resume has always had."""
CLOCK_MARGIN_MS = 60_000
"""How far the clocks of a half's writer and of its decisions' writers may disagree."""
_MISMATCH_DETAIL = "which belongs to transaction"
"""In the detail of an unpublishable discard an older relay wrote with another transaction's
half (an op naming a half that was not its own): never publishable as the committed one."""


# ------------------------------------------------------------------ records


@dataclass(frozen=True)
class Publication:
    """Where a resume published the real record of an unpublishable discard."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True)
class ResumeMarker:
    """The record saying a discard was resumed: where its half went back, or, for an
    unpublishable discard, the half it settles and where its real record was published."""

    transaction_id: str
    discard_partition: int
    discard_offset: int
    half_partition: int
    half_offset: int
    resumed_ms: int
    published: Publication | None = None

    def to_record(self, topics: TopicNames) -> OutgoingRecord:
        headers = [
            (Header.KIND.value, RESUMED_KIND.encode()),
            (Header.TRANSACTION_ID.value, self.transaction_id.encode()),
            (DISCARD_PARTITION_HEADER, str(self.discard_partition).encode()),
            (DISCARD_OFFSET_HEADER, str(self.discard_offset).encode()),
            (Header.HALF_PARTITION.value, str(self.half_partition).encode()),
            (Header.HALF_OFFSET.value, str(self.half_offset).encode()),
            (RESUMED_MS_HEADER, str(self.resumed_ms).encode()),
        ]
        if self.published is not None:
            headers += [
                (Header.REAL_TOPIC.value, self.published.topic.encode()),
                (Header.REAL_PARTITION.value, str(self.published.partition).encode()),
                (Header.REAL_OFFSET.value, str(self.published.offset).encode()),
            ]
        return OutgoingRecord(topics.discard, self.transaction_id.encode(), None, headers)

    @classmethod
    def from_record(cls, raw: RawRecord) -> ResumeMarker | None:
        """The marker in ``raw``; ``None`` for any other record (or a broken marker)."""
        if raw.header_text(Header.KIND.value) != RESUMED_KIND:
            return None
        try:
            return cls(
                transaction_id=_required(raw, Header.TRANSACTION_ID.value),
                discard_partition=int(_required(raw, DISCARD_PARTITION_HEADER)),
                discard_offset=int(_required(raw, DISCARD_OFFSET_HEADER)),
                half_partition=int(_required(raw, Header.HALF_PARTITION.value)),
                half_offset=int(_required(raw, Header.HALF_OFFSET.value)),
                resumed_ms=int(_required(raw, RESUMED_MS_HEADER)),
                published=_publication(raw),
            )
        except ValueError as exc:
            log.warning("ignoring a broken resume marker at %s[%d]@%d: %s", *_at(raw), exc)
            return None


def _publication(raw: RawRecord) -> Publication | None:
    """The real record a marker names, if it names one (a published discard's marker)."""
    topic = raw.header_text(Header.REAL_TOPIC.value)
    if topic is None:
        return None
    return Publication(
        topic,
        int(_required(raw, Header.REAL_PARTITION.value)),
        int(_required(raw, Header.REAL_OFFSET.value)),
    )


def _required(raw: RawRecord, name: str) -> str:
    value = raw.header_text(name)
    if value is None:
        raise ValueError(f"{name} is missing")
    return value


def _at(raw: RawRecord) -> tuple[str, int, int]:
    return raw.topic, raw.partition, raw.offset


@dataclass
class DiscardedHalf:
    """One discard record, decoded as far as it goes, and whether it was resumed."""

    raw: RawRecord
    record: DiscardRecord | None
    half: HalfRecord | None
    problem: str | None
    """Why it cannot be resumed (malformed half or discard record); ``None`` if it can."""
    resumed: ResumeMarker | None = None

    @classmethod
    def of(cls, raw: RawRecord) -> DiscardedHalf:
        try:
            record = DiscardRecord.from_record(raw)
        except MalformedRecordError as exc:
            return cls(raw, None, None, f"the discard record does not decode: {exc}")
        if record.reason is DiscardReason.MALFORMED:
            why = record.detail or "undecodable"
            return cls(raw, record, None, f"it was discarded as malformed ({why})")
        committed = record.reason is DiscardReason.UNPUBLISHABLE
        if committed and _MISMATCH_DETAIL in (record.detail or ""):
            return cls(
                raw,
                record,
                None,
                f"it holds the half of another transaction ({record.detail}): "
                "there is nothing of the committed one to publish",
            )
        try:
            return cls(raw, record, record.original_half(), None)
        except MalformedRecordError as exc:
            if committed:  # the relay kept what it knew of a half that was gone
                why = f"it is committed, but its half was not there to keep ({record.detail})"
                return cls(raw, record, None, f"{why}: there is nothing to publish")
            return cls(raw, record, None, f"the discarded half does not decode: {exc}")

    @property
    def position(self) -> tuple[int, int]:
        """Where this discard record is on the discard topic: its identity."""
        return (self.raw.partition, self.raw.offset)

    def field(self, header: Header) -> str | None:
        """A header of the original half, leniently (malformed halves show what they have)."""
        return self.raw.header_text(header.value)

    @property
    def transaction_id(self) -> str | None:
        return self.half.transaction_id if self.half else self.field(Header.TRANSACTION_ID)

    @property
    def discarded_ms(self) -> int:
        return self.record.discarded_ms if self.record else 0

    @property
    def resumable(self) -> bool:
        return self.problem is None

    @property
    def committed(self) -> bool:
        """Whether the relay discarded it at its commit: a resume publishes, not puts back."""
        return self.record is not None and self.record.reason is DiscardReason.UNPUBLISHABLE

    def half_identity(self) -> tuple[int, int]:
        """The discarded half's partition and origin offset, shared by all its copies."""
        assert self.half is not None and self.record is not None, "not resumable"
        return self.record.half_partition, self.half.identity(self.record.half_offset)


def read_discards(
    client_config: dict[str, Any], topics: TopicNames, timeout: float = 60.0
) -> list[DiscardedHalf]:
    """Every discard record up to the topic's current end, with its resume marker if any."""
    return discards_of(read_topic(client_config, topics.discard, timeout=timeout))


def discards_of(records: Iterable[RawRecord]) -> list[DiscardedHalf]:
    """The discard records among ``records`` (a discard topic, in order), each with its marker."""
    markers: dict[tuple[int, int], ResumeMarker] = {}
    discards: list[DiscardedHalf] = []
    for raw in records:
        marker = ResumeMarker.from_record(raw)
        if marker is not None:
            markers.setdefault((marker.discard_partition, marker.discard_offset), marker)
        elif raw.kind() is RecordKind.DISCARD:
            discards.append(DiscardedHalf.of(raw))
        else:
            log.warning("skipping a record of another kind at %s[%d]@%d", *_at(raw))
    for discard in discards:
        discard.resumed = markers.get(discard.position)
    discards.sort(key=lambda d: (d.discarded_ms, d.position))
    return discards


# ------------------------------------------------------------------ resuming


@dataclass
class Resumed:
    transaction_id: str
    source: DiscardedHalf
    marker: ResumeMarker


@dataclass
class ResumeOutcome:
    resumed: list[Resumed] = field(default_factory=list)
    already: list[DiscardedHalf] = field(default_factory=list)
    """Asked for, but resumed before: nothing written (the idempotent case)."""
    refused: list[tuple[str, str]] = field(default_factory=list)
    """(transaction id or position, why) for discards that cannot be resumed."""
    unknown: list[str] = field(default_factory=list)
    """Transaction ids with no discard record at all."""


@dataclass
class ResumePlan:
    """What a resume does for one discarded half: put it back, or publish its real record."""

    chosen: DiscardedHalf
    settles: list[DiscardedHalf]
    """Every not-yet-resumed discard of the half (its copies'): its latest settles them all."""

    @property
    def publishes(self) -> bool:
        """Whether the half is committed (an unpublishable discard): its real record goes out."""
        return self.chosen.committed

    def outgoing(self, topics: TopicNames) -> OutgoingRecord:
        """What the resume writes: the committed half's real record, as the relay would have
        written it; else the half going back, check count reset, same identity."""
        assert self.chosen.half is not None and self.chosen.record is not None
        if self.publishes:
            return self.chosen.half.to_real_record()
        record = self.chosen.record
        return self.chosen.half.resumed(record.half_offset).to_record(topics, record.half_partition)

    def markers(self, written: tuple[str, int, int], resumed_ms: int) -> list[ResumeMarker]:
        """One marker per discard settled, naming where :meth:`outgoing` was ``written``
        (topic, partition, offset): the half's new place, or the published real record."""
        assert self.chosen.half is not None and self.chosen.record is not None
        record = self.chosen.record
        topic, partition, offset = written
        published = Publication(topic, partition, offset) if self.publishes else None
        return [
            ResumeMarker(
                transaction_id=self.chosen.half.transaction_id,
                discard_partition=settled.position[0],
                discard_offset=settled.position[1],
                half_partition=record.half_partition,
                half_offset=record.half_offset if published else offset,
                resumed_ms=resumed_ms,
                published=published,
            )
            for settled in self.settles
        ]


def resume_discards(
    settings: KafkaSettings,
    transaction_ids: Sequence[str] | None,
    *,
    now_ms: Callable[[], int],
    timeout: float = 60.0,
    chunk: int = CHUNK,
    past_op_retention: bool = False,
) -> ResumeOutcome:
    """Put the named discarded halves (all, if ``transaction_ids`` is None) back.

    One copy per discarded half goes back (its latest discard), even if it was
    discarded several times; a reused transaction id names several halves, and
    each of them goes back. Raises :class:`ResumeFencedError` if another
    resume took over mid-way; what was committed before stays committed.

    A discard whose decisions the op topic may no longer hold is refused unless
    ``past_op_retention``: the relay tells a half's first commit from a second
    by the op history, so with a late commit already published and its op
    deleted by retention, the resumed copy's commit would be published again.
    An unpublishable discard (committed) is published instead, once its real
    record can be written; the op history plays no part (module docstring).
    """
    topics = settings.topics
    client = settings.client_config()
    producer_config = transactional_config(
        client,
        resume_transactional_id(topics),
        linger_ms=5,
        transaction_timeout_ms=RESUME_TRANSACTION_TIMEOUT_MS,
    )
    producer = Producer(producer_config)
    try:
        producer.init_transactions(timeout)
    except KafkaException as exc:
        raise KafkaUnavailableError(f"starting the resume transaction: {exc}") from None
    try:
        partitions = _half_partitions(producer, topics, timeout)
        # Read only now: a resume that committed before our init is visible, one
        # that had not is fenced (see the module docstring).
        _wait_until_settled(client, topics.discard, timeout)
        discards = read_discards(client, topics, timeout)
        outcome, plans = plan_resumes(discards, transaction_ids, partitions)
        put_back = [plan for plan in plans if not plan.publishes]
        if not past_op_retention:
            put_back = _within_op_history(put_back, outcome, client, topics, timeout)
        publish = _publishable(
            [plan for plan in plans if plan.publishes], outcome, producer_config, timeout
        )
        plans = put_back + publish
        for start in range(0, len(plans), chunk):
            outcome.resumed += _write(
                producer, topics, plans[start : start + chunk], now_ms, timeout
            )
        _wait_visible(client, [r.marker.published for r in outcome.resumed], timeout)
        return outcome
    finally:
        producer.flush(timeout)


def _wait_until_settled(client_config: dict[str, Any], topic: str, timeout: float) -> None:
    """Wait until every transaction open on ``topic`` now has ended, so a read_committed
    reading sees every record stored so far (the module docstring says why)."""
    admin = AdminClient(client_config)
    try:
        described = admin.list_topics(topic, timeout=timeout).topics.get(topic)
    except KafkaException as exc:
        raise KafkaUnavailableError(f"cannot reach Kafka within {timeout:g}s: {exc}") from None
    if described is None or described.error is not None or not described.partitions:
        raise TopicAdminError(f"topic {topic} does not exist: run `outbox topics create`")
    partitions = sorted(described.partitions)
    stored = end_offsets(admin, topic, partitions, IsolationLevel.READ_UNCOMMITTED, timeout)
    if not _stable_reaches(admin, topic, stored, time.monotonic() + timeout, timeout):
        raise KafkaUnavailableError(
            f"a Kafka transaction open on {topic} did not end within {timeout:g}s; "
            "the resume cannot read every resume marker: run it again later"
        )


def _stable_reaches(
    admin: AdminClient, topic: str, ends: dict[int, int], deadline: float, timeout: float
) -> bool:
    """Wait until ``topic``'s read_committed end offset is at least ``ends[p]`` on each
    partition ``p``; False if ``deadline`` (monotonic) passed first."""
    while True:
        stable = end_offsets(admin, topic, list(ends), IsolationLevel.READ_COMMITTED, timeout)
        if all(stable[p] >= end for p, end in ends.items()):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(SETTLE_PAUSE)


def _wait_visible(
    client_config: dict[str, Any], published: Sequence[Publication | None], timeout: float
) -> None:
    """Wait until a ``read_committed`` reader sees every record the resume published.

    ``commit_transaction`` returns once the coordinator has decided; the markers that make
    the records readable reach their partitions a moment later, or later still behind
    another transaction open there (a relay's). A suite run read the real topic right
    after a resume had published and found nothing. Past ``timeout`` the record is still
    committed and will show: said in a warning, not raised."""
    wanted: dict[str, dict[int, int]] = {}
    """Per topic and partition, the end offset past the last record published there."""
    for place in published:
        if place is not None:
            ends = wanted.setdefault(place.topic, {})
            ends[place.partition] = max(ends.get(place.partition, 0), place.offset + 1)
    if not wanted:
        return
    admin = AdminClient(client_config)
    deadline = time.monotonic() + timeout
    for topic, ends in wanted.items():
        if not _stable_reaches(admin, topic, ends, deadline, timeout):
            log.warning(
                "the records published to %s are committed but not yet visible to"
                " read_committed readers after %gs (a transaction open ahead of them)",
                topic,
                timeout,
            )
            return


def _half_partitions(producer: Producer, topics: TopicNames, timeout: float) -> int:
    try:
        metadata = producer.list_topics(topics.half, timeout=timeout)
    except KafkaException as exc:
        raise KafkaUnavailableError(f"cannot reach Kafka within {timeout:g}s: {exc}") from None
    topic = metadata.topics.get(topics.half)
    if topic is None or topic.error is not None or not topic.partitions:
        raise TopicAdminError(f"topic {topics.half} does not exist: run `outbox topics create`")
    return len(topic.partitions)


def plan_resumes(
    discards: list[DiscardedHalf], transaction_ids: Sequence[str] | None, partitions: int
) -> tuple[ResumeOutcome, list[ResumePlan]]:
    """What :func:`resume_discards` would do with ``discards`` (read from the discard topic,
    markers included), writing nothing: one plan per discarded half asked for (all open
    ones if ``transaction_ids`` is None), and in the outcome the ids already resumed,
    unknown or refused. ``partitions``: the half topic's partition count. The op history
    (``past_op_retention``) and the real topics' limits are not consulted here."""
    outcome = ResumeOutcome()
    by_id: dict[str, list[DiscardedHalf]] = {}
    for discard in discards:
        by_id.setdefault(discard.transaction_id or "", []).append(discard)
    if transaction_ids is None:
        wanted = [tid for tid, found in by_id.items() if any(d.resumed is None for d in found)]
    else:
        wanted = list(dict.fromkeys(transaction_ids))
    plans: list[ResumePlan] = []
    for transaction_id in wanted:
        found = by_id.get(transaction_id, [])
        if not found:
            outcome.unknown.append(transaction_id)
            continue
        open_ = [d for d in found if d.resumed is None]
        if not open_:
            outcome.already.append(max(found, key=_latest))
            continue
        by_half: dict[tuple[int, int], list[DiscardedHalf]] = {}
        for discard in open_:
            problem = discard.problem
            if problem is None and discard.record and discard.record.half_partition >= partitions:
                problem = (
                    f"its half partition {discard.record.half_partition} does not exist "
                    f"(the half topic has {partitions})"
                )
            if problem is None:
                by_half.setdefault(discard.half_identity(), []).append(discard)
            else:
                label = transaction_id or "discard at {}@{}".format(*discard.position)
                outcome.refused.append((label, problem))
        # One half back per discarded half, never per id: a reused id names several halves,
        # and each must be asked about (a discard settled by another's copy is lost).
        plans += [ResumePlan(_chosen(usable), usable) for usable in by_half.values()]
    return outcome, plans


def _chosen(usable: list[DiscardedHalf]) -> DiscardedHalf:
    """The discard a half's resume acts on: its latest, or its latest committed one (a
    half the relay found committed is published; put back, it would publish nothing)."""
    committed = [discard for discard in usable if discard.committed]
    return max(committed or usable, key=_latest)


def _publishable(
    plans: list[ResumePlan],
    outcome: ResumeOutcome,
    producer_config: dict[str, Any],
    timeout: float,
) -> list[ResumePlan]:
    """The publishing plans whose real record can be written now; the others refused,
    in one line naming the cause, and left resumable for a later run."""
    if not plans:
        return plans
    catalog = TopicCatalog(AdminClient(producer_config), timeout, principal_of(producer_config))
    limits = SizeLimits(catalog, producer_config)
    kept = []
    for plan in plans:
        assert plan.chosen.half is not None
        problem = real_record_problem(catalog, limits, plan.chosen.half.to_real_record())
        if problem is None:
            kept.append(plan)
            continue
        outcome.refused.append(
            (
                plan.chosen.half.transaction_id,
                f"it is committed but its real record still cannot be published: {problem}; "
                "fix that and resume it again",
            )
        )
    return kept


def _within_op_history(
    plans: list[ResumePlan],
    outcome: ResumeOutcome,
    client_config: dict[str, Any],
    topics: TopicNames,
    timeout: float,
) -> list[ResumePlan]:
    """The plans whose half's decisions are all still in the op topic; the others refused."""
    if not plans:
        return plans
    consumer = Consumer({**client_config, "group.id": resume_history_group(topics)})
    try:
        kept = []
        for plan in plans:
            assert plan.chosen.half is not None and plan.chosen.record is not None
            partition = plan.chosen.record.half_partition
            since_ms = plan.chosen.half.born_ms - CLOCK_MARGIN_MS
            ops = TopicPartition(topics.op, partition)
            if _op_history_covers(consumer, ops, since_ms, timeout):
                kept.append(plan)
                continue
            outcome.refused.append(
                (
                    plan.chosen.half.transaction_id,
                    f"the op history of partition {partition} no longer reaches back to its "
                    "half (retention deleted older decisions): were it committed before, its "
                    "commit published, a resumed copy would be published a second time; "
                    "pass --past-op-retention to resume it all the same",
                )
            )
        return kept
    finally:
        consumer.close()


def _op_history_covers(
    consumer: Consumer, partition: TopicPartition, since_ms: int, timeout: float
) -> bool:
    """Whether ``partition`` of the op topic still holds every op written since ``since_ms``:
    nothing was ever deleted from it, or a retained op is older than that (retention
    deletes the oldest first)."""
    try:
        low, high = consumer.get_watermark_offsets(partition, timeout=timeout)
        if low == 0:
            return True
        (first,) = consumer.offsets_for_times(
            [TopicPartition(partition.topic, partition.partition, max(0, since_ms))],
            timeout=timeout,
        )
    except KafkaException as exc:
        where = f"{partition.topic}[{partition.partition}]"
        raise KafkaUnavailableError(f"reading the op history of {where}: {exc}") from None
    if first.offset < 0 or first.offset >= high:  # every op retained is older
        return high > low
    return first.offset > low


def _latest(discard: DiscardedHalf) -> tuple[int, tuple[int, int]]:
    return (discard.discarded_ms, discard.position)


def _write(
    producer: Producer,
    topics: TopicNames,
    plans: list[ResumePlan],
    now_ms: Callable[[], int],
    timeout: float,
) -> list[Resumed]:
    """One Kafka transaction: the halves back and the real records of the committed ones,
    then the markers naming where they went."""
    try:
        producer.begin_transaction()
        written: list[list[tuple[str, int, int]]] = []
        for plan in plans:
            where: list[tuple[str, int, int]] = []
            record = plan.outgoing(topics)
            producer.produce(**record.produce_kwargs(), on_delivery=_remember_place(where))
            written.append(where)
        if producer.flush(timeout) > 0 or not all(written):
            raise KafkaException(
                KafkaError(KafkaError._TIMED_OUT, "records not acknowledged at known offsets")
            )
        resumed_ms = now_ms()
        done: list[Resumed] = []
        for plan, where in zip(plans, written, strict=True):
            for settled, marker in zip(
                plan.settles, plan.markers(where[0], resumed_ms), strict=True
            ):
                producer.produce(**marker.to_record(topics).produce_kwargs())
                if settled is plan.chosen:
                    done.append(Resumed(marker.transaction_id, settled, marker))
        producer.commit_transaction(timeout)
        return done
    except KafkaException as exc:
        error: KafkaError = exc.args[0]
        try:
            if not error.fatal():
                producer.abort_transaction(timeout)
        except KafkaException as abort_exc:
            log.debug("abort after a failed resume: %s", abort_exc)
        if error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED) or (
            "fenced" in str(error).lower()
        ):
            raise ResumeFencedError(
                "another `outbox discard resume` started meanwhile and took over; "
                "run `outbox discard list` to see what is still discarded"
            ) from None
        raise KafkaUnavailableError(f"resuming discarded halves: {error}") from None


def _remember_place(into: list[tuple[str, int, int]]) -> Callable[[KafkaError | None, Any], None]:
    """:func:`remember_offset`, with the topic and partition: a real record's partition is the
    partitioner's choice, and its marker names it."""
    offsets: list[int] = []
    remember = remember_offset(offsets)

    def delivered(error: KafkaError | None, message: Any) -> None:
        if error is not None:  # a fenced producer's report: asking it for more raises
            return
        remember(error, message)
        if offsets:
            into.append((message.topic(), message.partition(), offsets[-1]))

    return delivered
