"""``outbox status``: where the checker stands on each half partition, read from Kafka alone.

An operator asking "is the checker keeping up, and how much is waiting?" should
not need the checker's metrics endpoint (there may be no replica running, which
is exactly when the question matters). Everything needed is in Kafka: the half
checkpoint is the committed offset of the checker's consumer group on the half
partition, the op checkpoint rides in its commit metadata
(:func:`checker.round_writer.decode_checkpoint`), and what is pending can be
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
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from rich.table import Table

from checker.kafka_reader import TopicCursor
from checker.relay import relay_group
from checker.round_writer import decode_checkpoint
from outbox.cli_options import BootstrapOption, PrefixOption, PropertiesOption, kafka_settings
from outbox.config import KafkaSettings
from outbox.console import make_console
from outbox.errors import KafkaUnavailableError, TopicAdminError
from outbox.protocol import DEFAULT_PREFIX, Header, RawRecord

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
        raise ValueError(f"scan limit must be at least 1, got {scan_limit}")
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
    watermarks = Consumer({**client, "group.id": f"outbox-status-{group}"})
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


# ------------------------------------------------------------------ showing it


def format_age(seconds: float | None) -> str:
    """A short human age: 42s, 5m03s, 2h10m, 3d04h."""
    if seconds is None:
        return "-"
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, mins = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{mins:02d}m"
    days, hrs = divmod(hours, 24)
    return f"{days}d{hrs:02d}h"


def status_table(status: CheckerStatus, title: str) -> Table:
    table = Table(title=title)
    for column in (
        "partition",
        "half end",
        "half checkpoint",
        "op checkpoint",
        "lag",
        "pending",
        "oldest pending",
        "unrelayed",
        "owner",
    ):
        table.add_column(column, justify="left" if column == "owner" else "right")
    for part in status.partitions:
        oldest = None
        if part.oldest_pending_born_ms is not None:
            oldest = (status.read_at_ms - part.oldest_pending_born_ms) / 1000
        pending = f"≥{part.pending:,}" if part.capped else f"{part.pending:,}"
        if part.malformed:
            pending += f" (+{part.malformed} malformed)"
        table.add_row(
            str(part.partition),
            f"{part.half_end:,}",
            "-" if part.half_checkpoint is None else f"{part.half_checkpoint:,}",
            "-" if part.op_checkpoint is None else f"{part.op_checkpoint:,}",
            f"{part.lag:,}",
            pending,
            format_age(oldest),
            f"{part.unrelayed:,}",
            part.owner or "-",
        )
    return table


def show_status(status: CheckerStatus, where: str) -> None:
    console = make_console()
    console.print(status_table(status, f"checker {status.group} on {status.half_topic} ({where})"))
    total = sum(p.pending for p in status.partitions)
    capped = [p.partition for p in status.partitions if p.capped]
    bound = "at least " if capped else ""
    console.print(
        f"pending: {bound}{total:,} transaction(s) over {len(status.partitions)} half partition(s)",
        highlight=False,
    )
    unrelayed = sum(p.unrelayed for p in status.partitions)
    console.print(
        f"waiting for the relay: {unrelayed:,} op record(s)"
        + (
            " (no event of theirs is on a real topic yet; is a checker running?)"
            if unrelayed
            else ""
        ),
        highlight=False,
    )
    if capped:
        console.print(
            f"note: partitions {', '.join(map(str, capped))} have more than "
            f"{status.scan_limit:,} halves or ops past their checkpoint; only the first "
            f"{status.scan_limit:,} were read (raise --scan-limit for an exact count)",
            highlight=False,
        )
    if all(p.half_checkpoint is None for p in status.partitions):
        running = any(p.owner for p in status.partitions)
        console.print(
            f"note: group {status.group} has committed no checkpoint yet"
            + (
                " (its replicas have not settled a half so far)"
                if running
                else ": has `outbox checker` run against these topics (same --prefix, --group)?"
            ),
            highlight=False,
        )


GroupOption = Annotated[
    str | None,
    typer.Option(
        "--group",
        envvar="OUTBOX_CONSUMER_GROUP",
        help="Consumer group of the checker replicas; default '<prefix>.checker'.",
        show_default=False,
    ),
]
ScanLimitOption = Annotated[
    int,
    typer.Option(
        "--scan-limit",
        min=1,
        help="Most halves (and ops) read per partition past the checkpoints to count pending.",
    ),
]


def status(
    group: GroupOption = None,
    scan_limit: ScanLimitOption = DEFAULT_SCAN_LIMIT,
    bootstrap: BootstrapOption = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
    properties: PropertiesOption = None,
) -> None:
    """Show the checker's checkpoints and pending halves per half partition."""
    settings = kafka_settings(bootstrap, prefix, properties)
    checker_group = group or f"{settings.topic_prefix}.checker"
    result = read_status(settings, checker_group, scan_limit=scan_limit)
    show_status(result, settings.bootstrap_servers)


def register(app: typer.Typer) -> None:
    """Add ``outbox status`` to the top-level command line."""
    app.command("status")(status)


def iso_ms(epoch_ms: int | None) -> str:
    """A UTC timestamp to the second, for tables."""
    if epoch_ms is None:
        return "-"
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
