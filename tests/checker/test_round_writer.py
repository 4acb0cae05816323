"""The round writer's watchdog, against a real broker: an abandoned chunk harms no later one.

A chunk stuck past the watchdog is abandoned and its producer fenced by a fresh
one. When the stuck call finally fails, its recovery must touch only its own
(fenced) producer: recovering with the writer's *current* producer would abort
or fence the transaction of whichever chunk is being written at that moment.
The chunk is made to hang the way a slow database makes it hang in the
resolve-from-database mode: its ``answer`` call blocks mid-transaction.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from outbox.errors import KafkaUnavailableError
from outbox.protocol import HalfRecord, OutgoingRecord, RawRecord
from outbox.topic_catalog import TopicCatalog
from outbox_checker import round_writer
from outbox_checker.entries import HalfEntry
from outbox_checker.round_writer import ChunkResult, RoundWriter
from outbox_checker.rules import RoundChunk
from tests.checker.support import check_requests, ensure_check_topic, now_ms, pending_half, write
from tests.fixtures.reports import reports_without_offsets
from tests.producer.conftest import OutboxTopics

pytestmark = pytest.mark.kafka


def chunk_of(half: HalfRecord, checkpoint: int) -> RoundChunk:
    raw = RawRecord("half", 0, checkpoint - 1)
    return RoundChunk(
        0, to_check=[HalfEntry(raw, 0, half)], half_checkpoint=checkpoint, op_checkpoint=0
    )


def new_writer(
    t: OutboxTopics,
    producer_factory: Callable[[dict[str, Any]], Producer] = Producer,
    timeout: float = 10.0,
    **options: Any,
) -> RoundWriter:
    """A writer with a 10 s timeout unless told (its watchdog gives up after three: 30 s, so
    a chunk on a loaded runner is not abandoned); a fresh broker may still be loading its
    transaction coordinator, which is retriable.
    ``options``: the writer's other knobs (``transaction_timeout_ms``)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            return RoundWriter(
                t.client_config,
                f"{t.names.prefix}.w.{uuid.uuid4().hex[:6]}",
                t.names,
                TopicCatalog(AdminClient(t.client_config), 10.0),
                timeout=timeout,
                producer_factory=producer_factory,
                **options,
            )
        except KafkaUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def test_an_abandoned_chunk_does_not_abort_the_next_one(outbox_topics: OutboxTopics):
    t = outbox_topics
    ensure_check_topic(t)
    writer = new_writer(t, timeout=5.0)  # the stuck chunk is abandoned after 15 s
    group = Consumer({**t.client_config, "group.id": f"{t.names.prefix}.checker"})
    metadata = group.consumer_group_metadata()
    release_stuck, next_in_transaction, stuck_recovered = (threading.Event() for _ in range(3))

    def stuck_database(*_: object) -> list[OutgoingRecord]:
        release_stuck.wait(120)
        return []

    with pytest.raises(KafkaUnavailableError, match="abandoned"):
        writer.write(chunk_of(pending_half(t, "stuck"), 1), metadata, lambda: 0, stuck_database)

    def slow_database(*_: object) -> list[OutgoingRecord]:
        next_in_transaction.set()
        stuck_recovered.wait(60)
        return []

    outcome: list[ChunkResult | BaseException] = []

    def write_next() -> None:
        try:
            outcome.append(
                writer.write(
                    chunk_of(pending_half(t, "next"), 2), metadata, lambda: 0, slow_database
                )
            )
        except BaseException as exc:
            outcome.append(exc)

    follower = threading.Thread(target=write_next)
    follower.start()
    assert next_in_transaction.wait(30)
    release_stuck.set()  # the abandoned call goes on, fails (fenced) and recovers
    time.sleep(2.5)
    stuck_recovered.set()
    follower.join(60)
    writer.close()
    group.close()
    assert outcome and isinstance(outcome[0], ChunkResult), outcome
    assert [r.half.transaction_id for r in check_requests(t)] == ["next"]


def test_a_requeued_half_keeps_its_identity(outbox_topics: OutboxTopics):
    """A half inside its own immunity time is moved to the end of its partition, not
    checked; its decision (naming the original offset) must still decide the moved copy."""
    t = outbox_topics
    writer = new_writer(t)
    group = Consumer({**t.client_config, "group.id": f"{t.names.prefix}.checker"})
    half = pending_half(t, "immune", immunity_seconds=600)
    chunk = RoundChunk(
        0, to_requeue=[HalfEntry(RawRecord("half", 0, 41), 1_000, half)], half_checkpoint=42
    )
    writer.write(chunk, group.consumer_group_metadata(), lambda: 0)
    writer.close()
    group.close()
    (moved,) = [HalfRecord.from_record(r) for r in t.read(t.names.half)]
    assert (moved.identity(99), moved.origin_stored_ms, moved.check_times) == (41, 1_000, 0)


def test_a_put_back_copy_stored_at_an_unreported_offset_aborts_its_chunk(
    outbox_topics: OutboxTopics,
):
    """The check request names its copy by offset: a copy whose report carries no offset
    (librdkafka's report of a retried write answered as a duplicate) cannot be named, so
    the chunk's transaction is aborted and the round retried, never a request for a guess."""
    t = outbox_topics
    ensure_check_topic(t)

    writer = new_writer(t, producer_factory=reports_without_offsets())
    group = Consumer({**t.client_config, "group.id": f"{t.names.prefix}.checker"})
    with pytest.raises(KafkaException, match="not stored at a known offset"):
        writer.write(
            chunk_of(pending_half(t, "unnamed"), 1), group.consumer_group_metadata(), lambda: 0
        )
    writer.close()
    group.close()
    assert check_requests(t) == []
    assert t.read(t.names.half) == []  # the copy's transaction was aborted


def test_a_chunk_waiting_on_its_group_coordinator_holds_back_no_half(
    outbox_topics: OutboxTopics, monkeypatch: pytest.MonkeyPatch
):
    """While a chunk waits in ``send_offsets_to_transaction`` (librdkafka can wait there on
    a group coordinator it lost, past its timeout, until the watchdog abandons the chunk),
    its transaction must hold no record on the half partition: a record there holds the
    partition's last stable offset, and the relay, reading committed, could publish none of
    the halves stored behind it (5.1 s after an outage, in a suite run). So the offsets go
    first, before any copy is written; a half stored meanwhile is readable at once. (The
    watchdog, the client timeouts and the transaction timeout are all made longer than
    the test's wait, 10 min: nothing but the order of the writes can free the half.)"""
    t = outbox_topics
    monkeypatch.setattr(round_writer, "OFFSETS_DEADLINE_SECONDS", 600.0)
    ensure_check_topic(t)
    waiting, release = threading.Event(), threading.Event()

    class SlowCoordinator(Producer):
        """The real producer; its first ``send_offsets_to_transaction`` waits to be released."""

        def send_offsets_to_transaction(self, *args: Any) -> None:
            if not waiting.is_set():
                waiting.set()
                release.wait(600)
            super().send_offsets_to_transaction(*args)

    writer = new_writer(
        t, producer_factory=SlowCoordinator, timeout=200.0, transaction_timeout_ms=600_000
    )
    group = Consumer({**t.client_config, "group.id": f"{t.names.prefix}.checker"})
    outcome: list[ChunkResult | BaseException] = []

    def write_chunk() -> None:
        try:
            outcome.append(
                writer.write(
                    chunk_of(pending_half(t, "waiting"), 1), group.consumer_group_metadata(), now_ms
                )
            )
        except BaseException as exc:
            outcome.append(exc)

    chunk = threading.Thread(target=write_chunk)
    chunk.start()
    try:
        assert waiting.wait(30), "the chunk never sent its offsets"
        time.sleep(0.5)  # past linger.ms: a copy produced before the offsets is on the broker
        ((_, stored_at),) = write(t, pending_half(t, "behind").to_record(t.names, 0))
        # While the chunk still waits: a half held back would stay unreadable until release.
        seen = read_committed_record(t, t.names.half, 0, stored_at, within=120.0)
    finally:
        release.set()
        chunk.join(60)
        writer.close()
        group.close()
    assert seen, "a half stored while the chunk waited on its coordinator was held back"
    assert outcome and isinstance(outcome[0], ChunkResult), outcome
    assert [r.half.transaction_id for r in check_requests(t)] == ["waiting"]


def read_committed_record(
    t: OutboxTopics, topic: str, partition: int, offset: int, within: float
) -> bool:
    """Whether a read-committed consumer (the relay's view) gets the record at ``offset``."""
    reader = Consumer(
        {
            **t.client_config,
            "group.id": f"{t.names.prefix}.probe",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        reader.assign([TopicPartition(topic, partition, offset)])
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            message = reader.poll(0.2)
            if message is not None and message.error() is None and message.offset() == offset:
                return True
        return False
    finally:
        reader.close()
