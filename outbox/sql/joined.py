"""The log row in the caller's own session, and what the database then did with it.

``with producer.transaction(message) as txn: ... txn.join(session)`` puts the
half's transaction-log row into a session the application opened and commits
itself (a request's session in FastAPI or Flask). The decision must follow the
database, never the Python block around it, so this watches the session's own
transaction through SQLAlchemy's session events:

=============================================  ==================================
the session's transaction (the row's)          outcome
=============================================  ==================================
committed (``after_commit``)                   COMMIT_MESSAGE
ended without a COMMIT being sent: rolled      ROLLBACK_MESSAGE: the row is gone
back, closed, a flush failing before COMMIT,   with the rest
a commit refused as too late (grace period)
COMMIT sent and it failed (connection lost,    UNKNOW: the server may have
a refusal at commit time)                      committed; the check-back reads
                                               the log row and finds out
still open when the ``with`` block ends        UNKNOW, the same way
=============================================  ==================================

A savepoint (``begin_nested``) ending says nothing about the row, which lives in
the outer transaction: only the transaction the row went into counts. The row
is written by the listener's own insert (:class:`~outbox.sql.listener.TransactionLogListener`),
so the check-back answers it as it answers a row its own transaction wrote.
"""

from __future__ import annotations

import logging
from typing import Protocol

from sqlalchemy import event
from sqlalchemy.orm import Session, SessionTransaction

from outbox.message import LocalTransactionState, Message
from outbox.sql.errors import JoinError

log = logging.getLogger(__name__)


class LogWriter(Protocol):
    """What a joined session needs of the listener
    (:class:`~outbox.sql.listener.TransactionLogListener`, which imports this module)."""

    def _insert_row(self, session: Session, message: Message) -> None: ...

    def _explain(self, session: Session, exc: Exception) -> Exception: ...

    def _require_in_time(self, message: Message) -> None: ...


class JoinedSession:
    """The log row of one half in the caller's session, and the outcome of its transaction.

    :attr:`outcome` is None while that transaction is open, then
    COMMIT_MESSAGE, ROLLBACK_MESSAGE or UNKNOW (a COMMIT whose answer was lost).
    """

    def __init__(self, session: Session, message: Message, listener: LogWriter) -> None:
        if not isinstance(session, Session):
            raise JoinError(f"join() takes a SQLAlchemy Session, got {type(session).__name__}")
        if session.in_nested_transaction():
            raise JoinError(
                "join() inside a savepoint (begin_nested): the log row would go with the "
                "savepoint; join in the outer transaction"
            )
        self.session = session
        self.outcome: LocalTransactionState | None = None
        self._message = message
        self._listener = listener
        self._committing = False
        self._committed = False
        try:
            listener._insert_row(session, message)  # begins the session's transaction if needed
        except Exception as exc:
            explained = listener._explain(session, exc)
            if explained is exc:
                raise
            raise explained from exc
        self._transaction: SessionTransaction | None = session.get_transaction()
        self._events = (
            ("before_commit", self._before_commit),
            ("after_commit", self._after_commit),
            ("after_transaction_end", self._after_transaction_end),
        )
        for name, handler in self._events:
            event.listen(session, name, handler)
        log.debug("log row joined the caller's session transaction_id=%s", message.transaction_id)

    def _before_commit(self, session: Session) -> None:
        if self.outcome is not None or session.in_nested_transaction():
            return  # decided already, or a savepoint's release: not the row's commit
        # Refused before anything is sent: the commit raises, the transaction rolls back.
        self._listener._require_in_time(self._message)
        # Flushed here, so that a failing flush is known to have sent no COMMIT.
        session.flush()
        self._committing = True

    def _after_commit(self, session: Session) -> None:
        self._committed = True

    def _after_transaction_end(self, session: Session, transaction: SessionTransaction) -> None:
        if transaction is not self._transaction or self.outcome is not None:
            return
        if self._committed:
            self.outcome = LocalTransactionState.COMMIT_MESSAGE
        elif self._committing:
            log.error(
                "commit outcome unknown; left to the check-back transaction_id=%s",
                self._message.transaction_id,
            )
            self.outcome = LocalTransactionState.UNKNOW
        else:
            self.outcome = LocalTransactionState.ROLLBACK_MESSAGE
        # Detached when the block ends: SQLAlchemy forbids removing a listener mid-dispatch.

    def detach(self) -> None:
        """Stop watching the session (its transaction ended, or the ``with`` block did)."""
        for name, handler in self._events:
            if event.contains(self.session, name, handler):
                event.remove(self.session, name, handler)
