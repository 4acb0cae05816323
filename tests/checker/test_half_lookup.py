"""The relay's half lookup against a real broker."""

from __future__ import annotations

import pytest
from confluent_kafka import TopicPartition

from outbox_checker.half_lookup import HalfLookup
from outbox_checker.kafka_reader import TopicCursor
from tests.checker.support import pending_half, write
from tests.producer.conftest import OutboxTopics

pytestmark = pytest.mark.kafka


def test_a_half_written_after_the_cursor_reached_the_end_is_found(outbox_topics: OutboxTopics):
    """A cursor at the end takes only a short look for what came since; when that look comes
    back empty (a broker just restarted or frozen; here its consumer is paused) the half
    must not be reported missing: the relay would discard a committed transaction."""
    t = outbox_topics
    names = t.names
    ((_, first),) = write(t, pending_half(t, "first").to_record(names, 0))
    cursors: list[TopicCursor] = []

    def new_cursor() -> TopicCursor:
        cursors.append(TopicCursor(t.client_config, names.half, timeout=6.0))
        return cursors[-1]

    lookup = HalfLookup(new_cursor)
    try:
        assert set(lookup.fetch(0, [first])) == {first}
        lookup.fetch(0, [first + 1])  # reads on to the end of the partition: nothing there yet
        ((_, later),) = write(t, pending_half(t, "later").to_record(names, 0))
        cursors[-1].consumer.pause([TopicPartition(names.half, 0)])  # the lookup's cursor now
        found = lookup.fetch(0, [later])
        assert found[later].offset == later
    finally:
        lookup.close()


def test_an_offset_past_the_end_is_reported_missing(outbox_topics: OutboxTopics):
    t = outbox_topics
    ((_, first),) = write(t, pending_half(t, "only").to_record(t.names, 0))
    lookup = HalfLookup(lambda: TopicCursor(t.client_config, t.names.half, timeout=6.0))
    try:
        assert lookup.fetch(0, [first, first + 5]).keys() == {first}
    finally:
        lookup.close()
