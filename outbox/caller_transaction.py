"""``producer.transaction(message)``: the caller's own database transaction as the local one.

The listener form runs the local transaction for the caller; web services
already hold a session per request, opened and committed by their own code.
Here the send is split around it::

    with producer.transaction(Message("orders", payload, key=order_id)) as txn:
        # the half is written and acknowledged: the message may be published
        with Session(engine) as session, session.begin():
            session.add(order)
            txn.join(session)  # the transaction-log row goes into this session
    # the decision follows what the database did with the row

It is the very send flow of ``send_message_in_transaction`` (validation, the
half, the late-end rule, the op, the result), stopped where it would call the
listener's ``execute_local_transaction`` (its driver pauses there:
:mod:`outbox.flow_steps`) and resumed when the block ends, with
the state the database holds (:mod:`outbox.sql.joined`): COMMIT when the row is
committed, ROLLBACK when the transaction that held it ended without it, nothing
(UNKNOW) while that cannot be told, and ROLLBACK when the block never joined a
session (no row can exist). Whether the block raised does not matter: an error
after the commit still publishes. Check-backs are answered by the producer's
listener, a :class:`~outbox.sql.SqlTransactionListener` on the same log table,
as for any other send.

The block's two ends may run in different threads and ``contextvars`` contexts
(a FastAPI ``yield`` dependency runs its setup and teardown in separate thread
pool calls): nothing here carries a context token from one end to the other.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol, Self

from outbox.errors import CallerTransactionError
from outbox.flow_steps import Flow, Paused, Step, drive, run_blocking
from outbox.message import LocalTransactionState, Message, TransactionSendResult
from outbox.seams import SendingCore


class JoinedSession(Protocol):
    """What a joined session tells the block's end (:class:`outbox.sql.joined.JoinedSession`;
    named by this protocol, as the producer's core is by :class:`~outbox.seams.SendingCore`,
    so that the SQL side and the producers, which import this module, are not imported back)."""

    def detach(self) -> None: ...

    def outcome(self) -> LocalTransactionState: ...

    async def outcome_async(self) -> LocalTransactionState: ...


log = logging.getLogger(__name__)

ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE


__all__ = ["AsyncCallerTransaction", "CallerTransaction", "CallerTransactionError"]


class _Paused:
    """The ``arg`` of a send whose local transaction is the caller's block.

    The send flow hands it back in its local-transaction step, which is where
    the driver stops (its ``pause_at``) instead of calling the listener.
    """

    def __call__(self, step: Step) -> bool:
        """Whether the flow stops at ``step`` for the block: the step that hands it back."""
        return getattr(step, "arg", None) is self


class _CallerTransaction:
    """What the sync and asyncio forms share: the state, the join, the decision."""

    def __init__(self, core: SendingCore, take: Callable[[Step], Any], message: Message) -> None:
        self._core = core
        self._request = message
        self._paused = _Paused()
        self._take = take
        self._flow: Flow[TransactionSendResult] | None = None
        self._step: Any = None
        self._joined: JoinedSession | None = None
        self._join_failed = False
        self._ended = False
        self.result: TransactionSendResult | None = None
        """The send's result once the block ended (as ``send_message_in_transaction``'s)."""

    @property
    def message(self) -> Message:
        """The message as the listener would see it: transaction id, born time, half identity."""
        if self._step is None:
            raise CallerTransactionError("the transaction has no half yet: enter the with block")
        return self._step.message  # type: ignore[no-any-return]

    @property
    def transaction_id(self) -> str:
        return self.message.transaction_id or ""

    def _begin(self) -> Flow[TransactionSendResult]:
        if self._flow is not None:
            raise CallerTransactionError("this transaction was entered already; make a new one")
        self._core.admit()
        self._flow = self._core.send(self._request, self._paused)
        return self._flow

    def _joining(self) -> Any:
        """The listener that writes the row, once the checks that need no session passed."""
        if self._step is None or self._ended:
            raise CallerTransactionError(
                "join() belongs inside the `with producer.transaction(...)` block"
            )
        if self._joined is not None or self._join_failed:
            raise CallerTransactionError("join() was called already: one session per transaction")
        listener = self._core.listener
        if not callable(getattr(listener, "join_caller_transaction", None)):
            raise CallerTransactionError(
                f"join() needs the producer's listener to be a SqlTransactionListener (or the "
                f"async one), which answers its check-backs from the same log; got {listener!r}"
            )
        return listener

    def _joined_with(self, join: Callable[[], JoinedSession]) -> None:
        try:
            self._joined = join()
        except BaseException:
            self._join_failed = True  # no row: the decision is ROLLBACK
            raise

    def _ending(self, error: BaseException | None) -> JoinedSession | None:
        """End the block: the joined session to read the decision from, or None (ROLLBACK:
        no session was joined, so no row can exist)."""
        self._ended = True
        joined = self._joined
        if joined is None:
            if error is None and not self._join_failed:
                log.warning(
                    "transaction block ended without join(session): rolled back transaction_id=%s",
                    self.transaction_id,
                )
            return None
        joined.detach()
        return joined


class CallerTransaction(_CallerTransaction):
    """``with producer.transaction(message) as txn``: see the module documentation."""

    def __init__(self, core: SendingCore, message: Message) -> None:
        """``core``: the send core of the :class:`~outbox.producer.TransactionProducer`."""
        super().__init__(core, core.take, message)

    def __enter__(self) -> Self:
        flow = self._begin()
        try:
            self._step = self._run(flow, None)
        except BaseException:
            self._core.release()
            raise
        return self

    def _run(self, flow: Flow[TransactionSendResult], resumed: object) -> Any:
        """Resume the flow with ``resumed``; carry out its steps until it pauses for the block
        (returning that step) or ends (None, its result kept)."""
        outcome = run_blocking(flow, self._take, resumed, pause_at=self._paused)
        if isinstance(outcome, Paused):
            return outcome.step
        self.result = outcome
        return None

    def join(self, session: Any) -> None:
        """Put the log row into ``session`` (a SQLAlchemy ``Session`` or ``scoped_session``,
        such as Flask-SQLAlchemy's ``db.session``), inside its transaction."""
        listener = self._joining()
        self._joined_with(lambda: listener.join_caller_transaction(session, self.message))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        assert self._flow is not None
        try:
            joined = self._ending(exc)
            self._run(self._flow, ROLLBACK if joined is None else joined.outcome())
        finally:
            self._flow.close()
            self._core.release()


class AsyncCallerTransaction(_CallerTransaction):
    """``async with producer.transaction(message) as txn``, ``await txn.join(session)``."""

    def __init__(self, core: SendingCore, take: Callable[[Step], Any], message: Message) -> None:
        """``core``: the send core of the :class:`~outbox.async_producer.AsyncTransactionProducer`;
        ``take``: its steps' outcomes on the loop (awaitables)."""
        super().__init__(core, take, message)

    async def __aenter__(self) -> Self:
        flow = self._begin()
        try:
            self._step = await self._run(flow, None)
        except BaseException:
            self._core.release()
            raise
        return self

    async def _run(self, flow: Flow[TransactionSendResult], resumed: object) -> Any:
        """As :meth:`CallerTransaction._run`, awaiting what the loop waits on."""
        outcome = await drive(flow, self._take, resumed, pause_at=self._paused)
        if isinstance(outcome, Paused):
            return outcome.step
        self.result = outcome
        return None

    async def join(self, session: Any) -> None:
        """Put the log row into ``session`` (an ``AsyncSession`` or ``async_scoped_session``),
        inside its transaction."""
        listener = self._joining()
        from sqlalchemy.ext.asyncio import async_scoped_session

        if isinstance(session, async_scoped_session):
            session = session()
        sync_session = getattr(session, "sync_session", None)
        run_sync = getattr(session, "run_sync", None)
        if sync_session is None or run_sync is None:
            from outbox.sql.errors import JoinError

            self._join_failed = True
            raise JoinError(
                "await join() takes a SQLAlchemy AsyncSession or async_scoped_session, got "
                f"{type(session).__name__}"
            )
        try:
            self._joined = await run_sync(listener.join_caller_transaction, self.message)
        except BaseException:
            self._join_failed = True
            raise

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        assert self._flow is not None
        try:
            joined = self._ending(exc)
            state = ROLLBACK if joined is None else await joined.outcome_async()
            await self._run(self._flow, state)
        finally:
            self._flow.close()
            self._core.release()
