"""``AsyncSqlTransactionListener``: the SQL listener for SQLAlchemy's asyncio extension.

Its rules are :class:`~outbox.sql.listener.SqlTransactionListener`'s, run by
the same code: the business function's rows and the log row commit in one
database transaction (an exception or ROLLBACK_MESSAGE rolls both back, a
COMMIT whose outcome is unknown answers UNKNOW), and a check-back is a lookup
of the log row with the grace-period rule. Only the plumbing differs: an
``AsyncSession`` is opened, and the rules run on the sync session inside it
(``AsyncSession.run_sync``, SQLAlchemy's greenlet bridge), awaiting the
application's ``async def`` business function from there. The event loop is
never blocked: every database round trip is awaited by the async driver
(aiosqlite, psycopg's async connection, asyncpg).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from outbox.message import LocalTransactionState, Message
from outbox.sql.listener import TransactionLogListener

try:  # SQLAlchemy 2.1 renamed it; the old name goes in 2.2
    from sqlalchemy.util import await_
except ImportError:  # pragma: no cover - SQLAlchemy 2.0
    from sqlalchemy.util import await_only as await_

AsyncBusinessFunction = Callable[[AsyncSession, Message, Any], Awaitable[object]]
"""``await business(session, message, arg)``: the application's database work.

As :data:`~outbox.sql.listener.BusinessFunction`, on an ``AsyncSession``: it
must not commit or roll back; raise to roll back (the exception is kept on the
send result), or return ``LocalTransactionState.ROLLBACK_MESSAGE``.
"""


class AsyncSqlTransactionListener(
    TransactionLogListener[Callable[[], AsyncSession], AsyncBusinessFunction]
):
    """An :class:`~outbox.async_producer.AsyncTransactionListener` backed by SQLAlchemy asyncio.

    ``session_factory`` is an ``async_sessionmaker`` (anything returning a new
    ``AsyncSession``); the other arguments are :class:`SqlTransactionListener`'s.
    Every call uses its own session, so any number of tasks may send at once.
    """

    async def verify(self) -> None:
        """Fail fast if the database or the log table is missing (as the sync ``verify``)."""
        async with self._session_factory() as session:
            await session.run_sync(self._verify_on)

    async def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        """Run the business function and insert the log row in one database transaction."""
        async with self._session_factory() as session:

            def business() -> object:
                return await_(self._business(session, message, arg))

            def execute(sync_session: Session) -> LocalTransactionState:
                return self._execute_on(sync_session, message, business)

            return await session.run_sync(execute)

    async def check_local_transaction(self, message: Message) -> LocalTransactionState:
        """Look the transaction id up; no row means ROLLBACK only once the grace is over."""
        async with self._session_factory() as session:
            return await session.run_sync(self._check.answer_on, message, self.group)
