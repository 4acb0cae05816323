"""One check round over one half partition: RocketMQ's ``TransactionalMessageServiceImpl#check``.

This module decides; it does no I/O. It reads through a :class:`PartitionReader`
and yields :class:`RoundChunk` decisions (what to put back and ask about, what
to discard, where the checkpoints move), each of which the service writes in
one Kafka transaction. Time comes from injected clocks (the wall clock for ages,
a monotonic one for the round's time budget), so every rule is tested by
driving time rather than sleeping.

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

Ages are the broker's: a half's age counts from its store time (the record
timestamp, ``LogAppendTime`` on the outbox topics; for a copy, the original's
store time it carries), so a producer's wrong clock neither delays nor hastens
its checks. ``born_ms`` is the fallback for records that carry neither.

Beyond RocketMQ: ops name the half's identity (partition and origin offset,
shared by every copy), so a copy of a half that has an op anywhere in recent
history is skipped (never asked about again); an op naming an offset the walk
passed without finding is marked done with a warning, so the op checkpoint
never sticks (apache/rocketmq#1519, #9500); a malformed half is discarded with
reason ``malformed`` instead of stalling.

Reading ops to their end proves "no op yet" only if the end is settled: an open
Kafka transaction on the op partition hides every op after it from a
``read_committed`` reader, so then the partition stops (``OPS_UNSETTLED``) and
the half waits for a later round. Looking for one half's op holds at most
``max_ops_per_round`` ops read ahead of the walk (for halves it has not reached)
and stays within the time budget; past the cap the half is asked about, which is
harmless if it had ended (its answer is a second decision, which the relay
ignores). The cap bounds what is held, not what a round reads: a backlog of
decided halves with their ops (a checker back from an outage) is walked through
whole, each half skipped by its op, however long it is.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from outbox.protocol import DiscardReason, HalfRecord
from outbox_checker.ended import EndedTransactions, HalfIdentity
from outbox_checker.entries import HalfEntry, OpEntry
from outbox_checker.settings import CheckerSettings, built_from_settings, from_setting

log = logging.getLogger(__name__)


class PartitionReader(Protocol):
    """What a round reads: one half partition and its paired op partition."""

    def ops(self, start: int, limit: int) -> list[OpEntry]:
        """Up to ``limit`` committed ops from offset ``start`` on; empty at the end."""
        ...

    def halves(self, start: int) -> Iterator[HalfEntry]:
        """Committed halves from offset ``start`` on, in order, to the end at call time."""
        ...

    def ops_settled(self) -> bool:
        """Whether every op written so far is readable (no open Kafka transaction hides any)."""
        ...

    def half_end(self) -> int:
        """The half partition's end offset now (its high watermark)."""
        ...


class StopReason(StrEnum):
    END = "end of partition"
    FRESH = "stored after the round began"
    YOUNG = "younger than the transaction timeout"
    TIME_BUDGET = "time budget spent"
    OPS_UNSETTLED = "an open Kafka transaction on the op partition"
    RECHECK_NOT_DUE = "put back less than a check interval ago"
    """Early rounds only (:attr:`RoundRules.recheck_after_ms`)."""


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
    to_drain: list[HalfRecord] = field(default_factory=list)
    """Parked sends' halves (from the transaction log): written with a COMMIT op each."""
    skipped_ended: int = 0
    """Halves passed because their transaction has an op (removed or ended copies)."""
    half_checkpoint: int = 0
    op_checkpoint: int = 0
    stop_reason: StopReason | None = None
    """Set on the last chunk of a round."""
    pending_by_topic: Counter[str] = field(default_factory=Counter)
    """On the last chunk: halves left after the stop, by real topic (up to a cap)."""
    oldest_pending_born_ms: int | None = None
    due_again_ms: int | None = None
    """On the last chunk: when a round could walk past the stop (the half that stopped
    it comes of age, or at once after a spent budget); None when only the check
    interval brings the next round. See :func:`due_again_ms`."""

    @property
    def decisions(self) -> int:
        return len(self.to_check) + len(self.to_requeue) + len(self.to_discard)


@dataclass(frozen=True)
class RoundRules:
    """The knobs the rules read: :meth:`from_settings`, defaults from :class:`CheckerSettings`."""

    transaction_timeout_ms: int = from_setting("transaction_timeout_ms")
    check_max: int = from_setting("check_max")
    max_process_ms: int = from_setting("max_process_ms")
    op_read_batch: int = from_setting("op_read_batch")
    max_ops_per_round: int = from_setting("max_ops_per_round")
    """Most ops read per partition per round (bounds the op window's memory)."""
    retention_ms: int = from_setting("retention_ms")
    chunk_size: int = 1000
    """Halves settled per chunk (one Kafka transaction each)."""
    pending_scan_limit: int = 10_000
    """Most halves read past the stop point to count what is pending."""
    recheck_after_ms: int | None = None
    """Set for a round run before its check interval is up (an early round): a put-back
    copy stored less than this long ago stops the walk there. A half already asked
    about is asked again once per check interval, as in RocketMQ, however many early
    rounds its partition sees; only halves never asked about are asked sooner."""

    @classmethod
    def from_settings(cls, settings: CheckerSettings) -> RoundRules:
        """The rules a checker with ``settings`` runs its rounds by."""
        return built_from_settings(cls, settings)


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
        self._walking = half_checkpoint
        """The half offset the walk is at: ops naming earlier halves are done when read."""
        self._batch = batch
        self._ended = ended
        self.next_offset = op_checkpoint
        self.read_order: deque[int] = deque()
        """Ops read and not yet below the checkpoint, in offset order."""
        self.done: set[int] = set()
        self.remove_map: dict[int, int] = {}
        self.last_fill: list[OpEntry] = []
        self.furthest = -1
        """The furthest half offset of this partition an op read this round names."""
        self._settled = False

    def fill(self) -> list[OpEntry]:
        """Read the next batch of ops (``fillOpRemoveMap``)."""
        entries = self._reader.ops(self.next_offset, self._batch)
        for entry in entries:
            self.read_order.append(entry.offset)
            op = entry.op
            if op is None:
                self.done.add(entry.offset)
                continue
            self._ended.add((op.half_partition, op.identity))
            if op.half_partition == self._partition and op.half_offset > self.furthest:
                self.furthest = op.half_offset
            if op.half_partition != self._partition:
                log.warning(
                    "op at %d names half partition %d, read from op partition %d; ignored",
                    entry.offset,
                    op.half_partition,
                    self._partition,
                )
                self.done.add(entry.offset)
            elif op.half_offset < self._walking:
                # Its half is behind the walk: before the checkpoint, or passed this round
                # without it (checked, put back or discarded; its copies carry its identity).
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

    def can_read_on(self, cap: int) -> bool:
        """Whether more ops may be read: the last read found some, and fewer than ``cap``
        are held for halves the walk has not reached (what the cap bounds)."""
        return bool(self.last_fill) and len(self.remove_map) < cap

    def take(self, half_offset: int) -> bool:
        """Whether an op removed this half offset (the walk's next); its op becomes done."""
        self._walking = half_offset
        op_offset = self.remove_map.pop(half_offset, None)
        if op_offset is None:
            return False
        self.done.add(op_offset)
        return True

    def settled(self) -> bool:
        """Whether the ops read to their end are all there are (asked once settled)."""
        self._settled = self._settled or self._reader.ops_settled()
        return self._settled

    def settle(self, walked_to: int) -> None:
        """Ops naming offsets with no half are done; those naming halves ahead stay undone.

        The walk passed offsets before ``walked_to``; a half at or past the
        partition's end, read now (after every op was read), cannot exist, as
        a half is written before its op. Offsets between are halves the walk
        has not reached yet (some maybe written during this round): their ops
        are read again next round.
        """
        if not self.remove_map:
            return
        end = self._reader.half_end() if max(self.remove_map) >= walked_to else walked_to
        for half_offset, op_offset in list(self.remove_map.items()):
            if half_offset < walked_to:
                # Read after the walk passed its half (ops are read lazily): the
                # half was settled without it, and its copies carry its identity.
                log.debug("op at %d arrived after the walk passed half %d", op_offset, half_offset)
            elif half_offset >= end:
                log.warning(
                    "op at %d names half offset %d, where partition %d has no half; ignored",
                    op_offset,
                    half_offset,
                    self._partition,
                )
            else:
                continue
            self.done.add(op_offset)
            del self.remove_map[half_offset]

    def new_checkpoint(self) -> int:
        """End of the contiguous run of done ops (``calculateOpOffset``).

        Op offsets are not dense (Kafka transaction markers sit between
        them), so the run is over the ops read, in order. The run's ops are
        forgotten as it is measured: a round through a long backlog asks at
        every chunk, and would otherwise walk every op it read each time.
        """
        read_order, done = self.read_order, self.done
        while read_order and read_order[0] in done:
            done.discard(read_order.popleft())
        return read_order[0] if read_order else self.next_offset


def iter_round(
    reader: PartitionReader,
    *,
    partition: int,
    half_checkpoint: int,
    op_checkpoint: int,
    ended: EndedTransactions,
    rules: RoundRules,
    now_ms: Callable[[], int],
    monotonic_ms: Callable[[], int] = lambda: time.monotonic_ns() // 1_000_000,
    half_end: int | None = None,
) -> Iterator[RoundChunk]:
    """Walk half partition ``partition`` once, yielding decisions chunk by chunk.

    ``half_end`` is the partition's end offset when the round began, if known:
    halves at or past it were appended during the round. ``now_ms`` is the wall
    clock ages are measured with; ``monotonic_ms`` times the round's budget, so a
    wall clock stepped by NTP neither ends a round early nor lets it run on.
    """
    started = now_ms()
    budget_from = monotonic_ms()

    def budget_spent() -> bool:
        return monotonic_ms() - budget_from > rules.max_process_ms

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
        if budget_spent():
            stop, left = StopReason.TIME_BUDGET, entry
            break
        verdict = _decide(entry, chunk, ops, ended, rules, started, now_ms, budget_spent)
        if verdict is not None:
            stop, left = verdict, entry
            break
        next_half = entry.offset + 1
        if chunk.decisions + chunk.skipped_ended >= rules.chunk_size:
            chunk.half_checkpoint, chunk.op_checkpoint = next_half, ops.new_checkpoint()
            yield chunk
            chunk = RoundChunk(partition)
    ops.settle(next_half)
    chunk.half_checkpoint, chunk.op_checkpoint = next_half, ops.new_checkpoint()
    chunk.stop_reason = stop
    chunk.due_again_ms = due_again_ms(stop, left, rules, now_ms())
    if left is not None:
        _count_pending(chunk, [left], ops, ended, rules.pending_scan_limit)
        _count_pending(chunk, halves, ops, ended, rules.pending_scan_limit - 1)
    yield chunk


def due_again_ms(
    stop: StopReason, left: HalfEntry | None, rules: RoundRules, now_ms: int
) -> int | None:
    """When a round could walk past ``left``, the half a round stopped at, if before the interval.

    RocketMQ waits a whole check interval (30 s here, 60 s there) whatever stopped the
    round, so a half stored just after a round began waits up to interval + transaction
    timeout for its first check, and a broker restart, whose retried round meets only
    young halves, always pays the whole interval. A half never asked about is due when
    it is a transaction timeout old (one stored after a walk that reached the end, a
    transaction timeout after that end at the earliest); a spent budget leaves work
    that is due at once; an open op transaction is looked at again a transaction
    timeout later (its producer ends it, or Kafka aborts it). A put-back copy waits for
    the interval (its cadence). So an idle partition costs a round per transaction
    timeout (a watermark question), and a half's first check comes at most two
    transaction timeouts after it was stored.
    """
    if stop is StopReason.TIME_BUDGET:
        return now_ms
    if stop in (StopReason.END, StopReason.OPS_UNSETTLED):
        return now_ms + rules.transaction_timeout_ms
    if stop not in (StopReason.YOUNG, StopReason.FRESH) or left is None:
        return None
    half = left.half
    if half is None or half.origin_offset is not None:
        return None
    return _stored_ms(left, half) + transaction_timeout_ms(half, rules)


def transaction_timeout_ms(half: HalfRecord, rules: RoundRules) -> int:
    """How old ``half`` must be before it is checked: the checker's transaction timeout, or
    the window its producer may still end it in (stamped on the half), whichever is longer.

    So a producer whose transaction timeout is longer than the checker's is never asked
    about a transaction it may still end itself (the relay keeps the first decision: a
    check-back's answer would win over a later direct end). The producer's setting is the
    one source of its window; the checker's is a floor, and the whole rule for halves
    written before producers stamped the window.
    """
    window = half.end_window_ms
    if window is None or window <= rules.transaction_timeout_ms:
        return rules.transaction_timeout_ms
    return window


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
        if half is None or entry.offset in ops.remove_map or _identity(entry, half) in ended:
            continue
        chunk.pending_by_topic[half.real_topic] += 1
        if chunk.oldest_pending_born_ms is None or half.born_ms < chunk.oldest_pending_born_ms:
            chunk.oldest_pending_born_ms = half.born_ms


def _identity(entry: HalfEntry, half: HalfRecord) -> HalfIdentity:
    return entry.raw.partition, half.identity(entry.offset)


def _stored_ms(entry: HalfEntry, half: HalfRecord) -> int:
    """When the broker stored the half (for a copy, the original): what ages count from."""
    if half.origin_offset is not None:
        return half.origin_stored_ms if half.origin_stored_ms is not None else half.born_ms
    return entry.stored_ms or half.born_ms


def _decide(
    entry: HalfEntry,
    plan: RoundChunk,
    ops: _OpWindow,
    ended: EndedTransactions,
    rules: RoundRules,
    started: int,
    now_ms: Callable[[], int],
    budget_spent: Callable[[], bool],
) -> StopReason | None:
    """Settle one half (or say why the walk stops there)."""
    while True:
        if ops.take(entry.offset):
            plan.skipped_ended += 1
            return None
        if (
            ops.furthest < entry.offset
            and ops.can_read_on(rules.max_ops_per_round)
            and not budget_spent()
        ):
            # The ops read so far name no half this far: its op, if it has one, is further
            # on. Read on before decoding the half (most halves are skipped by their op).
            ops.fill()
            continue
        half = entry.half
        if half is None:
            detail = str(entry.error) if entry.error else "undecodable"
            plan.to_discard.append(Discard(entry, DiscardReason.MALFORMED, detail))
            return None
        if _identity(entry, half) in ended:
            plan.skipped_ended += 1
            return None
        if (
            rules.recheck_after_ms is not None
            and half.origin_offset is not None
            and now_ms() - entry.stored_ms < rules.recheck_after_ms
        ):
            return StopReason.RECHECK_NOT_DUE
        age = now_ms() - _stored_ms(entry, half)
        discard = None
        if half.check_times >= rules.check_max:
            detail = f"checked {half.check_times} times without an answer"
            discard = Discard(entry, DiscardReason.CHECK_MAX, detail)
        elif age > rules.retention_ms:
            detail = f"stored {age // 1000}s ago, past the retention horizon"
            discard = Discard(entry, DiscardReason.RETENTION, detail)
        if discard is not None:
            if ops.can_read_on(rules.max_ops_per_round):
                # Its answer may be among the ops not read yet: a decided half must not be
                # listed as discarded (the relay publishes it all the same).
                ops.fill()
                continue
            plan.to_discard.append(discard)
            return None
        if entry.stored_ms >= started:
            return StopReason.FRESH
        immunity = transaction_timeout_ms(half, rules)
        if half.immunity_seconds is not None:
            immunity = max(half.immunity_seconds * 1000, immunity)
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
        if not last and not ops.settled():
            return StopReason.OPS_UNSETTLED
        if needs_check or len(ops.remove_map) >= rules.max_ops_per_round:
            plan.to_check.append(entry)
            return None
        if budget_spent():
            return StopReason.TIME_BUDGET
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
        merged.due_again_ms = chunk.due_again_ms
        merged.stop_reason = chunk.stop_reason
        merged.pending_by_topic = chunk.pending_by_topic
        merged.oldest_pending_born_ms = chunk.oldest_pending_born_ms
    assert merged is not None
    return merged
