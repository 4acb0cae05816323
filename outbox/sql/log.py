"""The transaction-log table: one row per committed local transaction.

A row is inserted in the same database transaction as the business change, so
"row present" is exactly "the local transaction committed", which is what a
check-back asks. The row names the half it committed (half partition and
origin offset): a reused transaction id names several halves, only one of
which committed. A check-back that answers ROLLBACK writes a ``rolled_back``
row for its half, which a late local transaction of that half cannot commit
past (the primary key serialises the two), and keeps the answer in
``<table>_rollback``, one row per half: the next ROLLBACK answer for another
half of the id replaces the log row, never that. The tables are defined here
for queries; they are created and evolved only by the Alembic migrations
(``outbox db upgrade``), never by ``create_all``, so production schemas have
one source of truth and a history.

Rows are only needed while a check-back may still ask about their transaction;
:func:`prune_transaction_log` deletes older ones in short batches.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError

from outbox.errors import ConfigurationError
from outbox.protocol.records import MAX_TRANSACTION_ID_LENGTH
from outbox.sql.engine import connect, describe_url, unavailable
from outbox.sql.errors import TransactionLogMissingError, TransactionLogPrivilegeError

DEFAULT_TABLE = "outbox_transaction_log"
MAX_PRODUCER_GROUP_LENGTH = 249
"""A producer group names a Kafka topic, so Kafka's topic-name limit bounds it."""

MAX_TABLE_NAME_LENGTH = 48
"""So that ``ix_<table>_created_at`` and ``<table>_version`` fit PostgreSQL's 63 bytes."""

MIN_PRUNE_AGE = timedelta(hours=1)
"""Pruning younger rows risks a wrong ROLLBACK: a check-back that finds no row
for an old half answers ROLLBACK, even if the transaction had committed."""

DEFAULT_PRUNE_BATCH = 1000

MYSQL_DIALECTS = ("mysql", "mariadb")
"""SQLAlchemy's names for MySQL and MariaDB (``mysql+pymysql://`` to MariaDB is ``mysql``)."""

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def validate_identifier(name: str, what: str, max_length: int = 63) -> str:
    """Plain identifiers only: they need no quoting in any database, nor in migrations."""
    if not isinstance(name, str) or not _IDENTIFIER.match(name) or len(name) > max_length:
        raise ConfigurationError(
            f"{what} {name!r} is not a valid name: use letters, digits and '_' "
            f"(not starting with a digit), at most {max_length} characters"
        )
    return name


@dataclass(frozen=True)
class LogTarget:
    """Where the transaction log lives: a table name and an optional schema."""

    table: str = DEFAULT_TABLE
    schema: str | None = None

    def __post_init__(self) -> None:
        validate_identifier(self.table, "transaction-log table", MAX_TABLE_NAME_LENGTH)
        if self.schema is not None:
            validate_identifier(self.schema, "transaction-log schema")

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.table}" if self.schema else self.table

    @property
    def rollback_table(self) -> str:
        """The ROLLBACK answers, one row per half (revision 0003)."""
        return f"{self.table}_rollback"

    @property
    def version_table(self) -> str:
        """Alembic's version table for this log: never the application's ``alembic_version``."""
        return f"{self.table}_version"

    def upgrade_hint(self, url: str | None = None) -> str:
        """The command that creates this table, with the flags it needs."""
        parts = ["outbox db upgrade"]
        if url is not None:
            parts.append(f"--url {url}")
        if self.table != DEFAULT_TABLE:
            parts.append(f"--table {self.table}")
        if self.schema:
            parts.append(f"--schema {self.schema}")
        return "`" + " ".join(parts) + "`"


@lru_cache(maxsize=64)
def log_metadata(table: str = DEFAULT_TABLE, schema: str | None = None) -> sa.MetaData:
    """The tables the migrations create for one log, for queries: the log and its ROLLBACK answers.

    Cached: the same name always yields the same Table objects.
    """
    target = LogTarget(table, schema)
    metadata = sa.MetaData(schema=target.schema)
    log = sa.Table(
        target.table,
        metadata,
        sa.Column("transaction_id", sa.String(MAX_TRANSACTION_ID_LENGTH), nullable=False),
        sa.Column("producer_group", sa.String(MAX_PRODUCER_GROUP_LENGTH), nullable=False),
        _created_at(),
        sa.Column("half_partition", sa.Integer(), nullable=True),
        sa.Column("half_offset", sa.BigInteger(), nullable=True),
        sa.Column("rolled_back", sa.Boolean(), nullable=False, server_default=sa.false()),
        # A parked send's half, until the checker drains it (revision 0004).
        sa.Column("parked_half", _PARKED_HALF, nullable=True),
        sa.Column("drain_from_offset", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("transaction_id", name=f"{target.table}_pkey"),
        sa.Index(f"ix_{target.table}_created_at", "created_at"),
    )
    parked = sa.text("parked_half IS NOT NULL")
    sa.Index(
        f"ix_{target.table}_parked",
        log.c.half_partition,
        log.c.created_at,
        postgresql_where=parked,
        sqlite_where=parked,
    )
    # Every ROLLBACK answer of a check-back, one row per half: the log row holds one per id.
    answers = target.rollback_table
    sa.Table(
        answers,
        metadata,
        sa.Column("transaction_id", sa.String(MAX_TRANSACTION_ID_LENGTH), nullable=False),
        sa.Column("half_partition", sa.Integer(), nullable=False),
        sa.Column("half_offset", sa.BigInteger(), nullable=False),
        sa.Column("producer_group", sa.String(MAX_PRODUCER_GROUP_LENGTH), nullable=False),
        _created_at(),
        sa.PrimaryKeyConstraint(
            "transaction_id", "half_partition", "half_offset", name=f"{answers}_pkey"
        ),
        sa.Index(f"{answers}_at", "created_at"),
    )
    return metadata


_LOG_TIME = sa.DateTime(timezone=True).with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
"""On MySQL ``DATETIME(6)`` (revision 0005): a plain ``DATETIME`` keeps whole seconds."""

_PARKED_HALF = sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")
"""On MySQL ``LONGBLOB`` (revision 0005): a ``BLOB`` holds 64 KiB, less than a record."""


def _created_at() -> sa.Column[datetime]:
    return sa.Column(
        "created_at", _LOG_TIME, nullable=False, server_default=sa.func.current_timestamp()
    )


def transaction_log_table(table: str = DEFAULT_TABLE, schema: str | None = None) -> sa.Table:
    """The log table: one row per committed local transaction (or ROLLBACK answer) per id."""
    return _table_of(log_metadata(table, schema), LogTarget(table, schema).table, schema)


def rollback_table(table: str = DEFAULT_TABLE, schema: str | None = None) -> sa.Table:
    """Every ROLLBACK answer of a check-back, one row per half, beside the log table."""
    return _table_of(log_metadata(table, schema), LogTarget(table, schema).rollback_table, schema)


def _table_of(metadata: sa.MetaData, name: str, schema: str | None) -> sa.Table:
    return metadata.tables[f"{schema}.{name}" if schema else name]


Execute = Callable[[sa.Executable], sa.CursorResult[Any]]
"""``Session.execute`` or ``Connection.execute``: what :func:`upsert` runs its statements on."""

_MYSQL_DUPLICATE_KEY = 1062
"""MySQL's ``ER_DUP_ENTRY``, the one IntegrityError :func:`upsert` settles itself."""


def upsert(
    execute: Execute,
    table: sa.Table,
    dialect: str,
    values: dict[str, object],
    taken_over_when: sa.ColumnElement[bool],
    returning: Sequence[sa.ColumnElement[Any]] = (),
) -> sa.Row[Any] | bool:
    """Insert ``values``; on the same transaction id, overwrite the row only ``taken_over_when``.

    False: not written. Written: the row of the transaction id and ``returning``
    where the database returns rows, else True. The conflict is settled by the
    primary key, so a writer waits for another one's row still uncommitted and then
    sees it: PostgreSQL and SQLite in one ``ON CONFLICT`` statement; MySQL by an
    insert whose duplicate-key refusal (InnoDB waits for the other row's transaction
    first) is followed by an update of the committed row ``taken_over_when``. Other
    databases get a plain insert, which a present row refuses.
    """
    statement: Any
    if dialect == "postgresql":
        statement = postgresql.insert(table)
    elif dialect == "sqlite":
        statement = sqlite.insert(table)
    elif dialect in MYSQL_DIALECTS:
        return _mysql_upsert(execute, table, values, taken_over_when)
    else:
        execute(sa.insert(table).values(values))
        return True
    statement = (
        statement.values(values)
        .on_conflict_do_update(
            index_elements=[table.c.transaction_id],
            set_={name: statement.excluded[name] for name in values if name != "transaction_id"},
            where=taken_over_when,
        )
        .returning(table.c.transaction_id, *returning)
    )
    row = execute(statement).first()
    return False if row is None else row


def _mysql_upsert(
    execute: Execute,
    table: sa.Table,
    values: dict[str, object],
    taken_over_when: sa.ColumnElement[bool],
) -> bool:
    """MySQL's upsert in two statements (``ON DUPLICATE KEY UPDATE`` assigns column by
    column, each seeing the ones before it changed: one condition cannot guard them all).

    A duplicate key fails only the statement in InnoDB, never the transaction.
    """
    try:
        execute(sa.insert(table).values(values))
        return True
    except IntegrityError as exc:
        if getattr(exc.orig, "args", (None,))[0] != _MYSQL_DUPLICATE_KEY:
            raise
    update = (
        table.update()
        .where(table.c.transaction_id == values["transaction_id"], taken_over_when)
        .values({name: value for name, value in values.items() if name != "transaction_id"})
    )
    return bool(execute(update).rowcount)


def utc_from_timestamp(seconds: float) -> datetime:
    """Log times are UTC: SQLite stores the digits without an offset."""
    return datetime.fromtimestamp(seconds, UTC)


REVISION_0002_COLUMNS = ("half_partition", "half_offset", "rolled_back")
"""Added by revision 0002: a table without them was migrated by an older version."""

REVISION_0004_COLUMNS = ("parked_half", "drain_from_offset")
"""Added by revision 0004 (parked sends)."""


def table_exists(connection: Connection, target: LogTarget) -> bool:
    return sa.inspect(connection).has_table(target.table, schema=target.schema)


def missing_part(connection: Connection, target: LogTarget) -> str | None:
    """The first column or table this version writes that is missing (not yet upgraded)."""
    inspector = sa.inspect(connection)
    columns = {c["name"] for c in inspector.get_columns(target.table, target.schema)}
    column = next((name for name in REVISION_0002_COLUMNS if name not in columns), None)
    if column is not None:
        return f"column {column}"
    if not inspector.has_table(target.rollback_table, schema=target.schema):
        return f"its table {target.rollback_table}"
    column = next((name for name in REVISION_0004_COLUMNS if name not in columns), None)
    if column is not None:
        return f"column {column}"
    return None


def outdated_table_error(target: LogTarget, part: str, url: object) -> TransactionLogMissingError:
    shown, where = _database_named(url)
    return TransactionLogMissingError(
        f"transaction-log table {target.qualified!r}{where} lacks {part} "
        f"(migrated by an older version): run {target.upgrade_hint(shown)}"
    )


def missing_table_error(target: LogTarget, url: object) -> TransactionLogMissingError:
    shown, where = _database_named(url)
    return TransactionLogMissingError(
        f"transaction-log table {target.qualified!r} does not exist{where}: "
        f"run {target.upgrade_hint(shown)} first"
    )


_PRIVILEGE_SQLSTATE = "42501"
"""PostgreSQL's insufficient_privilege."""

_MYSQL_ACCESS_DENIED = frozenset({1044, 1142, 1143})
"""MySQL's database, table and column access denied (ER_DBACCESS_DENIED_ERROR,
ER_TABLEACCESS_DENIED_ERROR, ER_COLUMNACCESS_DENIED_ERROR)."""


def privilege_error(
    exc: Exception, target: LogTarget, url: object
) -> TransactionLogPrivilegeError | None:
    """The missing grant ``exc`` stands for, naming the log's tables, or None.

    Told by the server's own code (SQLSTATE 42501, MySQL's access-denied errors), never
    by the message's words, which differ by server version and language.
    """
    if not isinstance(exc, DBAPIError):
        return None
    orig = exc.orig
    code = getattr(orig, "args", (None,))[0] if orig is not None else None
    if getattr(orig, "sqlstate", None) != _PRIVILEGE_SQLSTATE and code not in _MYSQL_ACCESS_DENIED:
        return None
    _, where = _database_named(url)
    args = getattr(orig, "args", ())
    reason = str(args[1]) if code in _MYSQL_ACCESS_DENIED and len(args) > 1 else str(orig)
    user = getattr(url, "username", None)
    who = f"the database user {user!r}" if user else "the database user"
    tables = f"{target.qualified} and {target.rollback_table}"
    error = TransactionLogPrivilegeError(
        f"{who} may not use the transaction log{where} ({reason.strip().splitlines()[0]}): "
        f"grant it SELECT, INSERT, UPDATE and DELETE on {tables}"
    )
    error.__cause__ = exc
    return error


def _database_named(url: object) -> tuple[str | None, str]:
    """The database ``url`` as an error shows it (no password), and " in <it>" for a message."""
    shown = describe_url(url) if url is not None else None  # type: ignore[arg-type]
    return shown, f" in {shown}" if shown else ""


def require_table(connection: Connection, target: LogTarget) -> None:
    """Raise TransactionLogMissingError, naming the fix, unless the log table exists."""
    if not table_exists(connection, target):
        raise missing_table_error(target, connection.engine.url)


@dataclass(frozen=True)
class PruneResult:
    deleted: int
    """Log rows deleted."""
    batches: int
    """Short transactions the log rows took."""
    horizon: datetime
    rollback_answers_deleted: int = 0
    """Rows of ``<table>_rollback`` deleted (pruned by the same horizon, after the log)."""


def prune_transaction_log(
    engine: Engine,
    older_than: timedelta,
    *,
    batch_size: int = DEFAULT_PRUNE_BATCH,
    target: LogTarget | None = None,
    clock: Callable[[], float] = time.time,
    minimum_age: timedelta = MIN_PRUNE_AGE,
) -> PruneResult:
    """Delete log rows created before ``now - older_than``, ``batch_size`` rows at a time.

    Each batch is its own short transaction, so the service keeps inserting
    while this runs: new rows are younger than the horizon and never touched,
    and no lock is held for long. On PostgreSQL the batch skips rows another
    pruner has locked (``FOR UPDATE SKIP LOCKED``), so two pruners do not queue.
    ``older_than`` must be at least ``minimum_age``, see :data:`MIN_PRUNE_AGE`.
    """
    target = target or LogTarget()
    if batch_size < 1:
        raise ConfigurationError(f"batch size must be at least 1, got {batch_size}")
    if older_than < minimum_age:
        raise ConfigurationError(
            f"refusing to prune rows younger than {minimum_age}: a check-back for a "
            f"transaction whose row is gone answers ROLLBACK (asked for {older_than})"
        )
    horizon = utc_from_timestamp(clock()) - older_than
    table = transaction_log_table(target.table, target.schema)
    # A parked row is kept, however old, until the checker has drained it to Kafka.
    log_rows = _AgedOut(
        table, (table.c.transaction_id,), horizon, batch_size, (table.c.parked_half.is_(None),)
    )
    with connect(engine) as connection:
        require_table(connection, target)
        answers = rollback_table(target.table, target.schema)
        has_answers = sa.inspect(connection).has_table(answers.name, schema=target.schema)
        connection.rollback()  # the inspection began a transaction; each batch begins its own
        deleted, batches = _delete_in_batches(engine, connection, log_rows)
        answers_deleted = 0
        if has_answers:  # (a table at revision 0002 has none yet)
            key = (answers.c.transaction_id, answers.c.half_partition, answers.c.half_offset)
            answer_rows = _AgedOut(answers, key, horizon, batch_size)
            answers_deleted, _ = _delete_in_batches(engine, connection, answer_rows)
        return PruneResult(deleted, batches, horizon, answers_deleted)


def _delete_in_batches(engine: Engine, connection: Connection, rows: _AgedOut) -> tuple[int, int]:
    """Delete a batch of ``rows`` until a batch finds fewer rows: (rows deleted, batches)."""
    deleted = batches = 0
    while True:
        try:
            with connection.begin():
                count = rows.delete_batch(connection)
        except DBAPIError as exc:
            if exc.connection_invalidated:
                raise unavailable(engine, exc) from None
            raise
        batches += 1
        deleted += count
        if count < rows.batch_size:
            return deleted, batches


@dataclass(frozen=True)
class _AgedOut:
    """The rows of ``table`` created before ``horizon`` (and ``also``), ``batch_size`` a batch."""

    table: sa.Table
    key: tuple[sa.Column[Any], ...]
    horizon: datetime
    batch_size: int
    also: tuple[sa.ColumnElement[bool], ...] = ()

    def delete_batch(self, connection: Connection) -> int:
        """Delete one batch in the caller's transaction, skipping rows another pruner locked.

        MySQL takes no LIMIT in an IN subquery, nor a subquery of the table it deletes
        from: there the batch's keys are locked first, then deleted by value.
        """
        batch = (
            sa.select(*self.key)
            .where(self.table.c.created_at < self.horizon, *self.also)
            .limit(self.batch_size)
            .with_for_update(skip_locked=True)
        )
        keys: Any = batch
        if connection.dialect.name in MYSQL_DIALECTS:
            keys = [tuple(row) for row in connection.execute(batch)]
            if not keys:
                return 0
        return connection.execute(
            self.table.delete().where(sa.tuple_(*self.key).in_(keys))
        ).rowcount
