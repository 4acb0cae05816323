"""The send flow's engine: the steps a send waits on, and the two drivers that carry them out.

A send (or an end) is written once, as a generator of :data:`Step` values
(:data:`Flow`): everything that decides (validation, the order of the writes,
the outcome) lives in the flow, and a driver only waits for what each step
names. :func:`run_blocking` carries a flow out in a thread
(:class:`~outbox.producer.TransactionProducer`), :func:`drive` on an event loop
(:class:`~outbox.async_producer.AsyncTransactionProducer`): so both producers
give the same results and raise the same errors. The flows themselves are the
producer's (``TransactionProducer._send_flow``); this module holds no Kafka client.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from functools import partial
from inspect import isawaitable
from typing import Any, TypeAlias, TypeVar

from outbox.errors import OutboxError
from outbox.message import Message
from outbox.protocol import HalfRecord, OutgoingRecord


@dataclass(slots=True)
class TopicLookup:
    """Step: the facts of ``topic`` (cached after the first send to it)."""

    topic: str


@dataclass(slots=True)
class FittingHalf:
    """Step: the half's record, refused if any record it becomes would not fit its topic.

    Needs the limits of the topics the half's records go to (cached after the first).
    """

    half: HalfRecord
    half_partition: int


@dataclass(slots=True)
class Write:
    """Step: hand ``record`` to the client and wait for its acknowledgement until ``deadline``.

    The flow gets the record's (partition, offset); with ``wait=False`` (a
    oneway op) its :class:`~outbox.acked_writer.Acknowledgement` at once instead.
    """

    record: OutgoingRecord
    failure: type[OutboxError]
    timeout: float
    deadline: float
    """``time.monotonic()`` by which the record must be acknowledged."""
    wait: bool = True


@dataclass(slots=True)
class LocalTransaction:
    """Step: the listener's ``execute_local_transaction(message, arg)``, its answer or error."""

    message: Message
    arg: Any


Step: TypeAlias = TopicLookup | FittingHalf | Write | LocalTransaction
_T = TypeVar("_T")
Flow: TypeAlias = Generator[Step, Any, _T]
"""A send (or an end) as the steps it waits on, for a driver to carry out."""


async def drive(flow: Flow[_T], take: Callable[[Step], Any]) -> _T:
    """Carry out ``flow``: hand each step's outcome back to it, or the error taking it raised.

    ``take`` returns the outcome, or an awaitable of it (awaited here): an
    event loop's ``take`` returns the futures it waits on, so the loop runs on
    meanwhile. A thread carries out a flow with :func:`run_blocking` instead.
    """
    try:
        step = next(flow)
        while True:
            try:
                outcome = take(step)
                if isawaitable(outcome):
                    outcome = await outcome
            except Exception as exc:
                step = flow.throw(exc)
            else:
                step = flow.send(outcome)
    except StopIteration as finished:
        return finished.value  # type: ignore[no-any-return]
    finally:
        flow.close()


def run_blocking(flow: Flow[_T], take: Callable[[Step], Any]) -> _T:
    """Carry out ``flow`` in this thread, ``take`` blocking until each step's outcome is there.

    :func:`drive` without its coroutine and its awaitable test per step, which
    were a tenth of a thread's send; the two must hand outcomes and errors back
    to the flow alike.
    """
    try:
        step = next(flow)
        while True:
            try:
                outcome = take(step)
            except Exception as exc:
                step = flow.throw(exc)
            else:
                step = flow.send(outcome)
    except StopIteration as finished:
        return finished.value  # type: ignore[no-any-return]
    finally:
        flow.close()


def run_blocking_together(
    flows: list[Flow[Any]],
    start: Callable[[Step], Callable[[], Any]],
    take: Callable[[Step], Any],
) -> list[Exception | None]:
    """Carry out ``flows`` in this thread, as :func:`run_blocking` would one by one, but with
    their first steps under way together.

    Each flow runs to its first step, which ``start`` sets going (a write is
    handed to the client) and returns what waits for its outcome; then each
    flow in turn gets that outcome and runs to its end with ``take``. So the
    checks of a batch share the client's batches and one wait for their ops'
    acknowledgements. A flow's failure ends it alone: returned, one per flow
    (``None`` for a flow that finished).
    """
    firsts: list[Callable[[], Any] | Exception | None] = []
    for flow in flows:
        try:
            firsts.append(start(next(flow)))
        except StopIteration:
            flow.close()
            firsts.append(None)
        except Exception as exc:
            flow.close()
            firsts.append(exc)
    failures: list[Exception | None] = []
    for flow, first in zip(flows, firsts, strict=True):
        if first is None or isinstance(first, Exception):
            failures.append(first)
            continue
        try:
            _carry_on(flow, first, take)
        except Exception as exc:
            failures.append(exc)
        else:
            failures.append(None)
    return failures


def _carry_on(flow: Flow[_T], outcome: Callable[[], Any], take: Callable[[Step], Any]) -> _T:
    """:func:`run_blocking` from a step already under way (``outcome`` waits for it)."""
    try:
        while True:
            try:
                result = outcome()
            except Exception as exc:
                step = flow.throw(exc)
            else:
                step = flow.send(result)
            outcome = partial(take, step)
    except StopIteration as finished:
        return finished.value  # type: ignore[no-any-return]
    finally:
        flow.close()
