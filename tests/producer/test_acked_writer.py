"""The acknowledgement each write gets: one report, every waiter and watcher told once.

A send's thread waits on it, an event loop watches it (``add_done_callback``,
possibly while the report is being delivered), a oneway op's reporter watches
it after the caller returned. Against a real broker: the reports are the
client's own, on its report thread.
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from confluent_kafka import Message

from outbox.acked_writer import AckedWriter, Acknowledgement
from outbox.errors import EndTransactionError, HalfWriteError
from outbox.protocol import OutgoingRecord
from tests.fixtures.reports import OFFSET_INVALID
from tests.producer.conftest import OutboxTopics

pytestmark = pytest.mark.kafka

RECORDS = 2000
WATCHERS = 3


def test_every_watcher_runs_once_whether_added_before_during_or_after_the_report(
    outbox_topics: OutboxTopics,
) -> None:
    writer = AckedWriter(outbox_topics.client_config)
    calls: Counter[tuple[int, int]] = Counter()
    lock = threading.Lock()
    acknowledgements: list[Acknowledgement] = []

    def watch(index: int, watcher: int) -> None:
        def watcher_called(acknowledgement: Acknowledgement) -> None:
            assert acknowledgement.done()
            with lock:
                calls[index, watcher] += 1

        acknowledgements[index].add_done_callback(watcher_called)

    try:
        for index in range(RECORDS):
            record = OutgoingRecord(outbox_topics.real_topic, b"%d" % index, b"v")
            acknowledgements.append(writer.submit_nowait(record, HalfWriteError))
            watch(index, 0)  # racing the report thread: added while reports arrive
        adders = [
            threading.Thread(target=lambda w=w: [watch(i, w) for i in range(RECORDS)])
            for w in range(1, WATCHERS)
        ]
        for adder in adders:
            adder.start()
        positions = [ack.result(30) for ack in acknowledgements]
        for adder in adders:
            adder.join()
    finally:
        writer.close()
    assert len(set(positions)) == RECORDS, "each record has a position of its own"
    assert calls == Counter({(i, w): 1 for i in range(RECORDS) for w in range(WATCHERS)})
    # Watched after the report: at once, on the adding thread.
    late: list[Acknowledgement] = []
    acknowledgements[0].add_done_callback(late.append)
    assert late == [acknowledgements[0]]


def test_a_report_that_does_not_come_in_time_raises_timeout_and_a_refusal_the_callers_error(
    outbox_topics: OutboxTopics,
) -> None:
    writer = AckedWriter({**outbox_topics.client_config, "message.timeout.ms": 1000})
    try:
        refused = writer.submit_nowait(
            OutgoingRecord("no-such-topic-" + outbox_topics.names.prefix, b"k", b"v"),
            EndTransactionError,
        )
        with pytest.raises(TimeoutError):
            refused.result(0)  # nothing reported yet: waits no longer than asked
        with pytest.raises(EndTransactionError, match="record not stored"):
            refused.result(30)
        assert isinstance(refused.exception(), EndTransactionError)
        with pytest.raises(EndTransactionError):  # the same failure for every waiter
            refused.result(0)
    finally:
        writer.close()


@pytest.mark.parametrize("unknown", [OFFSET_INVALID, -1], ids=["OFFSET_INVALID", "END"])
def test_a_stored_record_whose_offset_the_client_does_not_know_keeps_it_unknown(
    unknown: int,
) -> None:
    # librdkafka reports a record stored without its offset in some cases (an
    # idempotent write retried across a leader change, answered as a duplicate):
    # confluent-kafka's offset() is then None. Taken as offset 0, a half would be
    # named by another transaction's position (a chaos run lost a commit so).
    acknowledgement = Acknowledgement("t", HalfWriteError, {})
    acknowledgement(None, Message(topic="t", partition=2, offset=unknown))
    assert acknowledgement.result(0) == (2, None)
    assert acknowledgement.position() == (2, None)
    assert acknowledgement.exception() is None
