"""Draining parked sends: the events a producer kept in its transaction log while Kafka was away.

A producer with ``park_when_unavailable`` whose half Kafka did not acknowledge in
time commits the event in its log row (``parked_half``) instead. The owner of half
partition p publishes the parked rows of p through RocketMQ's own path, so one
rule decides every event:

1. **Claim** (one database transaction): the rows are read (``FOR UPDATE SKIP
   LOCKED`` on PostgreSQL) and each gets ``drain_from_offset``, the half
   partition's end offset now, unless an earlier attempt set it already.
2. **Write** (one Kafka transaction, the round writer's): each parked half,
   marked with ``outbox-parked-ms``, and a COMMIT op for it, with the partition's
   checkpoint re-committed under the checker group's metadata, so a replica that
   lost the partition in a rebalance is fenced (KIP-447) and writes nothing. The
   relay publishes the half as any committed one, exactly once.
3. **Confirm** (one database transaction): the row now names the half written
   (``half_partition``, ``half_offset``) and ``parked_half`` is cleared
   (``drain_from_offset`` stays: a drained row).

Exactly once, whatever crashes: a crash before 2 commits leaves nothing in Kafka
and the row parked (drained again). A crash between 2 and 3 leaves the half in
Kafka and the row parked with ``drain_from_offset`` set: before writing such a
row again, the drain reads its half partition from that offset (a half it
writes is always stored at or after it) for a parked half of the row's
transaction id, and confirms the row with it instead. The send's own half, if
Kafka stored it after the send gave up on it, is never published: it has no op,
and its check-back answers ROLLBACK because its row is parked
(:class:`outbox.sql.TransactionLogRule`), or names the drained half afterwards.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC
from enum import Enum
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from outbox.protocol import HalfRecord, MalformedRecordError
from outbox.protocol.parked import decode_parked_half
from outbox.sql import LogTarget, create_engine
from outbox.sql.engine import connect
from outbox.sql.log import missing_part, outdated_table_error, require_table, transaction_log_table
from outbox_checker import metrics
from outbox_checker.entries import HalfEntry

log = logging.getLogger(__name__)

DEFAULT_BATCH = 500
"""Parked rows drained per partition in one Kafka transaction."""


@dataclass(frozen=True)
class ParkedRow:
    transaction_id: str
    parked_half: bytes
    drain_from_offset: int | None
    created_at: Any


@dataclass
class DrainReport:
    partition: int
    drained: int = 0
    recovered: int = 0
    """Rows whose half an earlier, interrupted drain had written already: confirmed only."""
    unreadable: int = 0


class DrainTrigger(Enum):
    INTERVAL = "interval"
    ASSIGNED = "assigned"
    """The replica's half partitions changed: after an outage, its assignment came back."""


@dataclass
class DrainSchedule:
    """When the checker's loop looks for parked sends: every ``interval_seconds``, and at
    once when the group gave the replica an assignment. After an outage a replica gets
    its partitions back with a round due, which can take seconds on the backlog the
    outage left; the parked sends of those partitions are published first."""

    interval_seconds: float
    last_at: float | None = None
    last_generation: int = 0
    """The assignment last drained after (:attr:`HalfOwnership.generation`)."""

    def due(
        self, now: float, *, generation: int, assigned_only: bool = False
    ) -> DrainTrigger | None:
        """Whether to drain now, and why; ``assigned_only``: only for a new assignment."""
        if generation != self.last_generation:
            self.last_at, self.last_generation = now, generation
            return DrainTrigger.ASSIGNED
        if assigned_only or (
            self.last_at is not None and now - self.last_at < self.interval_seconds
        ):
            return None
        self.last_at = now
        return DrainTrigger.INTERVAL


WriteHalves = Callable[[int, list[HalfRecord]], list[tuple[str, int]]]
"""``write(partition, halves)``: the halves and their COMMIT ops in one fenced Kafka
transaction; the (transaction id, offset) of each half written."""


class ParkedDrain:
    """Publishes the parked rows of the half partitions this replica owns."""

    def __init__(
        self,
        url_or_engine: str | Engine,
        *,
        table: str,
        schema: str | None,
        batch_size: int = DEFAULT_BATCH,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._engine = (
            create_engine(url_or_engine, pool_pre_ping=True)
            if isinstance(url_or_engine, str)
            else url_or_engine
        )
        target = LogTarget(table, schema)
        self._table = transaction_log_table(target.table, target.schema)
        self._batch_size = batch_size
        self._clock = clock

    def close(self) -> None:
        self._engine.dispose()

    def drain(
        self,
        partition: int,
        end_offset: Callable[[], int],
        halves_from: Callable[[int], Iterable[HalfEntry]],
        write: WriteHalves,
    ) -> DrainReport:
        """Publish up to a batch of partition ``partition``'s parked rows; see the module docs.

        ``end_offset()`` is the half partition's end now; ``halves_from(offset)`` reads
        its committed halves from ``offset`` to its end.
        """
        report = DrainReport(partition)
        rows = self._claim(partition, end_offset)
        if not rows:
            return report
        attempted = {row.transaction_id for row in rows if row.drain_from_offset is not None}
        if attempted:
            start = min(row.drain_from_offset for row in rows if row.drain_from_offset is not None)
            found = _written_already(halves_from(start), attempted)
            if found:
                log.warning(
                    "%d parked sends of partition %d were written by a drain that did not "
                    "confirm them (a crash?): confirming, not writing them again",
                    len(found),
                    partition,
                )
                self._confirm(partition, list(found.items()))
                report.recovered = len(found)
            rows = [row for row in rows if row.transaction_id not in found]
        halves = self._readable(rows, report)
        if not halves:
            return report
        written = write(partition, halves)
        self._confirm(partition, written)
        report.drained = len(written)
        metrics.PARKED_DRAINED.inc(len(written))
        log.info("published %d parked sends of half partition %d", len(written), partition)
        return report

    def waiting(self, partitions: Sequence[int]) -> list[int]:
        """Which of ``partitions`` have parked rows (one query on the partial index); sets
        the parked-rows gauges of each."""
        if not partitions:
            return []
        with self._engine.connect() as connection:
            found = parked_by_partition(connection, self._table, partitions)
        now = self._clock()
        for partition in partitions:
            count, oldest = found.get(partition, (0, None))
            label = str(partition)
            metrics.PARKED_ROWS.labels(label).set(count)
            age = 0.0 if oldest is None else max(0.0, now - epoch_seconds(oldest))
            metrics.OLDEST_PARKED_AGE.labels(label).set(age)
        return sorted(found)

    def _claim(self, partition: int, end_offset: Callable[[], int]) -> list[ParkedRow]:
        """Read up to a batch of parked rows of ``partition`` and mark each as set out to drain.

        The partition's end is asked for only when a row is claimed for the first time."""
        table = self._table
        select = (
            sa.select(
                table.c.transaction_id,
                table.c.parked_half,
                table.c.drain_from_offset,
                table.c.created_at,
            )
            .where(table.c.parked_half.is_not(None), table.c.half_partition == partition)
            .order_by(table.c.created_at)
            .limit(self._batch_size)
            .with_for_update(skip_locked=True)
        )
        with self._engine.begin() as connection:
            rows = [ParkedRow(*row) for row in connection.execute(select)]
            fresh = [row.transaction_id for row in rows if row.drain_from_offset is None]
            if fresh:
                end = end_offset()
                # Kept from the first attempt on: a half any attempt wrote is at or after it.
                connection.execute(
                    table.update()
                    .where(table.c.transaction_id.in_(fresh), table.c.drain_from_offset.is_(None))
                    .values(drain_from_offset=end)
                )
        return rows

    def _readable(self, rows: Sequence[ParkedRow], report: DrainReport) -> list[HalfRecord]:
        drained_ms = int(self._clock() * 1000)
        halves = []
        for row in rows:
            try:
                half = decode_parked_half(row.parked_half, where=f"log row {row.transaction_id}")
            except MalformedRecordError as exc:
                report.unreadable += 1
                log.error(
                    "parked send %s cannot be read from the transaction log, left there: %s",
                    row.transaction_id,
                    exc,
                )
                continue
            if half.transaction_id != row.transaction_id:
                report.unreadable += 1
                log.error(
                    "parked send %s holds the half of transaction %s, left there",
                    row.transaction_id,
                    half.transaction_id,
                )
                continue
            halves.append(replace(half, parked_ms=drained_ms))
        return halves

    def _confirm(self, partition: int, written: Sequence[tuple[str, int]]) -> None:
        """The rows name the halves written for them, and are parked no more."""
        if not written:
            return
        table = self._table
        statement = (
            table.update()
            .where(
                table.c.transaction_id == sa.bindparam("id"),
                table.c.parked_half.is_not(None),
            )
            .values(  # drain_from_offset stays: the row says it was parked, and drained
                half_partition=partition,
                half_offset=sa.bindparam("offset"),
                parked_half=None,
            )
        )
        with self._engine.begin() as connection:
            connection.execute(
                statement, [{"id": txid, "offset": offset} for txid, offset in written]
            )


def _written_already(entries: Iterable[HalfEntry], wanted: set[str]) -> dict[str, int]:
    """The offset of a drained (parked-marked) half of each wanted transaction id."""
    found: dict[str, int] = {}
    for entry in entries:
        half = entry.half
        if half is not None and half.parked_ms is not None and half.transaction_id in wanted:
            found.setdefault(half.transaction_id, entry.offset)
    return found


def parked_by_partition(
    connection: sa.Connection, table: sa.Table, partitions: Sequence[int] | None = None
) -> dict[int, tuple[int, Any]]:
    """Half partition -> (parked rows, when the oldest was committed), of ``partitions``
    (all when None): one query on the parked rows' partial index."""
    query = (
        sa.select(table.c.half_partition, sa.func.count(), sa.func.min(table.c.created_at))
        .where(table.c.parked_half.is_not(None))
        .group_by(table.c.half_partition)
    )
    if partitions is not None:
        query = query.where(table.c.half_partition.in_(partitions))
    return {row[0]: (row[1], row[2]) for row in connection.execute(query)}


@dataclass(frozen=True)
class ParkedSummary:
    """What ``outbox status --db`` shows of the parked sends waiting in the log."""

    rows: int
    oldest_age_seconds: float | None
    by_partition: dict[int, int]


def read_parked(url: str, *, table: str, schema: str | None, now: float) -> ParkedSummary:
    """The parked sends waiting in the transaction log at ``url``, by half partition.

    Raises DatabaseUnavailableError or TransactionLogMissingError (naming the fix).
    """
    target = LogTarget(table, schema)
    engine = create_engine(url)
    try:
        with connect(engine) as connection:
            require_table(connection, target)
            if (part := missing_part(connection, target)) is not None:
                raise outdated_table_error(target, part, engine.url)
            found = parked_by_partition(
                connection, transaction_log_table(target.table, target.schema)
            )
    finally:
        engine.dispose()
    oldest = min((epoch_seconds(at) for _, at in found.values()), default=None)
    return ParkedSummary(
        rows=sum(count for count, _ in found.values()),
        oldest_age_seconds=None if oldest is None else max(0.0, now - oldest),
        by_partition={partition: count for partition, (count, _) in sorted(found.items())},
    )


def epoch_seconds(created_at: Any) -> float:
    """A log time as seconds since the epoch: SQLite gives it back without its UTC offset."""
    if created_at.tzinfo is None:
        created_at = created_at.replace(tzinfo=UTC)
    return float(created_at.timestamp())
