import sys
from collections.abc import Callable

import pytest

from outbox import LocalTransactionState, Message


class Listener:  # your service's listener
    def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE


def test_service(outbox_in_memory_producer: Callable) -> None:
    producer = outbox_in_memory_producer(Listener(), group="order-service")  # started
    producer.send_message_in_transaction(Message("orders", b"placed", key="o-1"))
    assert len(producer.broker.published("orders")) == 1  # shut down after the test


if __name__ == "__main__":  # `pytest this_file.py` runs it too
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
