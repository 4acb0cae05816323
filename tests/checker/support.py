"""Helpers for checker tests against a real broker."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from outbox_checker.service import Checker
from outbox_checker.settings import CheckerSettings

from outbox.admin import TopicSpec, ensure_topics
from outbox.protocol import CheckRequest, DiscardRecord, HalfRecord, OutgoingRecord
from tests.producer.conftest import OutboxTopics


class SkewedClock:
    """Real time plus an offset the test moves: halves become due without sleeping."""

    def __init__(self, skew_seconds: float = 0.0) -> None:
        self.skew = skew_seconds

    def __call__(self) -> float:
        return time.time() + self.skew


@contextmanager
def running_checker(
    topics: OutboxTopics, clock: Callable[[], float], *, relay: bool = False, **overrides: object
) -> Iterator[Checker]:
    """An in-process checker that owns every half partition (and, with ``relay``, relays)."""
    settings = CheckerSettings(
        bootstrap_servers=topics.bootstrap,
        topic_prefix=topics.names.prefix,
        http_address="",
        **overrides,
    )
    checker = Checker(settings, clock=clock)
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


def write(topics: OutboxTopics, *records: OutgoingRecord) -> list[tuple[int, int]]:
    """Write ``records``; their (partition, offset), in the order given."""
    positions: list[tuple[int, int]] = [(-1, -1)] * len(records)
    producer = Producer(
        {
            **topics.client_config,
            "enable.idempotence": True,
            "linger.ms": 20,
            "batch.size": 1_000_000,
        }
    )

    def delivered_as(index: int) -> Callable[[object, object], None]:
        def delivered(error, message) -> None:
            assert error is None, error
            positions[index] = (message.partition(), message.offset())

        return delivered

    for index, record in enumerate(records):
        while True:
            try:
                producer.produce(**record.produce_kwargs(), on_delivery=delivered_as(index))
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0
    return positions


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


def wait_for(predicate: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
