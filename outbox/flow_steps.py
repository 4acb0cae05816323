"""The steps a send waits on, and the drivers that carry a flow of them out: one per mode.

A send, an end and a check's answer are written once, as generators of :data:`Step`
values (:data:`Flow`; the flows are in :mod:`outbox.send_flow`, :mod:`outbox.end_flow`
and :mod:`outbox.check_answers`): everything that decides (validation, the order of
the writes, the outcome) lives in the flow, and a driver only waits for what each step
names. :func:`run_blocking` carries a flow out in a thread (the threaded producer, its
check answers, the caller-transaction form), :func:`drive` on an event loop (the
asyncio producer): so both producers give the same results and raise the same errors.

Either driver starts a fresh flow, resumes a paused one with a value, and stops at the
step its ``pause_at`` names (returning :class:`Paused`, the flow left open): that is how
``producer.transaction(message)`` hands the local transaction to the caller's block and
resumes the send after it. :func:`run_blocking_together` answers a
batch of checks with their first steps under way together, each then carried on by
:func:`run_blocking`. This module holds no Kafka client.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from inspect import isawaitable
from typing import Any, TypeAlias, TypeVar, overload

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

    @classmethod
    def within(
        cls, record: OutgoingRecord, failure: type[OutboxError], timeout: float, wait: bool = True
    ) -> Write:
        """The write of ``record``, to be acknowledged within ``timeout`` seconds from now."""
        return cls(record, failure, timeout, time.monotonic() + timeout, wait)


@dataclass(slots=True)
class LocalTransaction:
    """Step: the listener's ``execute_local_transaction(message, arg)``, its answer or error."""

    message: Message
    arg: Any


Step: TypeAlias = TopicLookup | FittingHalf | Write | LocalTransaction
_T = TypeVar("_T")
Flow: TypeAlias = Generator[Step, Any, _T]
"""A send (or an end) as the steps it waits on, for a driver to carry out."""


class Paused:
    """What a driver returns for a flow it stopped at ``step`` (where ``pause_at(step)``).

    The flow is left open, to be resumed later (in any thread or context) with what
    ``step`` gives it: ``run_blocking(flow, take, value)`` or ``drive(flow, take, value)``.
    """

    __slots__ = ("step",)

    def __init__(self, step: Step) -> None:
        self.step = step


@overload
def run_blocking(
    flow: Flow[_T], take: Callable[[Step], Any], value: Any = None, *, at: Step | None = None
) -> _T: ...


@overload
def run_blocking(
    flow: Flow[_T],
    take: Callable[[Step], Any],
    value: Any = None,
    *,
    at: Step | None = None,
    pause_at: Callable[[Step], bool],
) -> _T | Paused: ...


def run_blocking(
    flow: Flow[_T],
    take: Callable[[Step], Any],
    value: Any = None,
    *,
    at: Step | None = None,
    pause_at: Callable[[Step], bool] | None = None,
) -> _T | Paused:
    """Carry out ``flow`` in this thread, ``take`` blocking until each step's outcome is there.

    A fresh flow starts (``value`` None); a paused one resumes with ``value``, what
    its step gives it; with ``at``, a flow already stopped at that step carries on by
    taking it. An error ``take`` raises is thrown into the flow at its step. Returns
    the flow's result, or :class:`Paused` at the first step ``pause_at`` names (the
    flow left open); otherwise the flow is closed when the driver leaves it, also on
    a ``BaseException`` (an interrupt) while it waits.

    :func:`drive` without its coroutine and its awaitable test per step, which were a
    tenth of a thread's send; the two must hand outcomes and errors back to the flow alike.
    """
    try:
        step = flow.send(value) if at is None else at
        while pause_at is None or not pause_at(step):
            try:
                outcome = take(step)
            except Exception as exc:
                step = flow.throw(exc)
            else:
                step = flow.send(outcome)
    except StopIteration as finished:
        return finished.value  # type: ignore[no-any-return]
    except BaseException:
        flow.close()
        raise
    return Paused(step)


@overload
async def drive(flow: Flow[_T], take: Callable[[Step], Any], value: Any = None) -> _T: ...


@overload
async def drive(
    flow: Flow[_T],
    take: Callable[[Step], Any],
    value: Any = None,
    *,
    pause_at: Callable[[Step], bool],
) -> _T | Paused: ...


async def drive(
    flow: Flow[_T],
    take: Callable[[Step], Any],
    value: Any = None,
    *,
    pause_at: Callable[[Step], bool] | None = None,
) -> _T | Paused:
    """Carry out ``flow`` on the running event loop: :func:`run_blocking`, awaiting.

    ``take`` returns the outcome, or an awaitable of it (awaited here): an event
    loop's ``take`` returns the futures it waits on, so the loop runs on meanwhile.
    Starts, resumes, pauses and closes the flow as :func:`run_blocking` does.
    """
    try:
        step = flow.send(value)
        while pause_at is None or not pause_at(step):
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
    except BaseException:
        flow.close()
        raise
    return Paused(step)


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
    firsts: list[tuple[Step, Callable[[], Any]] | Exception | None] = []
    for flow in flows:
        try:
            step = next(flow)
            firsts.append((step, start(step)))
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
        step, outcome = first
        try:
            run_blocking(flow, _first_under_way(outcome, take), at=step)
        except Exception as exc:
            failures.append(exc)
        else:
            failures.append(None)
    return failures


def _first_under_way(
    outcome: Callable[[], Any], take: Callable[[Step], Any]
) -> Callable[[Step], Any]:
    """``take``, but the first step's outcome from ``outcome``, which waits for it already."""
    waiting: Callable[[], Any] | None = outcome

    def taking(step: Step) -> Any:
        nonlocal waiting
        if waiting is None:
            return take(step)
        first, waiting = waiting, None
        return first()

    return taking
