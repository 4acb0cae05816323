"""What the database holds of a joined transaction: the decision read as evidence.

``txn.join(session)`` puts the half's log row into a transaction the caller
owns. When the ``with`` block ends, the decision must follow what the database
committed, and nothing else: SQLAlchemy's session events say what the ORM did,
which is not the same (``after_commit`` fires for a savepoint's release and for
a session whose commit leaves an outer connection's transaction open; a commit
through ``session.connection()`` fires nothing). So the row is read back by its
primary key on a connection of its own, which sees only committed data:

========================================  ======================================
read on a separate connection             decision
========================================  ======================================
the row, committed, names this half       COMMIT_MESSAGE: the database holds it
the row is a check-back's ROLLBACK        ROLLBACK_MESSAGE: the half can never
answer for this half                      commit past it (the primary key)
no row, and the transaction that held it  ROLLBACK_MESSAGE: it ended without
is known to have ended without it         committing the row, which only
                                          ``join`` inserts
no row, anything else (still open, the    UNKNOW: the check-back reads the
database cannot tell, the read failed)    same row later and decides
========================================  ======================================

"Known to have ended" is asked of the database itself:

- **PostgreSQL**: the holder's top-level transaction id, taken at ``join`` in
  that transaction (``pg_current_xact_id()``), and its status in the commit log
  (``pg_xact_status``). Only ``aborted`` counts: a ``committed`` holder without
  the row (a savepoint rolled back around it, or the instant between the commit
  log and the snapshot) is left to the check-back.
- **SQLite**: one writer at a time. A ``BEGIN IMMEDIATE`` that gets the write
  lock within :data:`SQLITE_LOCK_WAIT_SECONDS` proves no write transaction is
  open, so the one that held the row has ended; the row is read again under
  that lock.
- **MySQL and MariaDB (InnoDB)**: the row read by its key with a locking read
  that does not wait (``FOR SHARE NOWAIT``; MariaDB: ``LOCK IN SHARE MODE
  NOWAIT``), under READ COMMITTED so that a missing key takes no gap lock. The
  row's insert (or its takeover of another half's ROLLBACK row) holds the
  record's lock until its transaction ends, so a refused lock is an open holder
  (UNKNOW), and a key without this half's row that the read could lock is a
  holder that ended without it (ROLLBACK): a committed row of this half can
  never be taken over, the insert only takes over ROLLBACK rows. It needs no
  privilege beyond the log's own (SELECT, and UPDATE or DELETE on MySQL 8).
- Other databases: a committed row is still evidence; its absence is not.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session

from outbox.message import LocalTransactionState, Message
from outbox.sql.log import MYSQL_DIALECTS

log = logging.getLogger(__name__)

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW

SQLITE_LOCK_WAIT_SECONDS = 1.0
"""How long the SQLite read-back waits for the write lock before answering UNKNOW.

Long enough for other writers' short transactions; a transaction still holding
the row (a block that ended before its commit) costs this wait once.
"""

_PG_XACT_STATUS = sa.text("SELECT pg_xact_status(CAST(:xid AS xid8))")

_LOCK_REFUSED = frozenset({1205, 3572})
"""InnoDB's answers to a NOWAIT read of a locked row: MariaDB's ER_LOCK_WAIT_TIMEOUT,
MySQL's ER_LOCK_NOWAIT."""


@dataclass(frozen=True)
class RowHolder:
    """The transaction a joined log row went into, as the database can be asked about it.

    ``engine`` is the sync engine of the session's bind (for an ``AsyncSession``,
    its ``sync_engine``); ``xid`` PostgreSQL's top-level transaction id.
    """

    engine: Engine
    xid: str | None = None


def holder_columns(session: Session) -> tuple[sa.ColumnElement[Any], ...]:
    """What the log row's insert returns for :func:`holder_of`: PostgreSQL's transaction id,
    read by the insert itself (no round trip of its own)."""
    if session.get_bind().dialect.name != "postgresql":
        return ()
    return (sa.cast(sa.func.pg_current_xact_id(), sa.Text),)


def holder_of(session: Session, inserted: Any) -> RowHolder:
    """The transaction ``session`` has just written the log row in.

    ``inserted`` is the insert's returned row (transaction id, then :func:`holder_columns`),
    or None where it returned none.
    """
    bind = session.get_bind()
    engine = bind.engine if isinstance(bind, Connection) else bind
    assert isinstance(engine, Engine)
    if inserted is None or len(inserted) < 2:
        return RowHolder(engine)
    return RowHolder(engine, inserted[1])


def outcome_on(
    connection: Connection, holder: RowHolder, message: Message, lookup: sa.Select[Any]
) -> LocalTransactionState:
    """The decision for the joined row of ``message``, on a connection of its own.

    ``lookup`` selects the log row's half and ``rolled_back`` by id (bound as ``id``).
    Never raises: a failed read is no evidence, so the answer is UNKNOW.
    """
    try:
        if connection.dialect.name == "postgresql":
            # Each read in a snapshot of its own, and no BEGIN and ROLLBACK round trips.
            connection.execution_options(isolation_level="AUTOCOMMIT")
        elif connection.dialect.name in MYSQL_DIALECTS:
            # A locking read of a missing key takes a gap lock under REPEATABLE READ.
            connection.execution_options(isolation_level="READ COMMITTED")
        return _outcome(connection, holder, message, lookup)
    except Exception as exc:
        log.warning(
            "could not read the joined transaction's outcome; left to the check-back "
            "transaction_id=%s error=%r",
            message.transaction_id,
            exc,
        )
        return UNKNOW
    finally:
        _end_quietly(connection)


def _outcome(
    connection: Connection, holder: RowHolder, message: Message, lookup: sa.Select[Any]
) -> LocalTransactionState:
    dialect = connection.dialect.name
    if dialect in MYSQL_DIALECTS:
        return _innodb_outcome(connection, message, lookup)
    found = _found(connection, message, lookup)
    if found is not None:
        return found
    if dialect == "postgresql" and holder.xid is not None:
        status = connection.execute(_PG_XACT_STATUS, {"xid": holder.xid}).scalar()
        return ROLLBACK if status == "aborted" else UNKNOW
    if dialect == "sqlite":
        connection.rollback()  # the read above began a transaction; the lock needs its own
        if not _sqlite_write_lock(connection):
            return UNKNOW
        return _found(connection, message, lookup) or ROLLBACK
    return UNKNOW


def _found(
    connection: Connection, message: Message, lookup: sa.Select[Any]
) -> LocalTransactionState | None:
    """What the committed log row of the id says of this half, if it says anything."""
    row = connection.execute(lookup, {"id": message.transaction_id}).first()
    if row is None or not _names(row, message):
        return None  # (another half's row: this one's never committed past its key)
    return ROLLBACK if row.rolled_back else COMMIT


def _innodb_outcome(
    connection: Connection, message: Message, lookup: sa.Select[Any]
) -> LocalTransactionState:
    """The row's lock says whether its holder is still open (see the module's table)."""
    locking = lookup.with_for_update(read=True, nowait=True)
    try:
        row = connection.execute(locking, {"id": message.transaction_id}).first()
    except sa.exc.OperationalError as exc:
        if getattr(exc.orig, "args", (None,))[0] not in _LOCK_REFUSED:
            raise
        log.debug("log row still locked: its transaction is open %r", exc)
        return UNKNOW
    if row is None or not _names(row, message):
        return ROLLBACK
    return ROLLBACK if row.rolled_back else COMMIT


def _names(row: Any, message: Message) -> bool:
    return (row.half_partition, row.half_offset) == (message.half_partition, message.half_offset)


def _sqlite_write_lock(connection: Connection) -> bool:
    """Take SQLite's write lock (``BEGIN IMMEDIATE``), waiting a moment; whether it was had.

    The connection's busy timeout is set for the wait and put back after.
    """
    previous = connection.exec_driver_sql("PRAGMA busy_timeout").scalar()
    connection.exec_driver_sql(f"PRAGMA busy_timeout = {int(SQLITE_LOCK_WAIT_SECONDS * 1000)}")
    try:
        connection.exec_driver_sql("BEGIN IMMEDIATE")
    except sa.exc.OperationalError as exc:
        log.debug("sqlite write lock not had: %r", exc)
        return False
    finally:
        connection.exec_driver_sql(f"PRAGMA busy_timeout = {int(previous or 0)}")
    return True


def _end_quietly(connection: Connection) -> None:
    try:
        connection.rollback()
    except Exception as exc:  # a dead connection has no transaction to end
        log.debug("read-back rollback failed: %r", exc)
