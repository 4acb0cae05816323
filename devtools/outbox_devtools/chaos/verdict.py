"""The chaos run's invariants, computed from what the database and the topics hold.

The producer processes' own counts are only progress: a killed process takes
its counts with it. The record is the transaction log (what committed), the
half, op and discard topics (what was asked and decided), the real topic (what
was published) and the sink's table (what landed).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from outbox.config import kafka_client_config
from outbox.protocol import (
    HalfRecord,
    Header,
    OpRecord,
    RawRecord,
    RealRecord,
    RecordKind,
    Resolution,
    TopicNames,
)
from outbox.reading import read_topic


@dataclass
class TopicState:
    """Everything the outbox topics of the run hold, decoded."""

    transactions: set[str] = field(default_factory=set)
    ops: list[OpRecord] = field(default_factory=list)
    discarded: set[str] = field(default_factory=set)
    real: Counter[str] = field(default_factory=Counter)
    real_timestamps_ms: list[int] = field(default_factory=list)
    """When each real record was published (the relay's produce time), for the stall times."""
    commit_stored_ms: dict[str, int] = field(default_factory=dict)
    """When each transaction's first COMMIT op was stored: from then on its record is owed."""
    first_published_ms: dict[str, int] = field(default_factory=dict)
    """When each transaction's real record first appeared."""
    orphaned_attempts: int = 0
    """Halves of orphaned attempts stored (put-back copies and resumes counted again)."""
    orphans_published: int = 0
    """Real records of an orphaned attempt: a half whose local transaction never ran, whose
    transaction id a later attempt reused (its payload says ``"orphan": true``)."""

    @property
    def decided(self) -> set[str]:
        return {op.transaction_id for op in self.ops}

    @property
    def pending(self) -> set[str]:
        """Halves with neither an outcome nor a discard: what the checker still owes."""
        return self.transactions - self.decided - self.discarded


def read_topic_state(bootstrap: str, topics: TopicNames, real_topics: Iterable[str]) -> TopicState:
    """Read every outbox topic and the real topics from the start, ``read_committed``."""
    client = kafka_client_config(bootstrap)
    state = TopicState()

    def records(topic: str) -> list[RawRecord]:
        return read_topic(client, topic, timeout=120)

    halves = records(topics.half)
    state.transactions = {HalfRecord.from_record(raw).transaction_id for raw in halves}
    state.orphaned_attempts = sum(1 for raw in halves if _is_orphan(raw.value))
    for raw in records(topics.op):
        op = OpRecord.from_record(raw)
        state.ops.append(op)
        if op.resolution is Resolution.COMMIT and raw.timestamp_ms is not None:
            state.commit_stored_ms.setdefault(op.transaction_id, raw.timestamp_ms)
    for raw in records(topics.discard):
        if raw.kind() is RecordKind.DISCARD:
            # Read leniently: a discard may stand in for a half that could not be read.
            transaction_id = raw.header_text(Header.TRANSACTION_ID.value)
            if transaction_id:
                state.discarded.add(transaction_id)
    for topic in real_topics:
        real = records(topic)
        state.real.update(RealRecord.from_record(raw).transaction_id for raw in real)
        state.orphans_published += sum(1 for raw in real if _is_orphan(raw.value))
        state.real_timestamps_ms += [r.timestamp_ms for r in real if r.timestamp_ms is not None]
        for raw in real:
            if raw.timestamp_ms is not None:
                transaction_id = RealRecord.from_record(raw).transaction_id
                first = state.first_published_ms.get(transaction_id, raw.timestamp_ms)
                state.first_published_ms[transaction_id] = min(first, raw.timestamp_ms)
    return state


def _is_orphan(value: bytes | None) -> bool:
    try:
        return bool(value) and json.loads(value).get("orphan") is True
    except (ValueError, AttributeError):
        return False


Interval = tuple[float, float]


def publication_stalls(state: TopicState, blocked: Iterable[Interval]) -> list[Interval]:
    """Every stretch (epoch s) in which publication was possible and nothing was published.

    Possible: a committed decision was waiting (its COMMIT op stored, its real
    record not yet there) and the run was not ``blocked`` (no broker quorum, no
    checker replica running unfrozen: the caller knows its faults). A stretch
    ends at a real record; a blocked or idle stretch between two parts of it
    splits it. What is left is the time the outbox itself took: sessions,
    fencing, timeouts, back-offs, restarts of its clients.
    """
    changes: list[tuple[float, int, int, bool]] = []
    """(time, waiting delta, blocked delta, a record appeared)"""
    for transaction_id, stored_ms in state.commit_stored_ms.items():
        published_ms = state.first_published_ms.get(transaction_id)
        if published_ms is None or published_ms > stored_ms:
            changes.append((stored_ms / 1000, 1, 0, False))
            if published_ms is not None:
                changes.append((published_ms / 1000, -1, 0, False))
    changes += [(t / 1000, 0, 0, True) for t in state.real_timestamps_ms]
    for start, end in blocked:
        changes += [(start, 0, 1, False), (end, 0, -1, False)]
    changes.sort(key=lambda change: change[0])
    stalls: list[Interval] = []
    waiting = blocking = 0
    run_start: float | None = None
    previous: float | None = None

    def close(at: float) -> None:
        nonlocal run_start
        if run_start is not None and at > run_start:
            stalls.append((run_start, at))
        run_start = None

    index = 0
    while index < len(changes):
        moment = changes[index][0]
        if previous is not None:  # the state held over [previous, moment)
            if waiting > 0 and blocking == 0:
                run_start = previous if run_start is None else run_start
            else:
                close(previous)
        appeared = False
        while index < len(changes) and changes[index][0] == moment:
            _, waits, blocks, record = changes[index]
            waiting, blocking, appeared = waiting + waits, blocking + blocks, appeared or record
            index += 1
        if appeared:
            close(moment)
        previous = moment
    if previous is not None and math.isfinite(previous):
        close(previous)
    return stalls


def longest_gap_seconds(timestamps_ms: Iterable[int], start: float, end: float) -> float:
    """The longest pause in publication that overlaps the window ``start``-``end`` (epoch s).

    A fault's stall: between the last record published before (or during) the
    fault and the next one, the real topic saw nothing. Gaps wholly outside the
    window are someone else's; with nothing published after the window the
    stall runs to its end.
    """
    times = sorted(t / 1000 for t in timestamps_ms)
    longest = 0.0
    previous = None
    for moment in times:
        if previous is not None and moment >= start and previous <= end:
            longest = max(longest, moment - previous)
        previous = moment
        if moment > end:
            break
    else:
        if previous is not None and previous <= end:
            longest = max(longest, end - max(previous, start))
    return longest


def duplicate_causes(state: TopicState) -> Counter[str]:
    """Which half identities reached the real topic more than once, from their commit ops.

    The relay is the only publisher: it publishes a half's first commit once,
    keyed by the half's identity (partition, origin offset), which every op
    names. An extra copy means it published one identity twice, or that one
    transaction id had several halves and each was committed.
    """
    committed: dict[str, set[tuple[int, int]]] = {}
    for op in state.ops:
        if op.resolution is Resolution.COMMIT and state.real[op.transaction_id] > 1:
            committed.setdefault(op.transaction_id, set()).add((op.half_partition, op.identity))
    causes: Counter[str] = Counter()
    for transaction_id, count in state.real.items():
        if count < 2:
            continue
        halves = ", ".join(f"{p}:{o}" for p, o in sorted(committed.get(transaction_id, ())))
        if not halves:
            cause = "published with no commit op"
        elif "," in halves:
            cause = f"halves {halves} of one transaction each committed"
        else:
            cause = f"half {halves} published more than once"
        causes[cause] += count - 1
    return causes


@dataclass
class Verdict:
    seed: int
    transactions: int
    committed: int
    rolled_back: int
    lost: int
    phantom: int
    duplicates_in_sink: int
    raw_duplicates: int
    pending: int
    discarded: int
    causes: Counter[str]
    sink_rows: int
    unpublished: int = 0
    """Of the lost: not on the real topic either (the relay's loss, not the sink's)."""
    unpublished_story: list[str] = field(default_factory=list)
    """The first of those, each with what the op topic holds for it: where to start looking."""
    orphans_published: int = 0
    """Orphaned attempts of a reused transaction id on the real topic (never committed)."""
    orphaned_attempts: int = 0
    """Halves of orphaned attempts stored: how much the reused-id traffic was exercised."""
    slow_commits: int = 0
    """Orders whose COMMIT blocked past the grace: how much the check-back race was exercised."""
    publication_stall_s: float | None = None
    """The longest of the :func:`publication_stalls`: a measure, not an invariant."""
    writable_stall_s: float | None = None
    """The same, counted only while Kafka could take the relay's writes (leaders, in sync)."""
    owned_stall_s: float | None = None
    """The same, with Kafka writable on the partitions the relay's transactions concern (its
    coordinators', not every internal partition) and a checker replica running, unfrozen
    and connected: the pause that is the outbox's own."""
    owned_stall_span: Interval | None = None
    """When the longest of those ran (epoch s), for the post-mortem."""
    failed_sends: int = 0
    """Sends that raised (as the producers last reported: a killed one's last half second is
    not counted): without parking, what a Kafka outage costs the service."""
    parked_sends: int | None = None
    """With parking on: sends parked in the transaction log (published later by the checker)."""
    failed_sends_kafka_away: int | None = None
    """With parking on: sends that raised while Kafka was away. Parking promises none."""

    @property
    def failures(self) -> list[str]:
        problems = {
            "committed transactions missing from the sink (lost)": self.lost,
            "rolled-back or unknown transactions visible (phantom)": self.phantom,
            "duplicate rows in the sink": self.duplicates_in_sink,
            "halves still pending": self.pending,
            "orphaned attempts of a reused transaction id published": self.orphans_published,
        }
        if self.failed_sends_kafka_away:
            problems["sends failed while Kafka was away, with parking on"] = (
                self.failed_sends_kafka_away
            )
        failures = [f"{count} {what}" for what, count in problems.items() if count]
        if self.lost:
            failures.append(f"{self.unpublished} of the lost are not on the real topic either")
        if self.unpublished_story:
            failures.append(f"not on the real topic: {'; '.join(self.unpublished_story)}")
        if self.raw_duplicates:
            causes = "; ".join(f"{cause}: {n}" for cause, n in self.causes.most_common())
            failures.append(f"{self.raw_duplicates} raw duplicates on the real topic ({causes})")
        return failures

    def line(self) -> str:
        return (
            f"chaos: seed={self.seed} transactions={self.transactions} "
            f"committed={self.committed} lost={self.lost} phantom={self.phantom} "
            f"duplicates_in_sink={self.duplicates_in_sink} raw_duplicates={self.raw_duplicates} "
            f"pending={self.pending} orphans_published={self.orphans_published}"
            + (
                f" publication_stall_s={self.publication_stall_s:.1f}"
                if self.publication_stall_s is not None
                else ""
            )
            + (
                f" writable_stall_s={self.writable_stall_s:.1f}"
                if self.writable_stall_s is not None
                else ""
            )
            + (f" owned_stall_s={self.owned_stall_s:.1f}" if self.owned_stall_s is not None else "")
            + (
                f" parked_sends={self.parked_sends}"
                f" failed_sends_kafka_away={self.failed_sends_kafka_away}"
                if self.parked_sends is not None
                else ""
            )
        )


def judge(seed: int, committed_in_db: set[str], state: TopicState, sink: Counter[str]) -> Verdict:
    """Every invariant of the run, from the database's commits, the topics and the table."""
    visible = set(state.real) | set(sink)
    return Verdict(
        seed=seed,
        transactions=len(state.transactions),
        committed=len(committed_in_db),
        rolled_back=len(state.transactions - committed_in_db),
        lost=len(committed_in_db - set(sink)),
        phantom=len(visible - committed_in_db),
        duplicates_in_sink=sum(sink.values()) - len(sink),
        raw_duplicates=sum(state.real.values()) - len(state.real),
        pending=len(state.pending),
        discarded=len(state.discarded),
        causes=duplicate_causes(state),
        sink_rows=sum(sink.values()),
        unpublished=len(committed_in_db - set(state.real)),
        unpublished_story=[
            _op_story(transaction_id, state)
            for transaction_id in sorted(committed_in_db - set(state.real))[:STORIES]
        ],
        orphans_published=state.orphans_published,
    )


STORIES = 10
"""Lost transactions the verdict describes one by one."""


def _op_story(transaction_id: str, state: TopicState) -> str:
    """``id (ops: ROLLBACK of half 3:1053; ...)``: what was decided for each of its halves."""
    ops = [op for op in state.ops if op.transaction_id == transaction_id]
    decided = "; ".join(
        f"{op.resolution.name} of half {op.half_partition}:{op.identity}" for op in ops
    )
    discarded = ", discarded" if transaction_id in state.discarded else ""
    return f"{transaction_id} (ops: {decided or 'none'}{discarded})"
