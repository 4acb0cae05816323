"""The checker's transactional producers ask a busy coordinator again within milliseconds.

Right after a commit the coordinator answers the next transaction's first
request with ``CONCURRENT_TRANSACTIONS`` until the commit's markers are
written; at librdkafka's default back-off (100 ms) every event of that batch
waited 100 ms more to be published (``docs/benchmarks.md``).
"""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from outbox_checker import relay_transaction
from outbox_checker.transactional import RETRY_BACKOFF_MS, transactional_config
from tests.checker.test_relay import relay_of
from tests.checker.test_round_writer import new_writer
from tests.producer.conftest import OutboxTopics

DEFAULT_BACKOFF_MS = 100
"""librdkafka's ``retry.backoff.ms``."""


def test_the_back_off_is_short_and_a_users_property_still_wins() -> None:
    config = transactional_config(
        {"bootstrap.servers": "b:9092"}, "t", linger_ms=1, transaction_timeout_ms=10_000
    )
    assert config["retry.backoff.ms"] == RETRY_BACKOFF_MS < DEFAULT_BACKOFF_MS / 10
    chosen = transactional_config(
        {"bootstrap.servers": "b:9092", "retry.backoff.ms": 50, "acks": "1"},
        "t",
        linger_ms=1,
        transaction_timeout_ms=10_000,
    )
    assert chosen["retry.backoff.ms"] == 50
    assert chosen["acks"] == "all" and chosen["enable.idempotence"] is True


@pytest.mark.kafka
def test_the_relay_and_the_round_start_their_producers_with_the_short_back_off(
    outbox_topics: OutboxTopics, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[dict] = []

    class Recorded(Producer):
        def __init__(self, config: dict) -> None:
            started.append(dict(config))
            super().__init__(config)

    monkeypatch.setattr(relay_transaction, "Producer", Recorded)
    with relay_of(outbox_topics):
        pass
    writer = new_writer(outbox_topics, producer_factory=Recorded)
    writer.close()
    transactional = [c for c in started if "transactional.id" in c]
    assert len(transactional) >= 2, started
    assert all(c["retry.backoff.ms"] == RETRY_BACKOFF_MS for c in transactional)
