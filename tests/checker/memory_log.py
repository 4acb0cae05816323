"""An in-memory half partition and op partition, for driving the rules without Kafka.

The rules module decides and does no I/O; what it decides is tested here, with
time driven by a fake clock. What the checker claims about Kafka is tested
against a real broker elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from outbox.protocol import HalfRecord, OpRecord, RawRecord, Resolution, TopicNames
from outbox_checker.entries import HalfEntry, OpEntry

TOPICS = TopicNames("t")
T0 = 1_800_000_000_000  # a fixed "now" in ms


class Clock:
    def __init__(self, now_ms: int = T0, step_ms: int = 0) -> None:
        self.now = now_ms
        self.step = step_ms

    def __call__(self) -> int:
        value = self.now
        self.now += self.step
        return value


@dataclass
class MemoryLog:
    partition: int = 0
    half_entries: list[HalfEntry] = field(default_factory=list)
    op_entries: list[OpEntry] = field(default_factory=list)
    fills: int = 0

    def next_half_offset(self) -> int:
        return self.half_entries[-1].offset + 1 if self.half_entries else 0

    def add_half(
        self,
        half: HalfRecord,
        stored_ms: int | None = None,
        *,
        gap: int = 0,
    ) -> int:
        offset = self.next_half_offset() + gap
        raw = stored_raw(half.to_record(TOPICS, self.partition).headers, half, offset, stored_ms)
        self.half_entries.append(HalfEntry.of(raw))
        return offset

    def add_raw_half(self, raw: RawRecord) -> int:
        self.half_entries.append(HalfEntry.of(raw))
        return raw.offset

    def add_op(
        self,
        transaction_id: str,
        half_offset: int,
        *,
        ended_ms: int = T0 - 60_000,
        resolution: Resolution = Resolution.COMMIT,
        half_partition: int | None = None,
        gap: int = 1,
    ) -> int:
        offset = (self.op_entries[-1].offset + 1 + gap) if self.op_entries else 0
        op = OpRecord(
            transaction_id,
            "orders",
            self.partition if half_partition is None else half_partition,
            half_offset,
            resolution,
            ended_ms,
        )
        self.op_entries.append(OpEntry(offset, op))
        return offset

    def ops(self, start: int, limit: int) -> list[OpEntry]:
        self.fills += 1
        return [e for e in self.op_entries if e.offset >= start][:limit]

    def halves(self, start: int) -> Iterator[HalfEntry]:
        return iter([e for e in self.half_entries if e.offset >= start])

    def ops_settled(self) -> bool:
        return True

    def half_end(self) -> int:
        return self.next_half_offset()


def stored_raw(headers, half: HalfRecord, offset: int, stored_ms: int | None) -> RawRecord:
    return RawRecord(
        TOPICS.half,
        0,
        offset,
        half.key,
        half.value,
        tuple(headers),
        stored_ms if stored_ms is not None else half.born_ms,
    )


def a_half(txid: str, born_ms: int = T0 - 60_000, **changes) -> HalfRecord:
    fields = dict(
        transaction_id=txid,
        producer_group="orders",
        real_topic="events",
        key=b"k",
        value=b"v",
        born_ms=born_ms,
    )
    fields.update(changes)
    return HalfRecord(**fields)
