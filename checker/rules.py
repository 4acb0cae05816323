"""One check round over one half partition: RocketMQ's ``TransactionalMessageServiceImpl#check``.

This module decides; it does no I/O. It reads through a :class:`PartitionReader`
and yields :class:`RoundChunk` decisions (what to put back and ask about, what
to discard, where the checkpoints move), each of which the service writes in
one Kafka transaction. Time comes from an injected clock, so every rule is
tested by driving time rather than sleeping.

The walk, as in RocketMQ (seed 002, ``check``), for half partition p:

- ops are read from the op checkpoint in batches (``op_read_batch``); an op for
  a half offset at or past the half checkpoint goes to the remove map, an
  earlier one straight to the done list;
- halves are walked from the half checkpoint: removed -> skip; check times >=
  check max -> discard; older than the retention horizon -> discard; stored
  after the round began -> stop; younger than the transaction timeout -> stop
  (a half with its own immunity time is put back instead, so it does not hold
  the partition); needs a check -> put back a copy with check times + 1 and ask
  about the copy; cannot tell yet -> read more ops and look again;
- the partition stops at the time budget; the new op checkpoint is the end of
  the contiguous run of done ops (``calculateOpOffset``).

Beyond RocketMQ: ops carry the transaction id, so a copy of a transaction that
has an op anywhere in recent history is skipped (never asked about again); an
op naming an offset the walk passed without finding is marked done with a
warning, so the op checkpoint never sticks (apache/rocketmq#1519, #9500); a
malformed half is discarded with reason ``malformed`` instead of stalling.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from checker.ended import EndedTransactions
from outbox.protocol import DiscardReason, HalfRecord, MalformedRecordError, OpRecord, RawRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HalfEntry:
    """A record of the half partition, decoded if it could be."""

    raw: RawRecord
    stored_ms: int
    half: HalfRecord | None
    error: MalformedRecordError | None = None

    @property
    def offset(self) -> int:
        return self.raw.offset

    @classmethod
    def of(cls, raw: RawRecord) -> HalfEntry:
        stored_ms = raw.timestamp_ms or 0
        try:
            return cls(raw, stored_ms, HalfRecord.from_record(raw))
        except MalformedRecordError as exc:
            return cls(raw, stored_ms, None, exc)


@dataclass(frozen=True)
class OpEntry:
    """A record of the op partition; ``op`` is ``None`` when it did not decode."""

    offset: int
    op: OpRecord | None

    @classmethod
    def of(cls, raw: RawRecord) -> OpEntry:
        try:
            return cls(raw.offset, OpRecord.from_record(raw))
        except MalformedRecordError as exc:
            log.warning("ignoring a malformed op record: %s", exc)
            return cls(raw.offset, None)


class PartitionReader(Protocol):
    """What a round reads: one half partition and its paired op partition."""

    def ops(self, start: int, limit: int) -> list[OpEntry]:
        """Up to ``limit`` committed ops from offset ``start`` on; empty at the end."""
        ...

    def halves(self, start: int) -> Iterator[HalfEntry]:
        """Committed halves from offset ``start`` on, in order, to the end at call time."""
        ...


class StopReason(StrEnum):
    END = "end of partition"
    FRESH = "stored after the round began"
    YOUNG = "younger than the transaction timeout"
    TIME_BUDGET = "time budget spent"


@dataclass(frozen=True)
class Discard:
    entry: HalfEntry
    reason: DiscardReason
    detail: str


@dataclass
class RoundChunk:
    """Decisions over a stretch of the walk, with the checkpoints valid after it.

    A round is written chunk by chunk, each in one Kafka transaction with its
    checkpoint, so memory and transaction length stay bounded however long the
    backlog is, and a crash between chunks neither repeats nor skips a half.
    """

    partition: int
    to_check: list[HalfEntry] = field(default_factory=list)
    """Halves to put back (check times + 1) and ask their producers about."""
    to_requeue: list[HalfEntry] = field(default_factory=list)
    """Halves inside their own immunity time: put back unchanged, asked later."""
    to_discard: list[Discard] = field(default_factory=list)
    skipped_ended: int = 0
    """Halves passed because their transaction has an op (removed or ended copies)."""
    half_checkpoint: int = 0
    op_checkpoint: int = 0
    stop_reason: StopReason | None = None
    """Set on the last chunk of a round."""
    pending_by_topic: Counter[str] = field(default_factory=Counter)
    """On the last chunk: halves left after the stop, by real topic (up to a cap)."""
    oldest_pending_born_ms: int | None = None

    @property
    def decisions(self) -> int:
        return len(self.to_check) + len(self.to_requeue) + len(self.to_discard)


@dataclass(frozen=True)
class RoundRules:
    """The knobs the rules read (see :class:`checker.settings.CheckerSettings`)."""

    transaction_timeout_ms: int = 6_000
    check_max: int = 15
    max_process_ms: int = 60_000
    op_read_batch: int = 32
    retention_ms: int = 72 * 3600 * 1000
    chunk_size: int = 1000
    """Halves settled per chunk (one Kafka transaction each)."""
    pending_scan_limit: int = 10_000
    """Most halves read past the stop point to count what is pending."""


class _OpWindow:
    """The ops read so far this round: the remove map and the done list."""

    def __init__(
        self,
        reader: PartitionReader,
        partition: int,
        half_checkpoint: int,
        op_checkpoint: int,
        batch: int,
        ended: EndedTransactions,
    ) -> None:
        self._reader = reader
        self._partition = partition
        self._half_checkpoint = half_checkpoint
        self._batch = batch
        self._ended = ended
        self.next_offset = op_checkpoint
        self.read_order: list[int] = []
        self.done: set[int] = set()
        self.remove_map: dict[int, int] = {}
        self.last_fill: list[OpEntry] = []

    def fill(self) -> list[OpEntry]:
        """Read the next batch of ops (``fillOpRemoveMap``)."""
        entries = self._reader.ops(self.next_offset, self._batch)
        for entry in entries:
            self.read_order.append(entry.offset)
            op = entry.op
            if op is None:
                self.done.add(entry.offset)
                continue
            self._ended.add(op.transaction_id)
            if op.half_partition != self._partition:
                log.warning(
                    "op at %d names half partition %d, read from op partition %d; ignored",
                    entry.offset,
                    op.half_partition,
                    self._partition,
                )
                self.done.add(entry.offset)
            elif op.half_offset < self._half_checkpoint:
                self.done.add(entry.offset)
            else:
                previous = self.remove_map.get(op.half_offset)
                if previous is not None:
                    self.done.add(previous)  # a second op for the same copy: both are done
                self.remove_map[op.half_offset] = entry.offset
        if entries:
            self.next_offset = entries[-1].offset + 1
        self.last_fill = entries
        return entries

    def take(self, half_offset: int) -> bool:
        """Whether an op removed this half offset; its op becomes done."""
        op_offset = self.remove_map.pop(half_offset, None)
        if op_offset is None:
            return False
        self.done.add(op_offset)
        return True

    def settle(self, walked_to: int, half_end: int | None) -> None:
        """Ops naming offsets the walk passed without a half there are done."""
        for half_offset, op_offset in list(self.remove_map.items()):
            beyond_end = half_end is not None and half_offset >= half_end
            if half_offset < walked_to or beyond_end:
                log.warning(
                    "op at %d names half offset %d, where partition %d has no half; ignored",
                    op_offset,
                    half_offset,
                    self._partition,
                )
                self.done.add(op_offset)
                del self.remove_map[half_offset]

    def new_checkpoint(self) -> int:
        """End of the contiguous run of done ops (``calculateOpOffset``).

        Op offsets are not dense (Kafka transaction markers sit between
        them), so the run is over the ops read, in order.
        """
        for offset in self.read_order:
            if offset not in self.done:
                return offset
        return self.next_offset


def iter_round(
    reader: PartitionReader,
    *,
    partition: int,
    half_checkpoint: int,
    op_checkpoint: int,
    ended: EndedTransactions,
    rules: RoundRules,
    now_ms: Callable[[], int],
    half_end: int | None = None,
) -> Iterator[RoundChunk]:
    """Walk half partition ``partition`` once, yielding decisions chunk by chunk.

    ``half_end`` is the partition's end offset when the round began, if known:
    ops naming offsets at or past it name halves that do not exist.
    """
    started = now_ms()
    ops = _OpWindow(reader, partition, half_checkpoint, op_checkpoint, rules.op_read_batch, ended)
    ops.fill()
    next_half = half_checkpoint
    chunk = RoundChunk(partition)
    halves = reader.halves(half_checkpoint)
    stop = StopReason.END
    left: HalfEntry | None = None
    for entry in halves:
        if half_end is not None and entry.offset >= half_end:
            # Appended during this round (its own put-back copies, or new halves):
            # offsets say so whatever the clocks of the writers say.
            stop, left = StopReason.FRESH, entry
            break
        if now_ms() - started > rules.max_process_ms:
            stop, left = StopReason.TIME_BUDGET, entry
            break
        verdict = _decide(entry, chunk, ops, ended, rules, started, now_ms)
        if verdict is not None:
            stop, left = verdict, entry
            break
        next_half = entry.offset + 1
        if chunk.decisions + chunk.skipped_ended >= rules.chunk_size:
            chunk.half_checkpoint, chunk.op_checkpoint = next_half, ops.new_checkpoint()
            yield chunk
            chunk = RoundChunk(partition)
    ops.settle(next_half, half_end)
    chunk.half_checkpoint, chunk.op_checkpoint = next_half, ops.new_checkpoint()
    chunk.stop_reason = stop
    if left is not None:
        _count_pending(chunk, [left], ops, ended, rules.pending_scan_limit)
        _count_pending(chunk, halves, ops, ended, rules.pending_scan_limit - 1)
    yield chunk


def _count_pending(
    chunk: RoundChunk,
    entries: Iterable[HalfEntry],
    ops: _OpWindow,
    ended: EndedTransactions,
    limit: int,
) -> None:
    for seen, entry in enumerate(entries):
        if seen >= limit:
            return
        half = entry.half
        if half is None or entry.offset in ops.remove_map or half.transaction_id in ended:
            continue
        chunk.pending_by_topic[half.real_topic] += 1
        if chunk.oldest_pending_born_ms is None or half.born_ms < chunk.oldest_pending_born_ms:
            chunk.oldest_pending_born_ms = half.born_ms


def _decide(
    entry: HalfEntry,
    plan: RoundChunk,
    ops: _OpWindow,
    ended: EndedTransactions,
    rules: RoundRules,
    started: int,
    now_ms: Callable[[], int],
) -> StopReason | None:
    """Settle one half (or say why the walk stops there)."""
    while True:
        if ops.take(entry.offset):
            plan.skipped_ended += 1
            return None
        half = entry.half
        if half is None:
            detail = str(entry.error) if entry.error else "undecodable"
            plan.to_discard.append(Discard(entry, DiscardReason.MALFORMED, detail))
            return None
        if half.transaction_id in ended:
            plan.skipped_ended += 1
            return None
        if half.check_times >= rules.check_max:
            detail = f"checked {half.check_times} times without an answer"
            plan.to_discard.append(Discard(entry, DiscardReason.CHECK_MAX, detail))
            return None
        age = now_ms() - half.born_ms
        if age > rules.retention_ms:
            detail = f"born {age // 1000}s ago, past the retention horizon"
            plan.to_discard.append(Discard(entry, DiscardReason.RETENTION, detail))
            return None
        if entry.stored_ms >= started:
            return StopReason.FRESH
        immunity = rules.transaction_timeout_ms
        if half.immunity_seconds is not None:
            immunity = max(half.immunity_seconds * 1000, rules.transaction_timeout_ms)
            if age < immunity:
                plan.to_requeue.append(entry)
                return None
        elif 0 <= age < immunity:
            return StopReason.YOUNG
        # Due (or the clock went backwards, age <= -1): check it unless an op
        # may still be among those not read yet (RocketMQ's isNeedCheck).
        last = ops.last_fill
        last_op = last[-1].op if last else None
        needs_check = (
            not last
            or (last_op is not None and last_op.ended_ms - started > rules.transaction_timeout_ms)
            or age <= -1
        )
        if needs_check:
            plan.to_check.append(entry)
            return None
        ops.fill()  # cannot tell yet: read more ops, then look at this half again


def plan_round(reader: PartitionReader, **kwargs: object) -> RoundChunk:
    """The whole round as one chunk: for tests and for small partitions."""
    merged: RoundChunk | None = None
    for chunk in iter_round(reader, **kwargs):  # type: ignore[arg-type]
        if merged is None:
            merged = chunk
            continue
        merged.to_check += chunk.to_check
        merged.to_requeue += chunk.to_requeue
        merged.to_discard += chunk.to_discard
        merged.skipped_ended += chunk.skipped_ended
        merged.half_checkpoint, merged.op_checkpoint = chunk.half_checkpoint, chunk.op_checkpoint
        merged.stop_reason = chunk.stop_reason
        merged.pending_by_topic = chunk.pending_by_topic
        merged.oldest_pending_born_ms = chunk.oldest_pending_born_ms
    assert merged is not None
    return merged
