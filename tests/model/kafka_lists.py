"""Kafka as the protocol model sees it: partitions as lists of committed records.

What the model relies on Kafka for, and nothing more: order within a
partition, offsets taken when a record is written (so an aborted Kafka
transaction leaves a gap, and every transaction a marker), ``LogAppendTime``
timestamps, ``read_committed`` reads (only committed records), and atomic
transactions (a writer's records become visible together at its commit, or
never). Readers iterate lazily, as a consumer does: a record committed while a
reader is part-way through is seen when it gets there.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass, field

from outbox.protocol import OutgoingRecord, RawRecord


@dataclass(eq=False)
class Partition:
    """One partition: its committed records, and its end (the high watermark)."""

    topic: str
    number: int = 0
    records: list[RawRecord] = field(default_factory=list)
    end: int = 0
    """Committed records, aborted ones and transaction markers all take offsets."""

    def append(self, record: OutgoingRecord, stored_ms: int) -> int:
        """A record written outside any Kafka transaction (an idempotent producer's)."""
        raw = self.take_offset(record, stored_ms)
        self.records.append(raw)
        return raw.offset

    def take_offset(self, record: OutgoingRecord, stored_ms: int) -> RawRecord:
        """The record as stored at the next offset, not yet visible."""
        raw = RawRecord(
            record.topic,
            self.number,
            self.end,
            record.key,
            record.value,
            tuple(record.headers),
            stored_ms,
        )
        self.end += 1
        return raw

    def read(self, start: int) -> Iterator[RawRecord]:
        """Committed records from ``start`` on, lazily, to whatever end there is when reached."""
        index = bisect.bisect_left(self.records, start, key=lambda raw: raw.offset)
        while index < len(self.records):
            yield self.records[index]
            index += 1

    def at(self, offset: int) -> RawRecord | None:
        index = bisect.bisect_left(self.records, offset, key=lambda raw: raw.offset)
        if index < len(self.records) and self.records[index].offset == offset:
            return self.records[index]
        return None

    def offset_for_time(self, timestamp_ms: int) -> int:
        """``offsetsForTimes``: the first committed record stored at or after it, else the end."""
        for raw in self.records:
            if raw.timestamp_ms is not None and raw.timestamp_ms >= timestamp_ms:
                return raw.offset
        return self.end


class Transaction:
    """One Kafka transaction: offsets taken as records are produced, visible only at commit."""

    def __init__(self) -> None:
        self._produced: list[tuple[Partition, RawRecord]] = []
        self._touched: list[Partition] = []

    def produce(self, partition: Partition, record: OutgoingRecord, stored_ms: int) -> int:
        raw = partition.take_offset(record, stored_ms)
        self._produced.append((partition, raw))
        if partition not in self._touched:
            self._touched.append(partition)
        return raw.offset

    def commit(self) -> None:
        for partition, raw in self._produced:
            bisect.insort(partition.records, raw, key=lambda stored: stored.offset)
        self._markers()

    def abort(self) -> None:
        """The writer died before its commit: its records stay invisible for ever."""
        self._markers()

    def _markers(self) -> None:
        for partition in self._touched:
            partition.end += 1
