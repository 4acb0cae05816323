"""Helpers for checker tests against a real broker."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient

from outbox.admin import TopicSpec, ensure_topics
from outbox.config import KAFKA_LOGGER_NAME
from outbox.protocol import CheckRequest, DiscardRecord, HalfRecord, OutgoingRecord
from outbox_checker.rules import RoundRules
from outbox_checker.service import Checker
from outbox_checker.settings import CheckerSettings
from tests.producer.conftest import OutboxTopics

_log = logging.getLogger(__name__)


class SkewedClock:
    """Real time plus an offset the test moves: halves become due without sleeping."""

    def __init__(self, skew_seconds: float = 0.0) -> None:
        self.skew = skew_seconds

    def __call__(self) -> float:
        return time.time() + self.skew


@contextmanager
def running_checker(
    topics: OutboxTopics,
    clock: Callable[[], float],
    *,
    relay: bool = False,
    chunk_size: int | None = None,
    producer_factory: Callable[[dict[str, Any]], Producer] = Producer,
    writer_timeout: float = 30.0,
    **overrides: object,
) -> Iterator[Checker]:
    """An in-process checker that owns every half partition (and, with ``relay``, relays).

    ``chunk_size``, ``producer_factory`` and ``writer_timeout`` are the rounds' (see
    :class:`Checker`); ``overrides`` are settings."""
    settings = CheckerSettings(
        bootstrap_servers=topics.bootstrap,
        topic_prefix=topics.names.prefix,
        http_address="",
        **overrides,
    )
    rules = RoundRules.from_settings(settings)
    checker = Checker(
        settings,
        clock=clock,
        rules=rules if chunk_size is None else dataclasses.replace(rules, chunk_size=chunk_size),
        producer_factory=producer_factory,
        writer_timeout=writer_timeout,
    )
    try:
        deadline = time.monotonic() + 60
        while len(checker.owned_partitions()) < 3:
            assert time.monotonic() < deadline, "checker got no partitions"
            checker.poll_membership(0.2)
        if relay:
            started = checker.start_relay()
            assert started is not None
            wait_for(lambda: len(started.partitions) == 3, what="the relay's op partitions")
        yield checker
    finally:
        checker.close()


WRITE_ATTEMPT_SECONDS = 20.0
"""How long a fresh producer may take to deliver; a healthy broker needs well under 2 s."""

LEADER_PATIENCE_SECONDS = 45.0
"""How long a producer waits for the broker to name the leaders before it writes: a thawed
node fences its own broker, and a starved one stayed fenced 10 s in a loaded run (issue 39)."""

WRITE_ATTEMPTS = 3
"""Fresh producers tried before :func:`write` gives up."""

SENT_PATIENCE_SECONDS = 70.0
"""More time for a producer that sent its records unanswered: only it may resend them
without storing them twice (its producer id and sequence numbers dedupe the resend)."""

_WRITE_DEBUG = "broker,protocol,msg,eos"
"""librdkafka's debug contexts kept (in memory only) for the report of a failed write."""

_PURGED = (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT)


class _ClientLog(logging.Logger):
    """One producer's librdkafka log: the last lines kept, warnings passed on, sends noted.

    The debug lines go nowhere but this buffer, which a failed write reports;
    warnings and errors also reach ``outbox.kafka`` as without debugging.
    """

    def __init__(self, name: str) -> None:
        super().__init__(name, logging.DEBUG)
        self.lines: deque[str] = deque(maxlen=120)
        self.began = time.monotonic()
        self.produce_sent = False
        """A ProduceRequest left this client: its records may be stored."""

    def handle(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        self.produce_sent = self.produce_sent or "Sent ProduceRequest" in message
        self.lines.append(f"+{time.monotonic() - self.began:6.2f}s {message}")
        if record.levelno >= logging.WARNING:
            logging.getLogger(KAFKA_LOGGER_NAME).handle(record)


def write(topics: OutboxTopics, *records: OutgoingRecord) -> list[tuple[int, int]]:
    """Write ``records``; their (partition, offset), in the order given.

    A fresh idempotent producer made just after a broker thawed from a pause
    (SIGSTOP, a stalled VM) once delivered nothing in 60 s (issue 39). So each
    producer first waits (:data:`LEADER_PATIENCE_SECONDS`) for the broker to name a
    leader for every partition of the topics written: after a pause the node fences
    its own broker, its partitions leaderless until it is let back in. Then the
    producer gets :data:`WRITE_ATTEMPT_SECONDS` to deliver. One
    that never sent the records is purged and replaced by a fresh one; one that
    sent them unanswered keeps them (a fresh one could store them twice) for
    :data:`SENT_PATIENCE_SECONDS` more. A write that fails for good reports
    each attempt with the tail of its librdkafka debug log.
    """
    kwargs = [record.produce_kwargs() for record in records]
    failures: list[str] = []
    for attempt in range(1, WRITE_ATTEMPTS + 1):
        positions, problem, sent = _write_once(topics, kwargs, attempt)
        if problem is None:
            return positions
        failures.append(problem)
        if sent:
            break  # the records may be stored: writing them again could duplicate them
        if attempt < WRITE_ATTEMPTS:
            _log.warning("write: retrying with a fresh producer; %s", problem)
    raise AssertionError(
        f"writing {len(records)} record(s) to {sorted({k['topic'] for k in kwargs})} failed:\n"
        + "\n".join(failures)
    )


def _write_once(
    topics: OutboxTopics, records: list[dict[str, Any]], attempt: int
) -> tuple[list[tuple[int, int]], str | None, bool]:
    """One fresh producer's try: positions, what went wrong, whether it sent any record."""
    positions: list[tuple[int, int]] = [(-1, -1)] * len(records)
    errors: list[KafkaError] = []
    log = _ClientLog(f"tests.checker.write.{attempt}")
    began = time.monotonic()
    producer = Producer(
        {
            **topics.client_config,
            "enable.idempotence": True,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "debug": _WRITE_DEBUG,
            "logger": log,
        }
    )

    def delivered_as(index: int) -> Callable[[KafkaError | None, Message], None]:
        def delivered(error: KafkaError | None, message: Message) -> None:
            if error is None:
                positions[index] = (message.partition(), message.offset())
            elif error.code() not in _PURGED:
                errors.append(error)

        return delivered

    leaderless = _leaderless(producer, {r["topic"] for r in records}, LEADER_PATIENCE_SECONDS)
    if not leaderless:
        deadline = time.monotonic() + WRITE_ATTEMPT_SECONDS
        for index, record in enumerate(records):
            while True:
                try:
                    producer.produce(**record, on_delivery=delivered_as(index))
                    break
                except BufferError:
                    producer.poll(0.05)
        left = producer.flush(max(0.0, deadline - time.monotonic()))
        producer.poll(0)  # the log lines queued meanwhile: was a ProduceRequest sent?
        if left and log.produce_sent:
            left = producer.flush(SENT_PATIENCE_SECONDS)
        assert not errors, errors  # a record the broker refused is the test's own doing
        if not left:
            return positions, None, False
        what = f"{left} record(s) undelivered"
    else:
        what = f"no leader named for {leaderless}"
    producer.purge(in_queue=True, in_flight=True)
    producer.flush(0)  # serves the purged records' reports and the last log lines
    sent = log.produce_sent
    tail = "\n    ".join(log.lines)
    problem = (
        f"attempt {attempt}: {what} after {time.monotonic() - began:.1f}s "
        f"({'records sent' if sent else 'no record sent'}); librdkafka's last lines:\n    {tail}"
    )
    return positions, problem, sent


def _leaderless(producer: Producer, names: set[str], patience: float) -> str:
    """Partitions of ``names`` the broker names no leader for after ``patience`` s (``""``: none).

    After a pause the broker fences itself and its partitions have no leader for a
    moment; the metadata also proves that this fresh client can talk to the broker.
    """
    deadline = time.monotonic() + patience
    while True:
        missing = []
        for name in sorted(names):
            try:
                topic = producer.list_topics(name, timeout=2).topics[name]
            except KafkaException as exc:
                missing.append(f"{name} (metadata: {exc.args[0]})")
                continue
            if topic.error or not topic.partitions:
                missing.append(f"{name} ({topic.error or 'no partitions'})")
            missing += [
                f"{name}[{number}]"
                for number, partition in sorted(topic.partitions.items())
                if partition.leader < 0 or partition.error
            ]
        if not missing or time.monotonic() >= deadline:
            return ", ".join(missing)
        producer.poll(0.1)  # serves the log lines, so their times are those of the wait


def pending_half(
    topics: OutboxTopics, txid: str, *, age_seconds: float = 60.0, **changes
) -> HalfRecord:
    fields = dict(
        transaction_id=txid,
        producer_group="orders",
        real_topic=topics.real_topic,
        key=txid.encode(),
        value=b"v",
        born_ms=int((time.time() - age_seconds) * 1000),
    )
    fields.update(changes)
    return HalfRecord(**fields)


def ensure_check_topic(topics: OutboxTopics, group: str = "orders") -> None:
    """Create the group's check topic up front, so tests can read it before the checker writes."""
    admin = AdminClient(topics.client_config)
    ensure_topics(admin, [TopicSpec(topics.names.check(group), 3, 1)])


def check_requests(topics: OutboxTopics, group: str = "orders") -> list[CheckRequest]:
    return [CheckRequest.from_record(r) for r in topics.read(topics.names.check(group))]


def discards(topics: OutboxTopics) -> list[DiscardRecord]:
    return [DiscardRecord.from_record(r) for r in topics.read(topics.names.discard)]


def now_ms() -> int:
    """The wall clock in milliseconds, as records' timestamps count."""
    return int(time.time() * 1000)


def wait_for(predicate: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
