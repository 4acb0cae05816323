"""The log row in the caller's own session, and what the database then did with it.

``with producer.transaction(message) as txn: ... txn.join(session)`` puts the
half's transaction-log row into a session the application opened and commits
itself (a request's session in FastAPI or Flask). The decision must follow the
database, never the Python block around it nor what SQLAlchemy's session events
say happened: when the block ends, :meth:`JoinedSession.outcome` reads the row
back on a connection of its own (:mod:`outbox.sql.evidence`):

=============================================  ==================================
what the database holds when the block ends    outcome
=============================================  ==================================
the row, committed                             COMMIT_MESSAGE, however it was
                                               committed (the session, its
                                               connection, an outer transaction)
no row, and the transaction that held it       ROLLBACK_MESSAGE: rolled back,
ended (PostgreSQL: aborted; SQLite: no writer  closed, a savepoint's release then
left)                                          an error, a refused COMMIT
no row, its transaction still open or its      UNKNOW: the check-back reads the
fate unknown (a COMMIT whose answer was lost)  same row later and decides
=============================================  ==================================

The row is written by the listener's own insert
(:class:`~outbox.sql.listener.TransactionLogListener`), so the check-back answers
it as it answers a row its own transaction wrote. A join inside a savepoint is
refused: the row would go with the savepoint.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.orm import Session, scoped_session

from outbox.message import LocalTransactionState, Message
from outbox.sql.errors import JoinError
from outbox.sql.evidence import RowHolder, holder_columns, holder_of, outcome_on

log = logging.getLogger(__name__)


class LogWriter(Protocol):
    """What a joined session needs of the listener
    (:class:`~outbox.sql.listener.TransactionLogListener`, which imports this module)."""

    def insert_row(
        self,
        session: Session,
        message: Message,
        returning: Sequence[sa.ColumnElement[Any]] = (),
    ) -> Any: ...

    def explain_error(self, session: Session, exc: Exception) -> Exception: ...

    def require_in_time(self, message: Message) -> None: ...

    @property
    def row_lookup(self) -> sa.Select[Any]: ...


def session_of(session: object) -> Session:
    """The ``Session`` that ``join`` was given, or the current one of a ``scoped_session``.

    Flask-SQLAlchemy's ``db.session`` is a ``scoped_session``: a registry whose
    call returns the session of this request.
    """
    if isinstance(session, scoped_session):
        session = session()
    if not isinstance(session, Session):
        raise JoinError(
            f"join() takes a SQLAlchemy Session or scoped_session, got {type(session).__name__}"
        )
    return session


class JoinedSession:
    """The log row of one half in the caller's session, and what the database made of it."""

    def __init__(self, session: object, message: Message, listener: LogWriter) -> None:
        session = session_of(session)
        if session.in_nested_transaction():
            raise JoinError(
                "join() inside a savepoint (begin_nested): the log row would go with the "
                "savepoint; join in the outer transaction"
            )
        self.session = session
        self._message = message
        self._listener = listener
        try:
            # (begins the session's transaction if needed)
            inserted = listener.insert_row(session, message, holder_columns(session))
            self._holder: RowHolder = holder_of(session, inserted)
        except Exception as exc:
            explained = listener.explain_error(session, exc)
            if explained is exc:
                raise
            raise explained from exc
        event.listen(session, "before_commit", self._before_commit)
        log.debug("log row joined the caller's session transaction_id=%s", message.transaction_id)

    def _before_commit(self, session: Session) -> None:
        """Refuse a commit past the grace period (a check-back may have answered ROLLBACK).

        A second line of defence only: the primary key serialises the row and a
        check-back's ROLLBACK row. A savepoint's release is not the row's commit.
        """
        if not session.in_nested_transaction():
            self._listener.require_in_time(self._message)

    def detach(self) -> None:
        """Stop watching the session (the ``with`` block ended)."""
        if event.contains(self.session, "before_commit", self._before_commit):
            event.remove(self.session, "before_commit", self._before_commit)

    def outcome(self) -> LocalTransactionState:
        """The decision, from the row read back on a connection of the session's engine."""
        try:
            with self._holder.engine.connect() as connection:
                state = outcome_on(connection, self._holder, self._message, self._lookup)
        except Exception as exc:  # no connection: no evidence
            state = self._unreadable(exc)
        return self._reported(state)

    async def outcome_async(self) -> LocalTransactionState:
        """:meth:`outcome` through the asyncio driver of the ``AsyncSession``'s engine."""
        from sqlalchemy.ext.asyncio import AsyncEngine

        try:
            async with AsyncEngine(self._holder.engine).connect() as connection:
                state = await connection.run_sync(
                    outcome_on, self._holder, self._message, self._lookup
                )
        except Exception as exc:
            state = self._unreadable(exc)
        return self._reported(state)

    @property
    def _lookup(self) -> sa.Select[Any]:
        return self._listener.row_lookup

    def _unreadable(self, exc: Exception) -> LocalTransactionState:
        log.warning(
            "could not connect to read the joined transaction's outcome transaction_id=%s error=%r",
            self._message.transaction_id,
            exc,
        )
        return LocalTransactionState.UNKNOW

    def _reported(self, state: LocalTransactionState) -> LocalTransactionState:
        if state is LocalTransactionState.UNKNOW:
            log.warning(
                "no evidence yet that the joined transaction committed or dropped the log "
                "row; left to the check-back transaction_id=%s",
                self._message.transaction_id,
            )
        return state
