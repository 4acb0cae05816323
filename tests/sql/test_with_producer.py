"""The SQL listener under a real TransactionProducer, on a real broker."""

from __future__ import annotations

import time

import pytest

from outbox import EndStatus, LocalTransactionState, Message, TransactionProducer
from outbox.protocol import RealRecord, Resolution
from tests.producer.test_check_back import ops_of, put_back_and_ask, wait_for
from tests.sql.conftest import GROUP, Database, OutboxTopics

pytestmark = pytest.mark.kafka


def events(topics: OutboxTopics, isolation: str = "read_committed") -> list[RealRecord]:
    return [RealRecord.from_record(r) for r in topics.read(topics.real_topic, isolation)]


def test_commit_publishes_the_event_with_both_rows(database: Database, outbox_topics, relay):
    with database.producer(database.listener(), outbox_topics.settings()) as producer:
        result = producer.send_message_in_transaction(
            Message(outbox_topics.real_topic, b'{"id": "o-1"}', key="o-1"), {"id": "o-1"}
        )
    assert result.local_transaction_state is LocalTransactionState.COMMIT_MESSAGE
    assert (result.end_status, result.local_transaction_error) == (EndStatus.COMMITTED, None)
    assert database.order_rows() == {"o-1": result.transaction_id}
    assert set(database.log_rows()) == {result.transaction_id}
    wait_for(lambda: len(events(outbox_topics)) == 1)  # published by the checker's relay
    (event,) = events(outbox_topics)
    assert (event.transaction_id, event.key) == (result.transaction_id, b"o-1")


def test_exception_rolls_back_keeps_the_error_and_publishes_nothing(
    database: Database, outbox_topics
):
    failure = ValueError("card declined")
    with database.producer(database.listener(), outbox_topics.settings()) as producer:
        result = producer.send_message_in_transaction(
            Message(outbox_topics.real_topic, b"v", key="o-1"), {"id": "o-1", "fail": failure}
        )
    assert result.local_transaction_state is LocalTransactionState.ROLLBACK_MESSAGE
    assert result.end_status is EndStatus.ROLLED_BACK
    assert result.local_transaction_error is failure
    assert database.order_rows() == {}
    assert database.log_rows() == {}
    assert events(outbox_topics, "read_uncommitted") == []
    ((op),) = ops_of(outbox_topics)
    assert (op.transaction_id, op.resolution) == (result.transaction_id, Resolution.ROLLBACK)


@pytest.mark.postgres
@pytest.mark.parametrize("listener_kind", ["sync"])  # the async check is the same rule (test_check)
@pytest.mark.parametrize("committed", [True, False], ids=["committed", "never-committed"])
def test_check_back_is_answered_from_the_database(
    pg_database: Database, outbox_topics, relay, committed: bool
):
    """The end never arrived (as if the process died): the check-back reads the log table."""
    database = pg_database
    clock = [time.time()]
    sql = database.listener(grace_seconds=30, clock=lambda: clock[0])

    class EndLost:
        """Commits (or not) in the database, then answers UNKNOW: nothing is ended."""

        def execute_local_transaction(self, message, arg):
            if committed:
                assert sql.execute_local_transaction(message, arg) is (
                    LocalTransactionState.COMMIT_MESSAGE
                )
            return LocalTransactionState.UNKNOW

        def check_local_transaction(self, message):
            return sql.check_local_transaction(message)

    with TransactionProducer(GROUP, EndLost(), outbox_topics.settings()) as producer:
        sent = producer.send_message_in_transaction(
            Message(outbox_topics.real_topic, b"v", key="o-1"), {"id": "o-1"}
        )
        assert sent.end_status is EndStatus.LEFT_UNKNOWN
        clock[0] += 31  # past the grace period: a missing row now means ROLLBACK
        put_back_and_ask(outbox_topics)
        wait_for(lambda: len(ops_of(outbox_topics)) == 1)
    (op,) = ops_of(outbox_topics)
    assert op.transaction_id == sent.transaction_id
    if committed:
        assert op.resolution is Resolution.COMMIT
        wait_for(lambda: len(events(outbox_topics)) == 1)
        assert [e.transaction_id for e in events(outbox_topics)] == [sent.transaction_id]
        assert database.order_rows() == {"o-1": sent.transaction_id}
    else:
        assert op.resolution is Resolution.ROLLBACK
        assert events(outbox_topics, "read_uncommitted") == []
        assert database.order_rows() == {}


class EndLost:
    """A producer that dies after its half: its local transaction never runs, nothing is ended."""

    def execute_local_transaction(self, message, arg):
        return LocalTransactionState.UNKNOW

    def check_local_transaction(self, message):  # pragma: no cover - the process is gone
        raise AssertionError("a dead producer answers nothing")


def test_a_reused_key_publishes_only_the_attempt_that_committed(
    database: Database, outbox_topics, relay
):
    """Attempt 1 of an idempotency key leaves its half undecided (its process died); attempt 2
    with the same key commits. The check for attempt 1 finds the key's row, but that row
    belongs to attempt 2's half: the answer is ROLLBACK, and only attempt 2 is published."""
    key = "order-7"
    with TransactionProducer(GROUP, EndLost(), outbox_topics.settings()) as dead:
        first = dead.send_message_in_transaction(
            Message(outbox_topics.real_topic, b"attempt-1", key="o-1", transaction_id=key), None
        )
    assert first.end_status is EndStatus.LEFT_UNKNOWN
    with database.producer(database.listener(), outbox_topics.settings()) as producer:
        second = producer.send_message_in_transaction(
            Message(outbox_topics.real_topic, b"attempt-2", key="o-1", transaction_id=key),
            {"id": "o-1"},
        )
        assert second.end_status is EndStatus.COMMITTED
        assert second.half_partition == first.half_partition  # both ops on one op partition
        put_back_and_ask(outbox_topics, which=0)  # the checker asks about attempt 1
        wait_for(lambda: len(ops_of(outbox_topics)) == 2)
        answer = ops_of(outbox_topics)[1]
        assert (answer.identity, answer.transaction_id) == (first.half_offset, key)
        assert answer.resolution is Resolution.ROLLBACK
        # A later commit on the same op partition: once it is out, attempt 1 had its turn.
        marker = producer.send_message_in_transaction(
            Message(outbox_topics.real_topic, b"marker", key="o-1"), {"id": "o-2"}
        )
    wait_for(lambda: marker.transaction_id in {e.transaction_id for e in events(outbox_topics)})
    assert [e.value for e in events(outbox_topics)] == [b"attempt-2", b"marker"]
    assert database.order_rows() == {"o-1": key, "o-2": marker.transaction_id}
