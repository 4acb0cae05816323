"""When rounds run: a half is asked about once it is due, not a whole interval later.

RocketMQ checks every ``transactionCheckInterval``; a half that comes of age just
after a round waits for the next one. The checker runs an early round when the
half that stopped the last one is due, and keeps RocketMQ's cadence for what was
already asked: a put-back copy is asked again only once per check interval.
Kafka and the checker are real; the interval is made long so an early round is
the only way the test can pass.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from outbox_checker.service import Checker
from outbox_checker.settings import CheckerSettings
from tests.checker.support import check_requests, ensure_check_topic, pending_half, wait_for, write
from tests.producer.conftest import OutboxTopics

pytestmark = pytest.mark.kafka

INTERVAL_SECONDS = 600.0
"""Longer than any wait below: only an early round can ask within them."""

PATIENCE_SECONDS = 300.0
"""How long a check is waited for: "it never came", and still half an interval."""

TIMEOUT_SECONDS = 2.0
"""The transaction timeout: a half is due this long after it was stored."""


@contextmanager
def _checker_loop(topics: OutboxTopics) -> Iterator[Checker]:
    checker = Checker(
        CheckerSettings(
            bootstrap_servers=topics.bootstrap,
            topic_prefix=topics.names.prefix,
            http_address="",
            check_interval_seconds=INTERVAL_SECONDS,
            transaction_timeout_seconds=TIMEOUT_SECONDS,
            relay=False,
        )
    )
    loop = threading.Thread(target=checker.run, daemon=True)
    loop.start()
    try:
        wait_for(lambda: checker.last_round_at is not None, 60, "the checker's first round")
        yield checker
    finally:
        checker.stop()
        loop.join(60)
    assert not loop.is_alive()


def _asked(topics: OutboxTopics) -> Counter[str]:
    return Counter(request.half.transaction_id for request in check_requests(topics))


def test_a_half_stored_after_a_round_is_asked_about_once_it_is_due(outbox_topics: OutboxTopics):
    ensure_check_topic(outbox_topics)
    with _checker_loop(outbox_topics):
        write(
            outbox_topics,
            pending_half(outbox_topics, "late", age_seconds=0).to_record(outbox_topics.names, 0),
        )
        # Asked before the next interval's round could come: an early round asked it.
        wait_for(
            lambda: _asked(outbox_topics)["late"] >= 1, PATIENCE_SECONDS, "a check of the late half"
        )


def test_an_early_round_asks_again_only_after_a_check_interval(outbox_topics: OutboxTopics):
    ensure_check_topic(outbox_topics)
    with _checker_loop(outbox_topics):
        write(
            outbox_topics,
            pending_half(outbox_topics, "first", age_seconds=0).to_record(outbox_topics.names, 0),
        )
        wait_for(
            lambda: _asked(outbox_topics)["first"] >= 1,
            PATIENCE_SECONDS,
            "a check of the first half",
        )
        # Young halves keep coming on the same partition: each brings an early round,
        # and each early round meets the first half's put-back copy.
        for index in range(3):
            write(
                outbox_topics,
                pending_half(outbox_topics, f"next-{index}", age_seconds=0).to_record(
                    outbox_topics.names, 0
                ),
            )
            time.sleep(TIMEOUT_SECONDS * 2)
        asked = _asked(outbox_topics)
    assert asked["first"] == 1, f"asked again before a check interval: {dict(asked)}"


def test_a_round_that_walked_no_partition_leaves_the_next_one_due(outbox_topics: OutboxTopics):
    """A round retried during an outage's back-off can find every partition revoked (the
    session ran out); had it counted as a round, the rejoined replica would wait a whole
    interval for the next one (measured after a broker restart: 26 s with no round)."""
    checker = Checker(
        CheckerSettings(
            bootstrap_servers=outbox_topics.bootstrap,
            topic_prefix=outbox_topics.names.prefix,
            http_address="",
            relay=False,
        )
    )
    try:
        assert checker.owned_partitions() == []  # it has not joined its group yet
        report = checker.run_round()
        assert report.partitions == []
        assert checker.last_round_at is None
    finally:
        checker.close()
