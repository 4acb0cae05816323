import sys

import pytest

from outbox import LocalTransactionState, Message
from outbox.testing import InMemoryBroker, InMemoryTransactionProducer

COMMIT = LocalTransactionState.COMMIT_MESSAGE


class Listener:  # or your service's own, e.g. a SqlTransactionListener on SQLite
    def execute_local_transaction(self, message: Message, arg: object) -> object:
        return arg

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        return COMMIT


def test_a_commit_is_published() -> None:
    broker = InMemoryBroker({"orders": 3})  # leave topics out: any topic, one partition
    producer = InMemoryTransactionProducer("order-service", Listener(), broker=broker).start()
    producer.send_message_in_transaction(Message("orders", b"placed", key="o-1"), COMMIT)
    (event,) = broker.published("orders")
    assert (event.key, event.value) == (b"o-1", b"placed")


def test_an_unknown_outcome_is_resolved_by_the_check_back() -> None:
    producer = InMemoryTransactionProducer("order-service", Listener()).start()
    result = producer.send_message_in_transaction(Message("orders", b"v"), None)  # UNKNOW
    assert producer.check_back() == {result.transaction_id: COMMIT}
    assert len(producer.broker.published("orders")) == 1


if __name__ == "__main__":  # `pytest this_file.py` runs them too
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
