"""One TransactionProducer shared by many threads: every outcome lands exactly as reported.

What lands is the producer's part: one half per send, one op per decision,
each op naming its half, in send order per key; the real topic stays empty
(the checker's relay publishes).
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum

import pytest
from confluent_kafka.admin import AdminClient

from outbox import (
    EndStatus,
    LocalTransactionState,
    Message,
    ProducerSettings,
    SendStatus,
    TransactionProducer,
    TransactionSendResult,
)
from outbox.admin import TopicSpec, ensure_topics, plan_topics
from outbox.config import kafka_client_config
from outbox.protocol import HalfRecord, OpRecord, RawRecord, Resolution, TopicNames
from outbox.reading import read_topic

pytestmark = pytest.mark.kafka

THREADS = 16
SENDS_PER_THREAD = 500
PARTITIONS = 4
GROUP = "concurrency"
READ_TIMEOUT = 60.0


class Outcome(Enum):
    """What a local transaction does, chosen by the ``arg`` of its send."""

    COMMIT = "commit"
    ROLLBACK = "rollback"
    UNKNOWN = "unknown"
    RAISE = "raise"
    NONE = "none"


OUTCOMES = list(Outcome)


class LocalFailure(RuntimeError):
    """What the local transaction raises for :attr:`Outcome.RAISE`."""


class OutcomeListener:
    """Does in each local transaction what the send's ``arg`` says."""

    def execute_local_transaction(self, message: Message, arg: Outcome) -> object:
        if arg is Outcome.COMMIT:
            return LocalTransactionState.COMMIT_MESSAGE
        if arg is Outcome.ROLLBACK:
            return LocalTransactionState.ROLLBACK_MESSAGE
        if arg is Outcome.UNKNOWN:
            return LocalTransactionState.UNKNOW
        if arg is Outcome.RAISE:
            raise LocalFailure(f"local transaction {message.transaction_id} failed")
        return None

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        return LocalTransactionState.UNKNOW


@dataclass(frozen=True)
class Sent:
    """One send: which thread made it, in which position, meaning what, and its result."""

    thread: int
    index: int
    outcome: Outcome
    result: TransactionSendResult

    @property
    def key(self) -> bytes:
        return key_of(self.thread)


def key_of(thread: int) -> bytes:
    return f"key-{thread:02d}".encode()


def outcome_of(thread: int, index: int) -> Outcome:
    """Deterministic, and out of phase across threads so every batch mixes outcomes."""
    return OUTCOMES[(thread + index) % len(OUTCOMES)]


EXPECTED = {
    Outcome.COMMIT: (LocalTransactionState.COMMIT_MESSAGE, EndStatus.COMMITTED),
    Outcome.ROLLBACK: (LocalTransactionState.ROLLBACK_MESSAGE, EndStatus.ROLLED_BACK),
    Outcome.UNKNOWN: (LocalTransactionState.UNKNOW, EndStatus.LEFT_UNKNOWN),
    Outcome.RAISE: (LocalTransactionState.UNKNOW, EndStatus.LEFT_UNKNOWN),
    Outcome.NONE: (LocalTransactionState.UNKNOW, EndStatus.LEFT_UNKNOWN),
}


def _send_all(producer: TransactionProducer, real_topic: str) -> list[Sent]:
    """Every thread sends its messages one after another, all threads at once."""
    start = threading.Barrier(THREADS)

    def run(thread: int) -> list[Sent]:
        start.wait(timeout=300)  # "never came": 16 threads on a loaded runner
        sent = []
        for index in range(SENDS_PER_THREAD):
            outcome = outcome_of(thread, index)
            message = Message(
                topic=real_topic,
                value=f"{thread}:{index}",
                key=key_of(thread),
                headers=[("seq", str(index))],
            )
            result = producer.send_message_in_transaction(message, outcome)
            sent.append(Sent(thread, index, outcome, result))
        return sent

    with ThreadPoolExecutor(THREADS, thread_name_prefix="sender") as pool:
        futures = [pool.submit(run, thread) for thread in range(THREADS)]
        return [sent for future in futures for sent in future.result()]


def _decoded_results_mismatch(sent: Sent) -> str | None:
    """Why ``sent.result`` is not what its outcome promises, or ``None``."""
    result = sent.result
    state, end_status = EXPECTED[sent.outcome]
    raised = sent.outcome is Outcome.RAISE
    problems = []
    if result.send_status is not SendStatus.SEND_OK:
        problems.append(f"send_status={result.send_status}")
    if result.local_transaction_state is not state:
        problems.append(f"state={result.local_transaction_state}")
    if result.end_status is not end_status:
        problems.append(f"end_status={result.end_status} end_error={result.end_error!r}")
    if result.end_error is not None and result.end_status is end_status:
        problems.append(f"end_error={result.end_error!r}")
    if isinstance(result.local_transaction_error, LocalFailure) != raised:
        problems.append(f"local_transaction_error={result.local_transaction_error!r}")
    if not problems:
        return None
    return f"thread {sent.thread} #{sent.index} {sent.outcome.value}: " + ", ".join(problems)


def _ordered(records: list[RawRecord]) -> list[RawRecord]:
    return sorted(records, key=lambda r: (r.partition, r.offset))


def test_sixteen_threads_mixed_outcomes_land_exactly_once_in_order(
    kafka_bootstrap: str,
    kafka_admin: AdminClient,
    unique_prefix: str,
    producer_type,
) -> None:
    names = TopicNames(unique_prefix)
    real_topic = f"{unique_prefix}-events"
    ensure_topics(
        kafka_admin,
        [*plan_topics(names, PARTITIONS, 1, (GROUP,)), TopicSpec(real_topic, PARTITIONS, 1)],
    )
    settings = ProducerSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=unique_prefix)

    with producer_type(GROUP, OutcomeListener(), settings) as producer:
        started = time.monotonic()
        sent = _send_all(producer, real_topic)
        send_seconds = time.monotonic() - started
    # The rate is reported (``make bench`` measures it), not asserted: a loaded runner is slow.
    print(
        f"{len(sent)} transactions from {THREADS} threads in {send_seconds:.1f}s "
        f"({len(sent) / send_seconds:.0f}/s)"
    )

    # Every send reported what its local transaction decided.
    total = THREADS * SENDS_PER_THREAD
    assert len(sent) == total
    assert len({s.result.transaction_id for s in sent}) == total
    mismatches = [m for m in map(_decoded_results_mismatch, sent) if m is not None]
    statuses = Counter(s.result.end_status for s in sent)
    assert mismatches == [], f"{len(mismatches)} unexpected results {statuses}: {mismatches[:5]}"

    by_id = {s.result.transaction_id: s for s in sent}
    committed = {t for t, s in by_id.items() if s.result.end_status is EndStatus.COMMITTED}
    rolled_back = {t for t, s in by_id.items() if s.result.end_status is EndStatus.ROLLED_BACK}
    unknown = {t for t, s in by_id.items() if s.result.end_status is EndStatus.LEFT_UNKNOWN}
    assert len(committed) == len(rolled_back) == total // len(OUTCOMES)
    assert len(unknown) == total - len(committed) - len(rolled_back)
    client = kafka_client_config(kafka_bootstrap)

    # Halves: one per send, exactly where its result says.
    raw_halves = read_topic(client, names.half, timeout=READ_TIMEOUT)
    halves = [HalfRecord.from_record(raw) for raw in raw_halves]
    assert len(halves) == total
    half_positions = {
        h.transaction_id: (r.partition, r.offset) for h, r in zip(halves, raw_halves, strict=True)
    }
    assert half_positions == {
        t: (s.result.half_partition, s.result.half_offset) for t, s in by_id.items()
    }
    assert {(h.transaction_id, h.key, h.value) for h in halves} == {
        (t, s.key, f"{s.thread}:{s.index}".encode()) for t, s in by_id.items()
    }

    # The producer writes nothing to the real topic.
    assert read_topic(client, real_topic, isolation="read_uncommitted", timeout=READ_TIMEOUT) == []

    # Op topic: one op per commit or rollback, naming the half it ends.
    ops = [
        OpRecord.from_record(raw)
        for raw in _ordered(read_topic(client, names.op, timeout=READ_TIMEOUT))
    ]
    assert len(ops) == len(committed) + len(rolled_back)
    ops_by_id = {op.transaction_id: op for op in ops}
    assert len(ops_by_id) == len(ops), "a transaction has more than one op"
    assert ops_by_id.keys() == committed | rolled_back
    wrong_ops = []
    for transaction_id, op in ops_by_id.items():
        result = by_id[transaction_id].result
        expected_resolution = (
            Resolution.COMMIT if transaction_id in committed else Resolution.ROLLBACK
        )
        actual = (
            op.resolution,
            op.half_partition,
            op.half_offset,
            op.origin_offset,
            op.producer_group,
        )
        expected = (
            expected_resolution,
            result.half_partition,
            result.half_offset,
            result.half_offset,
            GROUP,
        )
        if actual != expected:
            wrong_ops.append((transaction_id, actual, expected))
    assert wrong_ops == [], f"{len(wrong_ops)} ops do not match their results: {wrong_ops[:5]}"

    # Order: per key (one key per thread), the op topic holds the decisions in send order,
    # so the relay can publish one key's commits in commit order.
    op_order: dict[bytes | None, list[str]] = defaultdict(list)
    for op in ops:
        op_order[by_id[op.transaction_id].key].append(op.transaction_id)
    for thread in range(THREADS):
        mine = [s for s in sent if s.thread == thread]
        assert [s.index for s in mine] == list(range(SENDS_PER_THREAD))
        end_order = [
            s.result.transaction_id
            for s in mine
            if s.result.end_status in (EndStatus.COMMITTED, EndStatus.ROLLED_BACK)
        ]
        assert op_order[key_of(thread)] == end_order, f"thread {thread}: ops reordered"
