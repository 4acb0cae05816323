"""The relay's half lookup against a real broker."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from outbox.access import principal_of
from outbox.admin import TopicSpec, ensure_topics
from outbox.errors import KafkaUnavailableError
from outbox.protocol import Decision, Header, OutgoingRecord
from outbox.size_limits import SizeLimits
from outbox.topic_catalog import TopicCatalog
from outbox_checker.half_lookup import HalfLookup
from outbox_checker.kafka_reader import TopicCursor
from outbox_checker.relay_batch import BatchReport
from outbox_checker.relay_records import RealRecords
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
        assert cursors[-1].read(0, first + 1, 1) == []  # the lookup's cursor at the end
        ((_, later),) = write(t, pending_half(t, "later").to_record(names, 0))
        cursors[-1].consumer.pause([TopicPartition(names.half, 0)])  # the lookup's cursor now
        found = lookup.fetch(0, [later])
        assert found[later].offset == later
    finally:
        lookup.close()


def _stale_replica(t: OutboxTopics, halves: int) -> str:
    """A one-partition topic holding a copy of the first ``halves`` halves of half partition 0:
    a real log that ends where a stale replica's would (a cut leader, a new leader whose
    high watermark trails), for the lookup's cursor to read instead of the half topic."""
    stale = f"{t.names.prefix}-stale-half"
    ensure_topics(AdminClient(t.client_config), [TopicSpec(stale, 1, 1)])
    copies = t.read(t.names.half)[:halves]
    write(t, *(OutgoingRecord(stale, raw.key, raw.value, list(raw.headers), 0) for raw in copies))
    return stale


def test_a_half_below_the_readable_end_that_the_reader_stops_short_of_is_a_failed_read(
    outbox_topics: OutboxTopics,
):
    """Under a network partition the relay once asked the half's leader for its end (the
    half below it), then read from a replica whose log ended earlier: the lookup took
    "not found" for "not stored", and the relay discarded a committed transaction as
    unpublishable. A read that ends before a wanted offset proves nothing about it."""
    t = outbox_topics
    positions = write(t, *(pending_half(t, f"tx{n}").to_record(t.names, 0) for n in range(3)))
    stale = _stale_replica(t, 1)
    lookup = HalfLookup(lambda: TopicCursor(t.client_config, stale, timeout=6.0))
    try:
        with pytest.raises(KafkaUnavailableError, match=rf"half partition 0.*{positions[2][1]}"):
            lookup.fetch(0, [positions[2][1]])
    finally:
        lookup.close()


def test_a_committed_half_the_lookup_reads_short_is_not_discarded(outbox_topics: OutboxTopics):
    """The relay's real records for a batch: a short read fails the batch (read again after
    its back-off) instead of writing the commit to the discard topic."""
    t = outbox_topics
    ((_, offset),) = write(t, pending_half(t, "committed").to_record(t.names, 0))
    write(t, pending_half(t, "later").to_record(t.names, 0))
    stale = _stale_replica(t, 0)
    lookup = HalfLookup(lambda: TopicCursor(t.client_config, stale, timeout=6.0))
    catalog = TopicCatalog(AdminClient(t.client_config), 10.0, principal_of(t.client_config))
    records = RealRecords(lookup, catalog, SizeLimits(catalog, t.client_config), t.names, lambda: 0)
    commit = Decision(
        "committed", half_partition=0, half_offset=offset, identity=offset, commit=True
    )
    report = BatchReport()
    try:
        with pytest.raises(KafkaUnavailableError):
            records.of_commits({0: [commit]}, report)
    finally:
        lookup.close()
    assert report.unpublishable == 0


def test_an_aborted_half_is_reported_missing(outbox_topics: OutboxTopics):
    """A read that passes an offset without a record there has looked: the half was aborted
    (or retention removed it), and the lookup says so instead of reading for ever."""
    t = outbox_topics
    producer = Producer({**t.client_config, "transactional.id": f"{t.names.prefix}-aborting"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(**pending_half(t, "aborted").to_record(t.names, 0).produce_kwargs())
    producer.flush(30)
    producer.abort_transaction(30)
    ((_, after),) = write(t, pending_half(t, "after").to_record(t.names, 0))
    lookup = HalfLookup(lambda: TopicCursor(t.client_config, t.names.half, timeout=6.0))
    try:
        found = lookup.fetch(0, range(after + 1))
    finally:
        lookup.close()
    assert after in found
    assert [raw.header_text(Header.TRANSACTION_ID.value) for raw in found.values()] == ["after"]
