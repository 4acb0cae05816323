"""The send path's shortcuts (issue 24): what they skip, and the checks they keep.

No broker: the real send flow runs on the in-memory producer's parts, and the async
producer's acknowledgement futures are settled from a thread of their own, as
the client's report thread settles them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from typing import Any

import pytest

from outbox import LocalTransactionState, Message, ProducerSettings, TransactionSendResult
from outbox.acked_writer import Acknowledgement
from outbox.async_producer import Arrivals, acknowledged_on_loop
from outbox.errors import HalfWriteError, InvalidMessageError
from outbox.flow_steps import LocalTransaction, Step, Write, run_blocking
from outbox.protocol import OpRecord, OutgoingRecord, Resolution, TopicNames
from outbox.send_flow import SendCore
from outbox.serialization import Serialization
from outbox.testing import InMemoryBroker, InMemoryParts
from outbox.validation import build_half

REAL_TOPIC = "orders-events"


class _Commits:
    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE


def _second_send(broker: InMemoryBroker) -> tuple[list[Any], TransactionSendResult]:
    """A send to a topic the producer already knows, driven a step at a time: the steps it
    yielded, and its result."""
    settings = ProducerSettings(bootstrap_servers="in-memory:0")
    core = SendCore(
        "orders",
        _Commits(),
        settings,
        clock=time.time,
        serialization=Serialization(),
        parts_source=InMemoryParts(broker),
    )
    core.start()
    try:
        core.admit()
        try:
            run_blocking(core.send(Message(REAL_TOPIC, b"first"), None), core.take)  # learns it
            steps: list[Any] = []

            def take(step: Step) -> Any:
                steps.append(step)
                return core.take(step)

            result = run_blocking(core.send(Message(REAL_TOPIC, b"second", key=b"k"), None), take)
        finally:
            core.release()
    finally:
        core.shutdown(1.0)
    return steps, result


def test_a_send_to_a_known_topic_waits_on_its_two_writes_and_its_local_transaction():
    broker = InMemoryBroker({REAL_TOPIC: 2})
    steps, result = _second_send(broker)
    assert [type(step) for step in steps] == [Write, LocalTransaction, Write]
    assert result.local_transaction_state is LocalTransactionState.COMMIT_MESSAGE
    assert broker.published(REAL_TOPIC)[-1].value == b"second"


def _half_of(topic: object, prefix: str) -> Any:
    return build_half(
        Message(topic, b"v"),  # type: ignore[arg-type]
        group="orders",
        topics=TopicNames(prefix),
        transaction_id="t-1",
        born_ms=0,
    )


def test_a_topic_checked_once_is_still_refused_where_it_is_an_outbox_topic():
    assert _half_of("b.half", "a").real_topic == "b.half"  # a real topic for prefix "a"
    with pytest.raises(InvalidMessageError, match="internal outbox topic"):
        _half_of("b.half", "b")
    for _ in range(2):  # a refusal is never remembered as a pass
        with pytest.raises(InvalidMessageError, match="characters Kafka does not allow"):
            _half_of("no spaces", "a")
        with pytest.raises(InvalidMessageError, match="topic is missing"):
            _half_of(["not", "hashable"], "a")


def test_a_callers_transaction_id_is_still_validated():
    with pytest.raises(InvalidMessageError, match="may only hold"):
        build_half(
            Message(REAL_TOPIC, b"v"),
            group="orders",
            topics=TopicNames("outbox"),
            transaction_id="no spaces",
            born_ms=0,
        )


def test_reports_arriving_together_wake_the_loop_once_and_settle_every_write():
    count = 500

    async def main() -> tuple[list[tuple[int, int]], int]:
        loop = asyncio.get_running_loop()
        wakeups = 0
        schedule = loop.call_soon_threadsafe

        def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal wakeups
            wakeups += 1
            return schedule(*args, **kwargs)

        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
        arrivals = Arrivals(loop)
        record = OutgoingRecord("t", None, b"v")
        acknowledgements = [Acknowledgement("t", HalfWriteError, {}) for _ in range(count)]
        waiters = [
            acknowledged_on_loop(
                Write(record, HalfWriteError, 30.0, time.monotonic() + 30), ack, arrivals
            )
            for ack in acknowledgements
        ]

        class _Delivered:
            def __init__(self, offset: int) -> None:
                self._offset = offset

            def partition(self) -> int:
                return 0

            def offset(self) -> int:
                return self._offset

        def report_thread() -> None:  # one poll serving every report
            for offset, acknowledgement in enumerate(acknowledgements):
                acknowledgement(None, _Delivered(offset))  # type: ignore[arg-type]

        thread = threading.Thread(target=report_thread)
        thread.start()
        positions = await asyncio.wait_for(asyncio.gather(*waiters), 10)
        thread.join()
        return positions, wakeups

    positions, wakeups = asyncio.run(main())
    assert positions == [(0, offset) for offset in range(count)]
    assert 1 <= wakeups < count / 10


def _whole(record: object) -> None:
    """``record`` holds every field of its dataclass and nothing else, as its ``__init__``
    would have made it: ``frozen_instance`` skips that ``__init__``, so a field added to the
    class (with a default) and not to a call site would be missing until first read."""
    names = {f.name for f in dataclasses.fields(record)}  # type: ignore[arg-type]
    assert set(vars(record)) == names, type(record).__name__
    remade = type(record)(**{name: getattr(record, name) for name in names})
    assert remade == record


def test_records_built_without_their_init_are_whole():
    steps, result = _second_send(InMemoryBroker({REAL_TOPIC: 2}))
    built: list[object] = [step.record for step in steps if isinstance(step, Write)]
    built.append(result)
    half = _half_of(REAL_TOPIC, "outbox")
    op = OpRecord("t-1", "orders", 0, 5, Resolution.COMMIT, 1, origin_offset=5)
    built += [half, half.to_record(TopicNames("outbox"), 0), op.to_record(TopicNames("outbox"))]
    assert [type(r) for r in built][:3] == [OutgoingRecord, OutgoingRecord, TransactionSendResult]
    for record in built:
        _whole(record)
