"""Many threads, one PostgreSQL, one broker: decisions and committed rows match one to one.

The producer's promise is the decision op: exactly one COMMIT op per committed
row and one ROLLBACK op per declined one (the checker's relay turns COMMIT ops
into events; the producer itself writes none).
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from outbox import EndStatus, LocalTransactionState, Message
from outbox.protocol import OpRecord, Resolution
from tests.sql.conftest import Database, OutboxTopics

pytestmark = pytest.mark.kafka

THREADS = 8
PER_THREAD = 200


class Declined(Exception):
    """A business rule said no."""


@pytest.mark.postgres
def test_eight_threads_every_committed_row_has_exactly_one_commit_op(
    pg_database: Database, outbox_topics: OutboxTopics
):
    database = pg_database
    listener = database.listener()
    listener.verify()

    def run_thread(thread: int) -> list[tuple[str, str, LocalTransactionState, EndStatus]]:
        outcomes = []
        for n in range(PER_THREAD):
            order_id = f"o-{thread}-{n}"
            fail = Declined(order_id) if (thread * PER_THREAD + n) % 7 == 3 else None
            result = producer.send_message_in_transaction(
                Message(outbox_topics.real_topic, order_id, key=order_id),
                {"id": order_id, "fail": fail},
            )
            assert isinstance(result.local_transaction_error, Declined) == (fail is not None)
            outcomes.append(
                (order_id, result.transaction_id, result.local_transaction_state, result.end_status)
            )
        return outcomes

    with (
        # No checker runs here: on a loaded machine a send slower than the default
        # direct-end window would be REFUSED_LATE and never finished. Widen it.
        database.producer(
            listener, outbox_topics.settings(transaction_timeout_seconds=50)
        ) as producer,
        ThreadPoolExecutor(THREADS) as pool,
    ):
        outcomes = [o for thread in pool.map(run_thread, range(THREADS)) for o in thread]

    assert len(outcomes) == THREADS * PER_THREAD
    committed = {
        tid for _, tid, state, _ in outcomes if state is LocalTransactionState.COMMIT_MESSAGE
    }
    declined = {
        tid for _, tid, state, _ in outcomes if state is LocalTransactionState.ROLLBACK_MESSAGE
    }
    assert len(committed) + len(declined) == THREADS * PER_THREAD  # nothing left UNKNOW
    assert len(declined) == sum(1 for i in range(THREADS * PER_THREAD) if i % 7 == 3)
    assert {end for *_, end in outcomes} <= {EndStatus.COMMITTED, EndStatus.ROLLED_BACK}

    orders = database.order_rows()
    assert set(orders.values()) == committed
    assert set(database.log_rows()) == committed
    ops = [OpRecord.from_record(r) for r in outbox_topics.read(outbox_topics.names.op)]
    decisions = Counter(op.transaction_id for op in ops)
    duplicated = {tid: n for tid, n in decisions.items() if n != 1}
    assert duplicated == {}
    commits = {op.transaction_id for op in ops if op.resolution is Resolution.COMMIT}
    assert commits == committed  # every committed row has its commit, no commit without one
    assert set(decisions) - commits == declined
    assert outbox_topics.read(outbox_topics.real_topic, "read_uncommitted") == []
