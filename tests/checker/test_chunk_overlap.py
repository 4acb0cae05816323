"""A round decides its next chunk while the broker commits the previous one, against a real broker.

Each chunk is still one Kafka transaction (its put-backs, check requests and
checkpoint visible together or not at all), and a chunk is begun only once the
previous one is committed; only the reading and deciding of the next chunk
overlaps the broker's commit. A round that fails while a commit is under way
still settles that chunk first: what Kafka committed is what the replica
remembers, so the next round neither puts a half back twice nor skips one.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer

from outbox.errors import KafkaUnavailableError
from outbox_checker import rounds
from outbox_checker.round_writer import OFFSETS_DEADLINE_SECONDS
from outbox_checker.rules import RoundChunk
from tests.checker.support import (
    SkewedClock,
    check_requests,
    ensure_check_topic,
    pending_half,
    running_checker,
    wait_for,
    write,
)
from tests.producer.conftest import OutboxTopics

pytestmark = pytest.mark.kafka

_PATIENCE = 5.0
"""How long a held commit waits to see the next chunk decided (it never is on serial code)."""


def halves_on_partition_zero(topics: OutboxTopics, count: int) -> None:
    ensure_check_topic(topics)
    write(
        topics,
        *(pending_half(topics, f"t{i}").to_record(topics.names, 0) for i in range(count)),
    )


def test_the_next_chunk_is_decided_while_the_broker_commits_the_previous_one(
    outbox_topics: OutboxTopics, monkeypatch: pytest.MonkeyPatch
):
    halves_on_partition_zero(outbox_topics, 5)
    second_decided = threading.Event()
    seen_at_first_commit: list[bool] = []
    decide = rounds.iter_round

    def watched(*args: Any, **kwargs: Any) -> Iterator[RoundChunk]:
        for index, chunk in enumerate(decide(*args, **kwargs)):
            if index == 1:
                second_decided.set()
            yield chunk

    class HeldCommits(Producer):
        """The real producer; its first commit waits until the round decided another chunk."""

        def commit_transaction(self, *args: Any) -> None:
            if not seen_at_first_commit:
                seen_at_first_commit.append(second_decided.wait(_PATIENCE))
            super().commit_transaction(*args)

    monkeypatch.setattr(rounds, "iter_round", watched)
    with running_checker(
        outbox_topics, SkewedClock(60), chunk_size=2, producer_factory=HeldCommits
    ) as checker:
        report = checker.run_round()
    assert seen_at_first_commit == [True]
    assert report.checks_sent == 5
    requests = check_requests(outbox_topics)
    assert sorted(r.half.transaction_id for r in requests) == [f"t{i}" for i in range(5)]


def test_a_round_failing_while_a_chunk_commits_remembers_that_chunk(
    outbox_topics: OutboxTopics, monkeypatch: pytest.MonkeyPatch
):
    halves_on_partition_zero(outbox_topics, 4)
    decide = rounds.iter_round

    def failing_after_one_chunk(*args: Any, **kwargs: Any) -> Iterator[RoundChunk]:
        chunks = decide(*args, **kwargs)
        yield next(chunks)
        raise KafkaUnavailableError("the half partition went away mid-round")

    with running_checker(outbox_topics, SkewedClock(60), chunk_size=2) as checker:
        monkeypatch.setattr(rounds, "iter_round", failing_after_one_chunk)
        with pytest.raises(KafkaUnavailableError, match="went away"):
            checker.run_round()
        monkeypatch.setattr(rounds, "iter_round", decide)
        # The commit returned once the coordinator logged it; the markers that make the
        # copies readable reach the half partition a moment later.
        wait_for(lambda: len(outbox_topics.read(outbox_topics.names.half)) == 6, 30, "the copies")
        # The two halves the first chunk left, and its two copies (due at once: a copy ages
        # from its original's store time) asked a second time; had the replica forgotten the
        # first chunk, it would walk its two halves again (six checks).
        assert checker.run_round().checks_sent == 4
    requests = check_requests(outbox_topics)
    first_asked = Counter(r.half.transaction_id for r in requests if r.half.check_times == 1)
    assert first_asked == {f"t{i}": 1 for i in range(4)}


def test_a_checkers_first_round_writes_with_the_producer_it_started_with(
    outbox_topics: OutboxTopics,
):
    """Its producer was started (and fenced any earlier one) moments before: starting
    another costs up to half a second of librdkafka's coordinator back-off. A round
    after a round that wrote starts a fresh one, as before (see ``RoundWriter.renew``)."""
    halves_on_partition_zero(outbox_topics, 2)
    started: list[Producer] = []

    def counted(config: dict[str, Any]) -> Producer:
        started.append(Producer(config))
        return started[-1]

    with running_checker(outbox_topics, SkewedClock(60), producer_factory=counted) as checker:
        checker.rounds.writer.renew()  # as the checker's start does (its group join may be slow)
        fresh = len(started)
        assert checker.run_round().checks_sent == 2
        assert len(started) == fresh
        checker.run_round()
        assert len(started) == fresh + 1


def test_a_round_that_writes_nothing_starts_no_producer(outbox_topics: OutboxTopics):
    """An idle partition sees an early round every transaction timeout: a producer started
    for each (InitProducerId, new connections) would be work for nothing."""
    halves_on_partition_zero(outbox_topics, 2)
    started: list[Producer] = []

    def counted(config: dict[str, Any]) -> Producer:
        started.append(Producer(config))
        return started[-1]

    with running_checker(
        outbox_topics, SkewedClock(60), producer_factory=counted, check_interval_seconds=300
    ) as checker:
        assert checker.run_round().checks_sent == 2
        before = len(started)
        # Early: the two copies just put back stop it where it began, with nothing to write.
        report = checker.run_round(early=True)
        assert report.checks_sent == 0
        assert len(started) == before


def test_a_chunk_stuck_in_its_commit_is_abandoned_and_fenced_once(
    outbox_topics: OutboxTopics, caplog: pytest.LogCaptureFixture
):
    """The round settles a written chunk once, however it fails: settling a stuck chunk
    again (from the round's clean-up) would abandon it twice and start a second fencing
    producer for nothing."""
    halves_on_partition_zero(outbox_topics, 4)
    released = threading.Event()

    class StuckCommits(Producer):
        """The real producer; its commits wait until the test is over."""

        def commit_transaction(self, *args: Any) -> None:
            released.wait(30)
            super().commit_transaction(*args)

    with running_checker(
        outbox_topics,
        SkewedClock(60),
        chunk_size=2,
        producer_factory=StuckCommits,
        writer_timeout=2.0,  # the watchdog gives up after three of them
    ) as checker:
        try:
            with (
                caplog.at_level("ERROR", logger="outbox_checker.round_writer"),
                pytest.raises(KafkaUnavailableError, match="stuck"),
            ):
                checker.run_round()
        finally:
            released.set()
    abandoned = [r for r in caplog.records if "writing a chunk is stuck" in r.getMessage()]
    assert len(abandoned) == 1


def test_a_chunk_stuck_sending_its_offsets_is_abandoned_at_its_offsets_deadline(
    outbox_topics: OutboxTopics, caplog: pytest.LogCaptureFixture
):
    """librdkafka can block in ``send_offsets_to_transaction`` far past its timeout once its
    group coordinator went away (seen after a broker restart: 80 s). The chunk's open
    transaction holds the half partition's last stable offset, so the relay publishes
    nothing behind it: the watchdog gives up on that call at its offsets deadline, not
    after three client timeouts (90 s), and the fresh producer fences the stuck one."""
    halves_on_partition_zero(outbox_topics, 2)
    released = threading.Event()

    class StuckOffsets(Producer):
        """The real producer; its first offsets wait, as librdkafka's hang does."""

        def send_offsets_to_transaction(self, *args: Any) -> None:
            if not released.is_set():
                released.wait(600)  # longer than the watchdog's three client timeouts
            super().send_offsets_to_transaction(*args)

    with running_checker(outbox_topics, SkewedClock(60), producer_factory=StuckOffsets) as checker:
        try:
            with (
                caplog.at_level("ERROR", logger="outbox_checker.round_writer"),
                pytest.raises(KafkaUnavailableError, match="stuck"),
            ):
                checker.run_round()
        finally:
            released.set()
        # Abandoned by the offsets deadline, not by the three client timeouts running out.
        stuck = [r.getMessage() for r in caplog.records if r.name == "outbox_checker.round_writer"]
        offsets = f"stuck in send_offsets_to_transaction (over {OFFSETS_DEADLINE_SECONDS:.0f}s)"
        assert any(offsets in line for line in stuck), stuck
        # The fresh producer wrote nothing of the stuck chunk; the next round writes it whole.
        assert checker.run_round().checks_sent == 2
    asked = Counter(r.half.transaction_id for r in check_requests(outbox_topics))
    assert asked == {"t0": 1, "t1": 1}
