"""The rounds' partition cursor against a real broker."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient

from outbox.admin import TopicSpec, ensure_topics
from outbox.config import kafka_client_config
from outbox.errors import KafkaUnavailableError
from outbox.protocol import OutgoingRecord
from outbox_checker.kafka_reader import END_OFFSETS_MARGIN_SECONDS, TopicCursor, end_offsets
from tests.checker.support import write
from tests.producer.conftest import OutboxTopics

pytestmark = pytest.mark.kafka


def test_a_cursor_whose_consumer_went_silent_reads_on_with_a_fresh_one(
    outbox_topics: OutboxTopics,
):
    """Records wait on the partition but the consumer hears nothing: it is wedged, not at end.

    A frozen broker can leave a librdkafka consumer so (paused here, which is
    the same silence); a retry at the same offset used to reuse it for ever.
    """
    t = outbox_topics
    topic = t.names.op
    write(t, *(OutgoingRecord(topic, None, b"%d" % i, partition=0) for i in range(3)))
    cursor = TopicCursor(t.client_config, topic, timeout=6.0)
    try:
        assert [r.value for r in cursor.read(0, 0, 1)] == [b"0"]
        cursor.consumer.pause([TopicPartition(topic, 0)])
        assert [r.value for r in cursor.read(0, 1, 10)] == [b"1", b"2"]
        assert cursor.replacements == 1
    finally:
        cursor.close()


def test_a_cursor_at_the_end_of_its_partition_is_not_replaced(outbox_topics: OutboxTopics):
    t = outbox_topics
    topic = t.names.op
    write(t, OutgoingRecord(topic, None, b"only", partition=0))
    cursor = TopicCursor(t.client_config, topic, timeout=6.0, end_check_seconds=0.0)
    try:
        assert [r.value for r in cursor.read(0, 0, 10)] == [b"only"]
        assert cursor.read(0, 1, 10) == []
        assert cursor.replacements == 0
    finally:
        cursor.close()


def test_a_cursor_wedged_at_the_end_of_its_partition_sees_what_came_after(
    outbox_topics: OutboxTopics,
):
    """At the end, a wedged consumer would answer "nothing new" for ever; the broker says
    otherwise, and a fresh consumer reads on."""
    t = outbox_topics
    topic = t.names.op
    write(t, OutgoingRecord(topic, None, b"first", partition=0))
    cursor = TopicCursor(t.client_config, topic, timeout=6.0, end_check_seconds=0.0)
    try:
        assert [r.value for r in cursor.read(0, 0, 10)] == [b"first"]
        assert cursor.read(0, 1, 10) == []
        cursor.consumer.pause([TopicPartition(topic, 0)])
        write(t, OutgoingRecord(topic, None, b"later", partition=0))
        assert [r.value for r in cursor.read(0, 1, 10)] == [b"later"]
        assert cursor.replacements == 1
    finally:
        cursor.close()


def test_reads_of_any_limit_continue_where_the_last_one_stopped(outbox_topics: OutboxTopics):
    """A read takes what arrived at once when it fits its limit and leaves the rest buffered
    for the next read: no record skipped or repeated, whatever the limits; a read elsewhere
    starts over there."""
    t = outbox_topics
    topic = t.names.op
    write(t, *(OutgoingRecord(topic, None, b"%d" % i, partition=0) for i in range(40)))
    cursor = TopicCursor(t.client_config, topic, timeout=6.0)
    try:
        seen: list[int] = []
        start = 0
        for limit in (1, 3, 2, 500, 10):
            batch = cursor.read(0, start, limit)
            assert len(batch) <= limit
            seen += [r.offset for r in batch]
            if batch:
                start = batch[-1].offset + 1
        assert seen == list(range(40))
        assert [int(r.value or b"") for r in cursor.read(0, 7, 4)] == [7, 8, 9, 10]
        assert [r.offset for r in cursor.read(0, 11, 2)] == [11, 12]
    finally:
        cursor.close()


@pytest.mark.kafka
def test_end_offsets_answers_within_its_timeout_when_the_broker_does_not(own_kafka_broker):
    """A frozen broker never answers. librdkafka then gives the timed-out request the offset
    OFFSET_INVALID (-1001) rather than an error, and it was returned as the end: the discard
    resume's wait for open transactions took it for "every transaction ended", the relay
    for "the half was never stored". And once the answer never came at all (a node killed
    under a three-node cluster) and the relay, waiting on the future with no bound,
    published nothing for over 35 s."""
    # The client's own network timeout as long as librdkafka allows (300 s): an answer only
    # it gave would come that late, so one far sooner is the call's 2 s at work.
    config = kafka_client_config(own_kafka_broker.bootstrap_servers, {"socket.timeout.ms": 300000})
    admin = AdminClient(config)
    ensure_topics(admin, [TopicSpec("ends", 1, 1)])
    assert end_offsets(admin, "ends", [0], IsolationLevel.READ_COMMITTED, 5.0) == {0: 0}
    waited = f"{2.0 + END_OFFSETS_MARGIN_SECONDS:.0f}"
    with own_kafka_broker.frozen():
        started = time.monotonic()
        with pytest.raises(
            KafkaUnavailableError, match=rf"ends\[0\]: no answer within ({waited}|2)s"
        ):
            end_offsets(admin, "ends", [0], IsolationLevel.READ_COMMITTED, 2.0)
        took = time.monotonic() - started
    # Answered while the broker is still frozen (an unbounded wait lasts the whole freeze),
    # and far below the client's 300 s: a hang detector, not a measure of the 2 s.
    assert took < 120, f"answered after {took:.1f}s"
