"""``outbox status``: where the checker stands on each half partition, read from Kafka alone.

An operator asking "is the checker keeping up, and how much is waiting?" should
not need the checker's metrics endpoint (there may be no replica running, which
is exactly when the question matters). Everything needed is in Kafka: the half
checkpoint is the committed offset of the checker's consumer group on the half
partition, the op checkpoint rides in its commit metadata
(:func:`outbox_checker.names.decode_checkpoint`), and what is pending can be
counted by reading from those checkpoints to the end.

*Pending* here is: a distinct transaction id among the halves at or after the
half checkpoint that has no op in the paired op partition at or after the op
checkpoint. That is what the next round would have to settle (check, put back
or discard); ops before the op checkpoint only end halves before the half
checkpoint, bar a late direct end racing a put-back, which the producer's
late-end refusal closes. Reads are ``read_committed`` (an aborted put-back is not
pending) and capped per partition, so a huge backlog cannot make the command
hang; a capped count is shown as a lower bound and said so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from outbox.config import KafkaSettings
from outbox.errors import ConfigurationError, KafkaUnavailableError, TopicAdminError
from outbox.protocol import Header, RawRecord
from outbox_checker.kafka_reader import TopicCursor
from outbox_checker.names import decode_checkpoint, relay_group, status_group

DEFAULT_SCAN_LIMIT = 100_000
_READ_BATCH = 500
_BORN_MS = Header.BORN_MS.value


@dataclass
class PartitionStatus:
    """One half partition as the checker left it, and what waits there."""

    partition: int
    half_low: int
    half_end: int
    op_end: int
    half_checkpoint: int | None
    """Committed offset of the checker group; ``None`` if it never committed one."""
    op_checkpoint: int | None
    pending: int = 0
    """Distinct transactions without an op, among the halves scanned."""
    oldest_pending_born_ms: int | None = None
    halves_scanned: int = 0
    ops_scanned: int = 0
    malformed: int = 0
    """Halves that do not decode: the next round discards them (reason malformed)."""
    capped: bool = False
    """True when the scan stopped at the limit: ``pending`` is then a lower bound."""
    owner: str | None = None
    """The checker replica (client id @ host) that owns the partition now, if any."""
    op_low: int = 0
    relay_offset: int | None = None
    """Committed offset of the relay group on the op partition; ``None``: never relayed."""

    @property
    def lag(self) -> int:
        """Records between the half checkpoint (or the start) and the end."""
        start = self.half_checkpoint if self.half_checkpoint is not None else self.half_low
        return max(0, self.half_end - max(start, self.half_low))

    @property
    def lost_to_retention(self) -> int:
        """Halves past the checkpoint that retention deleted before the checker read them:
        any without a decision is lost (the checker reports them too, when it is back)."""
        if self.half_checkpoint is None:
            return 0
        return max(0, self.half_low - self.half_checkpoint)

    @property
    def unrelayed(self) -> int:
        """Op records the relay has not consumed yet: decisions whose events are not out."""
        start = self.relay_offset if self.relay_offset is not None else self.op_low
        return max(0, self.op_end - max(start, self.op_low))


@dataclass
class CheckerStatus:
    group: str
    half_topic: str
    partitions: list[PartitionStatus] = field(default_factory=list)
    scan_limit: int = DEFAULT_SCAN_LIMIT
    read_at_ms: int = 0


def read_status(
    settings: KafkaSettings,
    group: str,
    *,
    scan_limit: int = DEFAULT_SCAN_LIMIT,
    timeout: float = 30.0,
    now_ms: Callable[[], int] | None = None,
) -> CheckerStatus:
    """Checkpoints, ends and pending counts of every half partition.

    Raises :class:`TopicAdminError` when the half or op topic is missing and
    :class:`KafkaUnavailableError` when Kafka does not answer.
    """
    if scan_limit < 1:
        raise ConfigurationError(f"scan limit must be at least 1, got {scan_limit}")
    topics = settings.topics
    client = settings.client_config()
    admin = AdminClient(client)
    counts = _partition_counts(admin, (topics.half, topics.op), timeout)
    half_count = counts[topics.half]
    if counts[topics.op] != half_count:
        raise TopicAdminError(
            f"{topics.half} has {half_count} partitions but {topics.op} has "
            f"{counts[topics.op]}; they must match (half partition p pairs with op partition p)"
        )
    committed = _committed(client, group, topics.half, half_count, timeout)
    relayed = _committed(client, relay_group(group), topics.op, half_count, timeout)
    owners = _owners(admin, group, topics.half, timeout)
    status = CheckerStatus(group, topics.half, scan_limit=scan_limit)
    watermarks = Consumer({**client, "group.id": status_group(group)})
    halves = TopicCursor(client, topics.half, timeout)
    ops = TopicCursor(client, topics.op, timeout)
    try:
        for partition in range(half_count):
            half_low, half_end = _watermarks(watermarks, topics.half, partition, timeout)
            op_low, op_end = _watermarks(watermarks, topics.op, partition, timeout)
            offset, metadata = committed.get(partition, (None, None))
            op_checkpoint = decode_checkpoint(metadata) if offset is not None else None
            part = PartitionStatus(
                partition,
                half_low=half_low,
                half_end=half_end,
                op_end=op_end,
                half_checkpoint=offset,
                op_checkpoint=op_checkpoint,
                owner=owners.get(partition),
                op_low=op_low,
                relay_offset=relayed.get(partition, (None, None))[0],
            )
            half_start = max(offset if offset is not None else half_low, half_low)
            op_start = max(op_checkpoint if op_checkpoint is not None else op_low, op_low)
            _count_pending(part, halves, ops, half_start, op_start, scan_limit)
            status.partitions.append(part)
    except KafkaException as exc:
        raise KafkaUnavailableError(f"reading the checker's status: {exc}") from None
    finally:
        for closer in (halves.close, ops.close, watermarks.close):
            closer()
    status.read_at_ms = now_ms() if now_ms is not None else int(time.time() * 1000)
    return status


def _partition_counts(admin: AdminClient, names: tuple[str, ...], timeout: float) -> dict[str, int]:
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise KafkaUnavailableError(f"cannot reach Kafka within {timeout:g}s: {exc}") from None
    counts: dict[str, int] = {}
    for name in names:
        topic = metadata.topics.get(name)
        if topic is None or not topic.partitions:
            raise TopicAdminError(
                f"topic {name} does not exist: create the outbox topics with "
                "`outbox topics create` (and check --prefix)"
            )
        counts[name] = len(topic.partitions)
    return counts


def _committed(
    client: dict[str, Any], group: str, topic: str, partitions: int, timeout: float
) -> dict[int, tuple[int, str | None]]:
    """The group's committed offset and metadata per partition.

    Read the way the checker reads them (``Consumer.committed`` with
    ``read_committed``, which asks for stable offsets): a checkpoint inside a
    checker transaction not committed yet is waited for, not shown as absent.
    The consumer never subscribes, so it does not join the checker's group.
    (The admin API's ``list_consumer_group_offsets`` was the first choice; with
    librdkafka 2.16 it crashed the process, SIGSEGV, in 4 of 10 tries against a
    broker still loading its group coordinator.)
    """
    consumer = Consumer(
        {
            **client,
            "group.id": group,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    wanted = [TopicPartition(topic, p) for p in range(partitions)]
    deadline = time.monotonic() + timeout
    pause = 0.1
    try:
        while True:
            problem: object = None
            try:
                result = consumer.committed(wanted, timeout=max(1.0, deadline - time.monotonic()))
            except KafkaException as exc:
                problem = exc.args[0]
            else:
                problem = next((tp.error for tp in result if tp.error is not None), None)
                if problem is None:
                    break
            if not _retriable(problem):
                raise KafkaUnavailableError(f"reading the offsets of group {group}: {problem}")
            if time.monotonic() + pause > deadline:
                raise KafkaUnavailableError(
                    f"reading the offsets of group {group}: still {problem} after {timeout:g}s"
                )
            time.sleep(pause)
            pause = min(pause * 2, 2.0)
    finally:
        consumer.close()
    return {
        tp.partition: (tp.offset, tp.metadata)
        for tp in result
        if tp.offset != OFFSET_INVALID and tp.offset >= 0
    }


_RETRIABLE = frozenset(
    (
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
        KafkaError.UNSTABLE_OFFSET_COMMIT,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
    )
)


def _retriable(error: object) -> bool:
    """Errors worth asking again (the broker's flag is not always set on admin results)."""
    return isinstance(error, KafkaError) and (error.retriable() or error.code() in _RETRIABLE)


def _owners(admin: AdminClient, group: str, topic: str, timeout: float) -> dict[int, str]:
    """Which member of the checker group owns each half partition (best effort)."""
    try:
        (future,) = admin.describe_consumer_groups([group], request_timeout=timeout).values()
        description = future.result(timeout=timeout)
    except (KafkaException, ValueError):
        return {}  # only decoration: the numbers do not depend on it
    owners: dict[int, str] = {}
    for member in description.members or []:
        assignment = member.assignment.topic_partitions if member.assignment else []
        for tp in assignment:
            if tp.topic == topic:
                owners[tp.partition] = f"{_member_name(member)}@{member.host.lstrip('/')}"
    return owners


def _member_name(member: Any) -> str:
    """The static instance id if set, else the client id and the start of the member id.

    librdkafka's client id defaults to "rdkafka" for every replica; the member
    id (client id, dash, uuid) tells them apart.
    """
    if member.group_instance_id:
        return str(member.group_instance_id)
    return str(member.member_id)[: len(member.client_id) + 9]


def _watermarks(consumer: Consumer, topic: str, partition: int, timeout: float) -> tuple[int, int]:
    try:
        low, high = consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=timeout
        )
    except KafkaException as exc:
        raise KafkaUnavailableError(f"watermarks of {topic}[{partition}]: {exc}") from None
    return int(low), int(high)


def _read_until(
    cursor: TopicCursor, partition: int, start: int, end: int, limit: int
) -> tuple[list[RawRecord], bool]:
    """Committed records in [start, end), at most ``limit``; whether the limit cut it short."""
    records: list[RawRecord] = []
    offset = start
    while offset < end and len(records) < limit:
        batch = cursor.read(partition, offset, min(_READ_BATCH, limit - len(records)))
        if not batch:
            break
        records.extend(r for r in batch if r.offset < end)
        offset = batch[-1].offset + 1
    return records, len(records) >= limit and offset < end


def _count_pending(
    part: PartitionStatus,
    halves: TopicCursor,
    ops: TopicCursor,
    half_start: int,
    op_start: int,
    limit: int,
) -> None:
    half_records, halves_capped = _read_until(
        halves, part.partition, half_start, part.half_end, limit
    )
    op_records, ops_capped = _read_until(ops, part.partition, op_start, part.op_end, limit)
    part.halves_scanned, part.ops_scanned = len(half_records), len(op_records)
    part.capped = halves_capped or ops_capped
    ended = {tid for raw in op_records if (tid := raw.header_text(Header.TRANSACTION_ID.value))}
    pending: set[str] = set()
    for raw in half_records:
        transaction_id = raw.header_text(Header.TRANSACTION_ID.value)
        born = raw.header_text(_BORN_MS)
        if transaction_id is None or born is None or not born.isdigit():
            part.malformed += 1
            continue
        if transaction_id in ended or transaction_id in pending:
            continue
        pending.add(transaction_id)
        born_ms = int(born)
        if part.oldest_pending_born_ms is None or born_ms < part.oldest_pending_born_ms:
            part.oldest_pending_born_ms = born_ms
    part.pending = len(pending)
