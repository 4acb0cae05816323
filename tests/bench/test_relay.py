"""``bench.relay``'s helpers on the test broker: decisions written without a relay are
published afterwards, each once (what the producer bench relies on to count its records)."""

from __future__ import annotations

import pytest

from bench.checker import drop_topics, fresh_topics
from bench.relay import drain_relay, real_count, write_decided

pytestmark = pytest.mark.kafka


def test_drain_relay_publishes_each_commit_once(kafka_bootstrap: str) -> None:
    topics = fresh_topics(kafka_bootstrap, "drain")
    try:
        write_decided(kafka_bootstrap, topics, 50, 16)

        assert drain_relay(kafka_bootstrap, topics, quiet_seconds=1.0) == 50
        # A second drain resumes from the committed offsets: nothing is published twice.
        assert drain_relay(kafka_bootstrap, topics, quiet_seconds=1.0) == 0
        assert real_count(kafka_bootstrap, f"{topics.prefix}.events") == 50
    finally:
        drop_topics(kafka_bootstrap, topics)
