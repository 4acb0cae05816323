"""A producer process for tests/producer/test_crash.py to SIGKILL mid-transaction.

Usage: ``crash_producer.py BOOTSTRAP PREFIX TOPIC [MODE]``. It starts a
TransactionProducer, then in MODE ``block`` (the default) sends one message
whose local transaction prints ``HALF_WRITTEN <transaction id>`` and blocks for
ever. In MODE ``commit-then-block`` it first sends a message whose local
transaction commits, prints ``COMMITTED <id> <half partition> <half offset>
<end status>``, and then does the same as ``block``. Every line is flushed at
once so the test can act on it.
"""

from __future__ import annotations

import sys
import threading

from outbox import LocalTransactionState, Message, ProducerSettings, TransactionProducer

GROUP = "crashing"
BLOCK = "block"
COMMIT_THEN_BLOCK = "commit-then-block"


def say(line: str) -> None:
    print(line, flush=True)


class BlockingListener:
    """Commits when ``arg`` is ``"commit"``; otherwise announces the half and hangs."""

    def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
        if arg == "commit":
            return LocalTransactionState.COMMIT_MESSAGE
        say(f"HALF_WRITTEN {message.transaction_id}")
        threading.Event().wait()  # until SIGKILL
        raise AssertionError("unreachable")

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        return LocalTransactionState.UNKNOW


def main(argv: list[str]) -> int:
    if len(argv) not in (4, 5):
        print(__doc__, file=sys.stderr)
        return 2
    bootstrap, prefix, topic = argv[1:4]
    mode = argv[4] if len(argv) == 5 else BLOCK
    if mode not in (BLOCK, COMMIT_THEN_BLOCK):
        print(f"unknown mode {mode!r}", file=sys.stderr)
        return 2
    settings = ProducerSettings(bootstrap_servers=bootstrap, topic_prefix=prefix)
    producer = TransactionProducer(GROUP, BlockingListener(), settings).start()
    say("STARTED")
    if mode == COMMIT_THEN_BLOCK:
        first = producer.send_message_in_transaction(
            Message(topic=topic, value=b"first", key=b"first-key"), "commit"
        )
        say(
            f"COMMITTED {first.transaction_id} {first.half_partition} {first.half_offset} "
            f"{first.end_status.value}"
        )
    producer.send_message_in_transaction(
        Message(topic=topic, value=b"second", key=b"second-key"), "block"
    )
    say("UNREACHABLE")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
