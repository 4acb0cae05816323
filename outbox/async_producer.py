"""``AsyncTransactionProducer``: the transactional send for asyncio services (FastAPI, ...).

The threaded producer blocks its caller while it waits for the half's and the
op's acknowledgements, which would freeze an event loop. This one carries out
the very same send (:meth:`outbox.send_flow.SendCore.send`: validation, the
writes, the outcome, the result) on the loop instead (:func:`outbox.flow_steps.drive`):
it awaits the futures that the Kafka client's delivery thread completes
(:func:`acknowledged_on_loop`, settled in batches by :class:`Arrivals`), and awaits
the listener's coroutines. So there is one Kafka client, the same settings, the same
results and the same errors; only the waiting differs.

Check-backs arrive on the check responder's threads. Each hands the question
to the loop the producer was started on (``run_coroutine_threadsafe``), waits
for the listener's answer there, and writes the answer's op from its own
thread: the listener only ever runs on the application's loop, and no op
write is awaited on it.

A cancelled send (its client went away) stops where it is, as a crash would:
a half already written and not ended is resolved by the check-back, an op
already handed over is still delivered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from contextlib import suppress
from functools import partial
from types import TracebackType
from typing import Any, Protocol, Self

from outbox.acked_writer import Acknowledgement, RecordWriter, not_acknowledged
from outbox.caller_transaction import AsyncCallerTransaction
from outbox.errors import OutboxError, ProducerNotStartedError, QueueFullError
from outbox.flow_steps import FittingHalf, LocalTransaction, Step, TopicLookup, Write, drive
from outbox.message import LocalTransactionState, Message, TransactionSendResult
from outbox.producer import chosen_settings, require_listener, send_core
from outbox.protocol import validate_producer_group
from outbox.seams import PartsSource
from outbox.serialization import SerializerLike
from outbox.settings import ProducerSettings

log = logging.getLogger(__name__)


class AsyncTransactionListener(Protocol):
    """The application's side of a transaction, as coroutines run on its event loop."""

    async def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        """Run the local transaction of ``message``; say whether it committed.

        As :meth:`outbox.producer.TransactionListener.execute_local_transaction`:
        an exception counts as UNKNOW, and
        :func:`~outbox.producer.record_local_transaction_error` keeps an error
        on the result of a send answered ROLLBACK_MESSAGE.
        """
        ...

    async def check_local_transaction(self, message: Message) -> LocalTransactionState:
        """Say whether the local transaction of ``message`` committed (check-back)."""
        ...


class AsyncTransactionProducer:
    """Sends messages whose publication is tied to a local transaction, from an event loop.

    ``await send_message_in_transaction(message, arg)`` never blocks the loop;
    any number of tasks may send at once. Start it (``async with``, or
    :meth:`start`) on the loop that will send: check-backs are answered there.
    ``parts`` as :class:`~outbox.producer.TransactionProducer`'s.
    """

    def __init__(
        self,
        group: str,
        listener: AsyncTransactionListener,
        settings: ProducerSettings | None = None,
        check_executor: Executor | None = None,
        *,
        config: ProducerSettings | None = None,
        clock: Callable[[], float] = time.time,
        key_serializer: SerializerLike | None = None,
        value_serializer: SerializerLike | None = None,
        parts: PartsSource | None = None,
    ) -> None:
        settings = chosen_settings(settings, config)
        validate_producer_group(group)
        require_listener(listener, awaited=True)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._core = send_core(
            group,
            listener,
            settings,
            check_executor,
            clock=clock,
            key_serializer=key_serializer,
            value_serializer=value_serializer,
            parts=parts,
            ask=self._ask_on_loop,
        )
        self.group = group
        self.listener = listener
        self.settings = settings
        self.topics = self._core.topics
        self._arrivals: Arrivals | None = None

    @property
    def config(self) -> ProducerSettings:
        """:attr:`settings` under its former name."""
        return self.settings

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> Self:
        """Connect, check the outbox topics, and start answering check requests on this loop.

        The connecting waits for the cluster, so it runs on a worker thread.
        """
        loop = asyncio.get_running_loop()
        self._loop = loop
        await loop.run_in_executor(None, self._core.start)
        return self

    async def shutdown(self, timeout: float = 30.0) -> None:
        """Refuse new sends, finish those under way, deliver queued oneway ops, close.

        Idempotent. Runs on a worker thread, so that the loop stays free to
        finish the sends under way and to answer the checks in hand.
        """
        await asyncio.get_running_loop().run_in_executor(None, self._core.shutdown, timeout)

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.shutdown()

    # ------------------------------------------------------------------ sending

    async def send_message_in_transaction(
        self, message: Message, arg: Any = None
    ) -> TransactionSendResult:
        """As :meth:`TransactionProducer.send_message_in_transaction`, awaiting instead of blocking.

        Same result, same errors: the half written and acknowledged, the
        listener's local transaction awaited, its decision written as an op.
        """
        core = self._core
        core.admit()
        try:
            return await drive(core.send(message, arg), self._take)
        finally:
            core.release()

    def transaction(self, message: Message) -> AsyncCallerTransaction:
        """As :meth:`TransactionProducer.transaction`: ``async with``, ``await txn.join(session)``.

        The session is an ``AsyncSession``; the listener an ``AsyncSqlTransactionListener``.
        """
        return AsyncCallerTransaction(self._core, self._take, message)

    def _take(self, step: Step) -> Any:
        """What ``step`` gives the flow: at once, or an awaitable the loop waits on."""
        parts = self._core.parts
        assert parts is not None
        if isinstance(step, Write):
            try:
                acknowledgement = parts.writer.submit_nowait(step.record, step.failure)
            except QueueFullError:
                # Rare (the client's queue holds 100,000 records): wait for room off the loop.
                return _submitted_in_thread(parts.writer, step, self._arrivals_here())
            if not step.wait:
                return acknowledgement
            return acknowledged_on_loop(step, acknowledgement, self._arrivals_here())
        if isinstance(step, TopicLookup):
            known = parts.catalog.known(step.topic)
            return known if known is not None else _in_thread(parts.catalog.get, step.topic)
        if isinstance(step, FittingHalf):
            limits = parts.limits
            fitting = partial(
                limits.fitting_half_record, step.half, self.topics, step.half_partition
            )
            return fitting() if limits.knows_half(step.half) else _in_thread(fitting)
        assert isinstance(step, LocalTransaction)
        return self.listener.execute_local_transaction(step.message, step.arg)

    def _arrivals_here(self) -> Arrivals:
        """The arrivals of the running loop (made by its own thread, so one per loop)."""
        loop = asyncio.get_running_loop()
        arrivals = self._arrivals
        if arrivals is None or arrivals.loop is not loop:
            arrivals = self._arrivals = Arrivals(loop)
        return arrivals

    def _ask_on_loop(self, message: Message) -> object:
        """The listener's answer to a check, asked on the application's loop from a check
        executor thread."""
        if self._loop is None:
            raise ProducerNotStartedError("a check arrived before the producer had a loop")
        answer = asyncio.run_coroutine_threadsafe(
            self._core.listener.check_local_transaction(message), self._loop
        )
        # Past the request's time to live the checker has asked again, so a
        # later answer is worth nothing; the thread is freed for the next one.
        ttl = self.settings.check_request_ttl_seconds
        try:
            return answer.result(ttl)
        except TimeoutError:
            answer.cancel()
            log.warning(
                "check_local_transaction took over %gs on the event loop; answering UNKNOW "
                "transaction_id=%s",
                ttl,
                message.transaction_id,
            )
            return LocalTransactionState.UNKNOW


def _in_thread(function: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
    return asyncio.get_running_loop().run_in_executor(None, partial(function, *args))


async def _submitted_in_thread(writer: RecordWriter, step: Write, arrivals: Arrivals) -> object:
    """A write whose queue was full: handed over from a worker thread, then as any other."""
    acknowledgement = await _in_thread(writer.submit, step.record, step.deadline, step.failure)
    if not step.wait:
        return acknowledgement
    return await acknowledged_on_loop(step, acknowledgement, arrivals)


def acknowledged_on_loop(
    step: Write, acknowledgement: Acknowledgement, arrivals: Arrivals
) -> asyncio.Future[tuple[int, int | None]]:
    """The write's (partition, offset) as a future of this loop, failed at the write's deadline.

    The report thread only hands the settling to the loop (:class:`Arrivals`):
    no ``concurrent.futures.Future`` to wrap, no ``asyncio.timeout`` block per write.
    """
    loop = arrivals.loop
    waiter: asyncio.Future[tuple[int, int | None]] = loop.create_future()

    def settle() -> None:
        expiry.cancel()
        if waiter.done():  # the deadline passed first, or the send was cancelled
            return
        try:
            waiter.set_result(acknowledgement.position())
        except OutboxError as exc:
            waiter.set_exception(exc)

    def expire() -> None:
        if not waiter.done():
            waiter.set_exception(not_acknowledged(step.record, step.timeout, step.failure))

    expiry = loop.call_later(max(0.0, step.deadline - time.monotonic()), expire)
    acknowledgement.add_done_callback(lambda _: arrivals.put(settle))  # on the report thread
    return waiter


class Arrivals:
    """The settlings a loop has to run for reports that arrived, run in batches.

    The report thread serves many reports per poll; scheduling each on the loop
    (``call_soon_threadsafe``) would write the loop's wake-up pipe and wake it
    once per write. Here a report only queues its settling, and the first one
    queued while no batch is due schedules one: the loop wakes once and settles
    every report that arrived meanwhile, in the order they arrived.
    """

    __slots__ = ("_due", "_pending", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._pending: deque[Callable[[], None]] = deque()
        self._due = False

    def put(self, settle: Callable[[], None]) -> None:
        """Queue ``settle`` to run on the loop; from any thread."""
        self._pending.append(settle)
        # Appended before the flag is read: a batch due already runs after this
        # point (it clears the flag before it takes), so it takes ``settle`` too.
        if not self._due:
            self._due = True
            with suppress(RuntimeError):  # a loop closed meanwhile has nobody waiting
                self.loop.call_soon_threadsafe(self._run)

    def _run(self) -> None:
        self._due = False
        pending = self._pending
        while pending:
            settle = pending.popleft()
            try:
                settle()
            except Exception as exc:  # as the loop would report a failed callback
                self.loop.call_exception_handler(
                    {"message": "settling a write's acknowledgement failed", "exception": exc}
                )
