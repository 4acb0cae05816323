"""``SqlTransactionListener``: the local transaction as one SQLAlchemy transaction.

The business change and a row in the transaction log are committed together,
so a check-back becomes a lookup of that row. The answers, and why:

========================================  ====================================
``execute_local_transaction``
business function and log insert commit   COMMIT_MESSAGE
business function (or the insert) raises  ROLLBACK_MESSAGE: nothing was
                                          committed; the error is kept on the
                                          send result
COMMIT itself fails, outcome unknown      UNKNOW: the server may have
(connection lost mid-COMMIT)              committed; the check-back finds out
``check_local_transaction``
log row present, for this half            COMMIT_MESSAGE
ROLLBACK row for this half                ROLLBACK_MESSAGE (an earlier answer)
log row present, for another half of the  ROLLBACK_MESSAGE: the id is reused;
same id                                   its row (the primary key) is taken,
                                          so this half can never commit
a ROLLBACK answer kept for this half      ROLLBACK_MESSAGE (the log row may
                                          since hold another half's answer)
no row, half older than the grace period  ROLLBACK_MESSAGE, written down first
                                          as a ROLLBACK row for the half: a
                                          local transaction still committing
                                          (a slow COMMIT) either shows its row
                                          first, or is refused its own
no row, half younger                      UNKNOW: the transaction may still
                                          be running; the checker asks again
the database fails or is unreachable      UNKNOW, never ROLLBACK: an error
                                          says nothing about the outcome
========================================  ====================================

The grace period must exceed the longest local transaction (plus clock skew
between the producer hosts of the group). As a second line of defence the
helper refuses to commit a local transaction that has already run for the
grace period: a check-back may have answered ROLLBACK for it by then.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError, ProgrammingError
from sqlalchemy.orm import Session, SessionTransaction

from outbox.errors import ConfigurationError, InvalidMessageError
from outbox.message import LocalTransactionState, Message
from outbox.producer import record_local_transaction_error
from outbox.protocol import validate_producer_group
from outbox.sql.engine import unavailable
from outbox.sql.errors import (
    CommitOutcomeUnknownError,
    LocalTransactionMisuseError,
    LocalTransactionRolledBackByCheckError,
    LocalTransactionTooSlowError,
)
from outbox.sql.joined import JoinedSession
from outbox.sql.log import (
    DEFAULT_TABLE,
    MYSQL_DIALECTS,
    REVISION_0002_COLUMNS,
    REVISION_0004_COLUMNS,
    LogTarget,
    missing_part,
    missing_table_error,
    outdated_table_error,
    privilege_error,
    rollback_table,
    table_exists,
    transaction_log_table,
    upsert,
    utc_from_timestamp,
)

log = logging.getLogger(__name__)

BusinessFunction = Callable[[Session, Message, Any], object]
"""``business(session, message, arg)``: the application's database work.

It must not commit or roll back ``session``: the helper owns the transaction.
Raise to roll back (the exception is kept on the send result), or return
``LocalTransactionState.ROLLBACK_MESSAGE`` to roll back without an error;
any other return value is ignored.
"""

DEFAULT_GRACE_SECONDS = 60.0
"""Ten times RocketMQ's transaction timeout: the first check-back (after ~6 s)
of a transaction still running answers UNKNOW, a later one decides."""

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW


class TransactionLogRule:
    """The check-back answer from the log table, on a session it is given.

    The listeners (sync and asyncio) and the checker's resolve-from-database
    mode ask the very same question the same way, so all use this one rule.
    """

    def __init__(
        self,
        target: LogTarget,
        *,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not grace_seconds > 0:
            raise ConfigurationError(f"grace_seconds must be positive, got {grace_seconds!r}")
        self.grace_seconds = float(grace_seconds)
        self._target = target
        self._clock = clock
        self._table = table = transaction_log_table(target.table, target.schema)
        self._lookup = lookup_statement(table)
        self._answers = rollback_table(target.table, target.schema)

    def answer_on(
        self, session: Session, message: Message, group: str = ""
    ) -> LocalTransactionState:
        """The row for this half answers; without one, the age of the half does.

        A ROLLBACK for a missing row is written down first (a ``rolled_back``
        row for the half, in ``group``), so that a local transaction still
        committing either shows its row to this check or is refused its own.
        """
        for attempt in range(1, _CHECK_ATTEMPTS + 1):
            try:
                return self._answer(session, message, group)
            except Exception as exc:
                _rollback_quietly(session)
                if attempt < _CHECK_ATTEMPTS and _transaction_aborted(exc):
                    # The server ended the victim's transaction whole: ask afresh.
                    log.debug("check-back deadlocked; asking again: %r", exc)
                    continue
                log.warning(
                    "transaction log lookup failed; answering UNKNOW transaction_id=%s error=%r",
                    message.transaction_id,
                    explain_database_error(exc, session, self._target),
                )
        return UNKNOW

    def _answer(self, session: Session, message: Message, group: str) -> LocalTransactionState:
        verdict = _verdict(
            session.execute(self._lookup, {"id": message.transaction_id}).first(), message
        )
        if verdict is not None:
            return verdict
        if rollback_answered(session, self._answers, message):
            return ROLLBACK
        if message.born_ms is None:
            log.warning("checked message has no born_ms; answering UNKNOW")
            return UNKNOW
        if self._clock() - message.born_ms / 1000 < self.grace_seconds:
            return UNKNOW
        verdict = _verdict(self._record_rollback(session, message, group), message)
        return UNKNOW if verdict is None else verdict

    def _record_rollback(self, session: Session, message: Message, group: str) -> Any:
        """Write this half's ROLLBACK row unless a committed row won; the row that stands.

        The answer is also kept for the half alone: the log row holds one answer per
        id, and a ROLLBACK for another half of a reused id replaces it.
        """
        table = self._table
        now = self._clock()
        values = _row(message, group, now, rolled_back=True)
        dialect = session.get_bind().dialect.name
        wrote = upsert(session.execute, table, dialect, values, table.c.rolled_back) is not False
        if wrote and message.half_partition is not None and message.half_offset is not None:
            answer = {key: values[key] for key in _ANSWER_COLUMNS}
            if not rollback_answered(session, self._answers, message):
                session.execute(sa.insert(self._answers).values(answer))
        session.commit()
        return session.execute(self._lookup, {"id": message.transaction_id}).first()


_ANSWER_COLUMNS = (
    "transaction_id",
    "half_partition",
    "half_offset",
    "producer_group",
    "created_at",
)


def rollback_answered(
    session: Session, answers: sa.Table, message: Message, *, latest: bool = False
) -> bool:
    """Whether a check-back answered ROLLBACK for the half ``message`` names.

    ``latest``: a locking read (``FOR SHARE``), of what is committed now rather than
    of the transaction's snapshot; a check answering the half meanwhile waits for it.
    """
    if message.half_partition is None or message.half_offset is None:
        return False  # a message of no half: the log row alone answers, by id
    query = sa.select(answers.c.transaction_id).where(
        answers.c.transaction_id == message.transaction_id,
        answers.c.half_partition == message.half_partition,
        answers.c.half_offset == message.half_offset,
    )
    if latest:
        query = query.with_for_update(read=True)
    return session.execute(query).first() is not None


def lookup_statement(table: sa.Table) -> sa.Select[Any]:
    """The log row of a transaction id (bound as ``id``), as far as a check-back needs it."""
    return sa.select(
        table.c.half_partition,
        table.c.half_offset,
        table.c.rolled_back,
        table.c.parked_half.is_not(None).label("parked"),
        sa.and_(table.c.parked_half.is_(None), table.c.drain_from_offset.is_not(None)).label(
            "drained"
        ),
    ).where(table.c.transaction_id == sa.bindparam("id"))


def _row(message: Message, group: str, now: float, *, rolled_back: bool) -> dict[str, object]:
    row: dict[str, object] = {
        "transaction_id": message.transaction_id,
        "producer_group": group,
        "created_at": utc_from_timestamp(now),
        "half_partition": message.half_partition,
        "half_offset": message.half_offset,
        "rolled_back": rolled_back,
    }
    if message.parked_half is not None and not rolled_back:
        row["parked_half"] = message.parked_half  # the send parked: the checker drains it
    return row


def _verdict(row: Any, message: Message) -> LocalTransactionState | None:
    """What the log row of the id says of the half ``message`` names; ``None``: nothing yet.

    A committed row of another half means this one can never commit (the id is
    taken); a ROLLBACK row of another half says nothing of this one, whose local
    transaction may still take the id over.
    """
    if row is None:
        return None
    if row.rolled_back:
        return ROLLBACK if _is_half_of(row, message) else None
    if row.parked:
        # Committed, and parked: the checker publishes it from the row (a half of its own,
        # decided in the same Kafka transaction). Any half asked about is the send's own,
        # stored after the send gave up on it, and must never be published as well.
        return ROLLBACK
    if row.drained:  # the checker's half of a parked send, or the send's own, stored late
        return COMMIT if _is_half_of(row, message) else ROLLBACK
    return COMMIT if _same_half(row, message) else ROLLBACK


class TransactionLogCheck(TransactionLogRule):
    """:class:`TransactionLogRule` on a session of its own for each answer."""

    def __init__(
        self,
        session_factory: Callable[[], Session],
        target: LogTarget,
        *,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(target, grace_seconds=grace_seconds, clock=clock)
        self._session_factory = session_factory

    def answer(self, message: Message, group: str = "") -> LocalTransactionState:
        """Look the transaction id up; no row means ROLLBACK only once the grace is over."""
        with self._session_factory() as session:
            return self.answer_on(session, message, group)


_Factory = TypeVar("_Factory", bound=Callable[[], Any])
_Business = TypeVar("_Business", bound=Callable[..., object] | None)


class TransactionLogListener(Generic[_Factory, _Business]):
    """The rules of a listener backed by the log table, on a session a subclass opens.

    :class:`SqlTransactionListener` runs them on a sync ``Session``; the
    asyncio listener on the sync session inside an ``AsyncSession`` (in
    SQLAlchemy's greenlet), so both answer by the very same code.
    ``session_factory`` makes the subclass's sessions, ``business`` is the
    application's work on one; ``group`` is the producer group, recorded on
    each log row; ``clock`` (seconds since the epoch) is injectable for tests
    of the grace-period rule.
    """

    parks_events = True
    """A parked send's half (``park_when_unavailable``) goes into the log row it commits."""

    def __init__(
        self,
        session_factory: _Factory,
        business: _Business,
        *,
        group: str,
        table: str = DEFAULT_TABLE,
        schema: str | None = None,
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        validate_producer_group(group)
        if not callable(session_factory) or not (business is None or callable(business)):
            raise ConfigurationError(
                "session_factory must be a callable, and business a callable or None"
            )
        self.group = group
        self.target = LogTarget(table, schema)
        self._check = TransactionLogRule(self.target, grace_seconds=grace_seconds, clock=clock)
        self.grace_seconds = self._check.grace_seconds
        self._session_factory = session_factory
        self._business = business
        self._clock = clock
        self._table = transaction_log_table(self.target.table, self.target.schema)
        self._lookup = lookup_statement(self._table)
        self._answers = rollback_table(self.target.table, self.target.schema)

    @property
    def row_lookup(self) -> sa.Select[Any]:
        """The log row of a transaction id (bound as ``id``): its half and ``rolled_back``."""
        return self._lookup

    def join_caller_transaction(self, session: Session, message: Message) -> JoinedSession:
        """Put the half's log row into the caller's ``session``; watch what its transaction does.

        Used by ``txn.join(session)`` of ``producer.transaction(...)``
        (:mod:`outbox.caller_transaction`): the row is this listener's, so its
        check-backs answer for it.
        """
        return JoinedSession(session, message, self)

    def _verify_on(self, session: Session) -> None:
        try:
            exists = table_exists(session.connection(), self.target)
        except DBAPIError as exc:
            raise unavailable(session.get_bind(), exc) from None  # type: ignore[arg-type]
        if not exists:
            raise missing_table_error(self.target, session.get_bind().url)
        part = missing_part(session.connection(), self.target)
        if part is not None:
            raise outdated_table_error(self.target, part, session.get_bind().url)

    def _execute_on(
        self, session: Session, message: Message, business: Callable[[], object]
    ) -> LocalTransactionState:
        """Run ``business`` and insert the log row in one database transaction on ``session``."""
        transaction_id = message.transaction_id
        if not transaction_id:
            raise InvalidMessageError(
                "the message has no transaction_id: send it through a producer"
            )
        if self._business is None:
            raise ConfigurationError(
                "this listener has no business function: send with producer.transaction(...) "
                "and txn.join(session), or give the listener one"
            )
        stage = "business"
        try:
            transaction = session.begin()
            outcome = business()
            self._require_open(transaction, transaction_id)
            if outcome is ROLLBACK:
                transaction.rollback()
                log.info("business function rolled back transaction_id=%s", transaction_id)
                return ROLLBACK
            stage = "log"
            self.insert_row(session, message)
            session.flush()
            self.require_in_time(message)
        except Exception as exc:
            _rollback_quietly(session)
            error = self.explain_error(session, exc) if stage == "log" else exc
            log.warning(
                "local transaction rolled back transaction_id=%s error=%r",
                transaction_id,
                error,
            )
            record_local_transaction_error(error)
            return ROLLBACK
        try:
            transaction.commit()
        except Exception as exc:
            refused = _commit_refused(session, exc)
            _rollback_quietly(session)
            if refused:
                log.warning("commit refused transaction_id=%s error=%r", transaction_id, exc)
                record_local_transaction_error(exc)
                return ROLLBACK
            log.error(
                "commit outcome unknown; left to the check-back transaction_id=%s error=%r",
                transaction_id,
                exc,
            )
            unknown = CommitOutcomeUnknownError(
                f"commit of {transaction_id} failed and may or may not have happened "
                f"(the check-back will find out): {exc}"
            )
            unknown.__cause__ = exc
            record_local_transaction_error(unknown)
            return UNKNOW
        return COMMIT

    def insert_row(
        self,
        session: Session,
        message: Message,
        returning: Sequence[sa.ColumnElement[Any]] = (),
    ) -> Any:
        """This half's row; it may take over the ROLLBACK row of another half of its id.

        Not its own: a check-back answered ROLLBACK for this very half (a parked send's
        half is the checker's to write, so every ROLLBACK row is another's). A
        committed row is refused by the database (IntegrityError), as ever.
        Returns the insert's row with ``returning`` after the transaction id, or None
        where the database returns none.
        """
        table = self._table
        values = _row(message, self.group, self._clock(), rolled_back=False)
        taken_over_when: sa.ColumnElement[bool]
        if message.parked_half is not None:
            # A parked send: its event is published from this row, as a half the checker
            # writes, of which no check-back has asked. A ROLLBACK row of the id is another
            # half's (an earlier attempt's, or the send's own, stored after it gave up on it:
            # neither is ever published), taken over as an acknowledged half takes it over.
            taken_over_when = table.c.rolled_back
        elif message.half_partition is None or message.half_offset is None:
            taken_over_when = sa.false()  # no half to tell apart
        else:  # a row of no half (NULL) compares as unknown: not taken over either
            taken_over_when = sa.and_(
                table.c.rolled_back,
                sa.or_(
                    table.c.half_partition != sa.literal(message.half_partition),
                    table.c.half_offset != sa.literal(message.half_offset),
                ),
            )
        dialect = session.get_bind().dialect.name
        written = upsert(session.execute, table, dialect, values, taken_over_when, returning)
        # MySQL's REPEATABLE READ answers plain reads from the transaction's first snapshot,
        # maybe taken by the business function before a check wrote: read what is committed.
        latest = dialect in MYSQL_DIALECTS
        if written is not False:
            # Read after the row is ours: a check of this half answering now waits for it.
            if rollback_answered(session, self._answers, message, latest=latest):
                raise _answered_rollback(message)
            return None if written is True else written
        lookup = self._lookup.with_for_update(read=True) if latest else self._lookup
        row = session.execute(lookup, {"id": message.transaction_id}).first()
        if row is not None and row.rolled_back:
            raise _answered_rollback(message)
        session.execute(sa.insert(table).values(values))  # the id is committed: refused

    def _require_open(self, transaction: SessionTransaction, transaction_id: str) -> None:
        if not transaction.is_active:
            raise LocalTransactionMisuseError(
                f"the business function ended the database transaction of {transaction_id} "
                "(session.commit() or rollback()), so its changes and the event are no longer "
                "atomic; the helper commits them together with the log row: remove the "
                "commit, and raise to roll back"
            )

    def require_in_time(self, message: Message) -> None:
        """Refuse (LocalTransactionTooSlowError) a commit past the grace period: a check-back
        may have answered ROLLBACK for a half that old. Also the joined session's guard."""
        if message.born_ms is None:
            return
        age = self._clock() - message.born_ms / 1000
        if age >= self.grace_seconds:
            raise LocalTransactionTooSlowError(
                f"local transaction of {message.transaction_id} ran {age:.1f}s, past the "
                f"{self.grace_seconds:g}s grace period after which a check-back answers "
                "ROLLBACK; rolled back instead of committed (raise grace_seconds)"
            )

    def explain_error(self, session: Session, exc: Exception) -> Exception:
        """``exc``, or the setup error it stands for (the log table missing or not upgraded)."""
        return explain_database_error(exc, session, self.target)


class SqlTransactionListener(TransactionLogListener[Callable[[], Session], BusinessFunction]):
    """A :class:`~outbox.producer.TransactionListener` backed by a SQLAlchemy database.

    ``session_factory`` is anything that returns a new sync ``Session`` (a
    ``sessionmaker``); the other arguments are :class:`TransactionLogListener`'s.
    Thread-safe: every call uses its own session.
    """

    def verify(self) -> None:
        """Fail fast, before the first send, if the database or the log table is missing.

        Raises DatabaseUnavailableError or TransactionLogMissingError (naming
        ``outbox db upgrade``). Sends would otherwise each roll back with that
        error, which is harder to notice.
        """
        with self._session_factory() as session:
            self._verify_on(session)

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        """Run the business function and insert the log row in one database transaction."""
        with self._session_factory() as session:
            return self._execute_on(session, message, lambda: self._business(session, message, arg))

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        """Look the transaction id up; no row means ROLLBACK only once the grace is over."""
        with self._session_factory() as session:
            return self._check.answer_on(session, message, self.group)


def _answered_rollback(message: Message) -> LocalTransactionRolledBackByCheckError:
    return LocalTransactionRolledBackByCheckError(
        f"a check-back already answered ROLLBACK for transaction "
        f"{message.transaction_id} (its COMMIT came too late, or the checking host's "
        "clock runs ahead); rolled back instead of committed"
    )


def _same_half(row: Any, message: Message) -> bool:
    """Whether the log row committed the half ``message`` names.

    A row or a message without a half identity (a row written before the log
    recorded it, a listener called by hand) cannot tell halves apart: it
    answers by id, as before.
    """
    if _is_half_of(row, message):
        return True
    log.warning(
        "transaction id %s was committed by half %d:%d, not by the half %d:%d asked about "
        "(a reused id); answering ROLLBACK for it",
        message.transaction_id,
        row.half_partition,
        row.half_offset,
        message.half_partition,
        message.half_offset,
    )
    return False


def _is_half_of(row: Any, message: Message) -> bool:
    """Whether the row is the half's, or one of them has no half identity to compare."""
    if row.half_partition is None or message.half_partition is None:
        return True
    return (row.half_partition, row.half_offset) == (message.half_partition, message.half_offset)


def explain_database_error(exc: Exception, session: Session, target: LogTarget) -> Exception:
    """A missing log table is a setup error with a known fix; say so.

    So is a missing grant, and a table migrated by an older version (a column missing),
    probed on new sessions of ``session``'s database (a failed one may be unusable). Only errors
    that name the table or a newer column are probed ("no such table: X",
    'relation "X" does not exist'): probing after a connection failure
    would wait out a second connect timeout for nothing.
    """
    if not isinstance(exc, ProgrammingError | OperationalError):
        return exc
    if (denied := privilege_error(exc, target, session.get_bind().url)) is not None:
        return denied
    newer = (*REVISION_0002_COLUMNS, *REVISION_0004_COLUMNS)
    if target.table not in str(exc) and not any(c in str(exc) for c in newer):
        return exc  # (the rollback table's name holds the log table's)
    try:
        with Session(session.get_bind()) as probe:  # the failed session may be unusable
            connection, url = probe.connection(), probe.get_bind().url
            if not table_exists(connection, target):
                error = missing_table_error(target, url)
            elif (part := missing_part(connection, target)) is not None:
                error = outdated_table_error(target, part, url)
            else:
                return exc
    except Exception:
        return exc
    error.__cause__ = exc
    return error


_CHECK_ATTEMPTS = 3
"""A check-back that concurrent checks of its half deadlocked is asked again, this often.

On MySQL a refused duplicate key leaves a shared lock on the row; two checks holding
one and both updating deadlock, and InnoDB rolls one back whole. Nothing was read."""


def _transaction_aborted(exc: Exception) -> bool:
    """A deadlock or serialization failure (SQLSTATE class 40): the server ended the whole
    transaction and the connection is fine, so the same question may be asked again."""
    if not isinstance(exc, DBAPIError) or exc.connection_invalidated:
        return False
    return (getattr(exc.orig, "sqlstate", None) or "").startswith("40")


def _rollback_quietly(session: Session) -> None:
    """Roll back; a dead connection cannot, and the server drops its transaction anyway."""
    try:
        session.rollback()
    except Exception as exc:
        log.debug("rollback failed (connection lost?): %r", exc)


def _commit_refused(session: Session, exc: Exception) -> bool:
    """Whether the server answered COMMIT with a refusal, so nothing was committed.

    Only a definite answer counts: a constraint checked at commit, a
    serialization failure or deadlock (SQLSTATE class 40), SQLite's "database
    is locked". Anything else, a lost connection above all, may have committed.
    """
    if isinstance(exc, IntegrityError):
        return True
    if not isinstance(exc, DBAPIError) or exc.connection_invalidated:
        return False
    sqlstate = getattr(exc.orig, "sqlstate", None) or ""
    if sqlstate.startswith(("23", "40")):
        return True
    backend = session.get_bind().dialect.name
    return backend == "sqlite" and isinstance(exc, OperationalError) and "locked" in str(exc)
