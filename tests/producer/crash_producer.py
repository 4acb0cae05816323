"""A producer process for tests/producer/test_crash.py to SIGKILL mid-transaction.

Usage: ``crash_producer.py BOOTSTRAP PREFIX TOPIC [MODE [KIND]]``. It starts a
producer (KIND ``sync``, the default: a TransactionProducer; ``async``: an
AsyncTransactionProducer on an event loop), then in MODE ``block`` (the
default) sends one message whose local transaction prints ``HALF_WRITTEN
<transaction id>`` and hangs for ever. In MODE ``commit-then-block`` it first
sends a message whose local transaction commits, prints ``COMMITTED <id> <half
partition> <half offset> <end status>``, and then does the same as ``block``.
Every line is flushed at once so the test can act on it.
"""

from __future__ import annotations

import asyncio
import sys
import threading

from outbox import (
    AsyncTransactionProducer,
    LocalTransactionState,
    Message,
    ProducerSettings,
    TransactionProducer,
    TransactionSendResult,
)

GROUP = "crashing"
BLOCK = "block"
COMMIT_THEN_BLOCK = "commit-then-block"
KINDS = ("sync", "async")


def say(line: str) -> None:
    print(line, flush=True)


def commit_or_announce(message: Message, arg: object) -> LocalTransactionState | None:
    """COMMIT when ``arg`` is ``"commit"``; otherwise announce the half (the caller then hangs)."""
    if arg == "commit":
        return LocalTransactionState.COMMIT_MESSAGE
    say(f"HALF_WRITTEN {message.transaction_id}")
    return None


class BlockingListener:
    def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
        answer = commit_or_announce(message, arg)
        if answer is None:
            threading.Event().wait()  # until SIGKILL
        return answer or LocalTransactionState.UNKNOW

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        return LocalTransactionState.UNKNOW


class AwaitingListener:
    async def execute_local_transaction(
        self, message: Message, arg: object
    ) -> LocalTransactionState:
        answer = commit_or_announce(message, arg)
        if answer is None:
            await asyncio.Event().wait()  # until SIGKILL; the loop itself keeps running
        return answer or LocalTransactionState.UNKNOW

    async def check_local_transaction(self, message: Message) -> LocalTransactionState:
        return LocalTransactionState.UNKNOW


def sends(topic: str, mode: str) -> list[tuple[Message, str]]:
    first = (Message(topic=topic, value=b"first", key=b"first-key"), "commit")
    second = (Message(topic=topic, value=b"second", key=b"second-key"), "block")
    return [first, second] if mode == COMMIT_THEN_BLOCK else [second]


def report(result: TransactionSendResult) -> None:
    say(
        f"COMMITTED {result.transaction_id} {result.half_partition} {result.half_offset} "
        f"{result.end_status.value}"
    )


async def run_async(settings: ProducerSettings, topic: str, mode: str) -> None:
    async with AsyncTransactionProducer(GROUP, AwaitingListener(), settings) as producer:
        say("STARTED")
        for message, arg in sends(topic, mode):
            report(await producer.send_message_in_transaction(message, arg))


def main(argv: list[str]) -> int:
    if len(argv) not in (4, 5, 6):
        print(__doc__, file=sys.stderr)
        return 2
    bootstrap, prefix, topic = argv[1:4]
    mode = argv[4] if len(argv) >= 5 else BLOCK
    kind = argv[5] if len(argv) == 6 else "sync"
    if mode not in (BLOCK, COMMIT_THEN_BLOCK) or kind not in KINDS:
        print(f"unknown mode {mode!r} or kind {kind!r}", file=sys.stderr)
        return 2
    settings = ProducerSettings(bootstrap_servers=bootstrap, topic_prefix=prefix)
    if kind == "async":
        asyncio.run(run_async(settings, topic, mode))
    else:
        producer = TransactionProducer(GROUP, BlockingListener(), settings).start()
        say("STARTED")
        for message, arg in sends(topic, mode):
            report(producer.send_message_in_transaction(message, arg))
    say("UNREACHABLE")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
