"""The SQL transaction log: a listener for SQLAlchemy, its table, migrations, pruning.

The usual local transaction is a SQLAlchemy transaction. :class:`SqlTransactionListener`
runs the application's business function and inserts the transaction id into
the log table in that same transaction, so a check-back is a lookup;
:class:`AsyncSqlTransactionListener` does the same on SQLAlchemy's asyncio extension. The table
is created by the Alembic migrations in :mod:`migrations` (``outbox db upgrade``)
and kept small by :func:`prune_transaction_log` (``outbox db prune``).

Names are imported on first use: the ``outbox`` command line loads this package
for ``outbox db`` alone, and SQLAlchemy plus Alembic would slow every other
command's start.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "AsyncBusinessFunction": "async_listener",
    "AsyncSqlTransactionListener": "async_listener",
    "DATABASE_URL_ENV": "engine",
    "create_async_engine": "engine",
    "create_engine": "engine",
    "describe_url": "engine",
    "CommitOutcomeUnknownError": "errors",
    "DatabaseUnavailableError": "errors",
    "LocalTransactionMisuseError": "errors",
    "LocalTransactionTooSlowError": "errors",
    "LocalTransactionRolledBackByCheckError": "errors",
    "MigrationError": "errors",
    "TransactionLogError": "errors",
    "TransactionLogMissingError": "errors",
    "TransactionLogPrivilegeError": "errors",
    "JoinError": "errors",
    "DEFAULT_GRACE_SECONDS": "listener",
    "BusinessFunction": "listener",
    "SqlTransactionListener": "listener",
    "TransactionLogCheck": "listener",
    "TransactionLogRule": "listener",
    "DEFAULT_TABLE": "log",
    "MIN_PRUNE_AGE": "log",
    "LogTarget": "log",
    "PruneResult": "log",
    "prune_transaction_log": "log",
    "transaction_log_table": "log",
    "MigrationStatus": "migrate",
    "current": "migrate",
    "downgrade": "migrate",
    "head_revision": "migrate",
    "upgrade": "migrate",
}

__all__ = [
    "DATABASE_URL_ENV",
    "DEFAULT_GRACE_SECONDS",
    "DEFAULT_TABLE",
    "MIN_PRUNE_AGE",
    "AsyncBusinessFunction",
    "AsyncSqlTransactionListener",
    "BusinessFunction",
    "CommitOutcomeUnknownError",
    "DatabaseUnavailableError",
    "JoinError",
    "LocalTransactionMisuseError",
    "LocalTransactionRolledBackByCheckError",
    "LocalTransactionTooSlowError",
    "LogTarget",
    "MigrationError",
    "MigrationStatus",
    "PruneResult",
    "SqlTransactionListener",
    "TransactionLogCheck",
    "TransactionLogError",
    "TransactionLogMissingError",
    "TransactionLogPrivilegeError",
    "TransactionLogRule",
    "create_async_engine",
    "create_engine",
    "current",
    "describe_url",
    "downgrade",
    "head_revision",
    "prune_transaction_log",
    "transaction_log_table",
    "upgrade",
]

if TYPE_CHECKING:
    from outbox.sql.async_listener import AsyncBusinessFunction, AsyncSqlTransactionListener
    from outbox.sql.engine import (
        DATABASE_URL_ENV,
        create_async_engine,
        create_engine,
        describe_url,
    )
    from outbox.sql.errors import (
        CommitOutcomeUnknownError,
        DatabaseUnavailableError,
        JoinError,
        LocalTransactionMisuseError,
        LocalTransactionRolledBackByCheckError,
        LocalTransactionTooSlowError,
        MigrationError,
        TransactionLogError,
        TransactionLogMissingError,
        TransactionLogPrivilegeError,
    )
    from outbox.sql.listener import (
        DEFAULT_GRACE_SECONDS,
        BusinessFunction,
        SqlTransactionListener,
        TransactionLogCheck,
        TransactionLogRule,
    )
    from outbox.sql.log import (
        DEFAULT_TABLE,
        MIN_PRUNE_AGE,
        LogTarget,
        PruneResult,
        prune_transaction_log,
        transaction_log_table,
    )
    from outbox.sql.migrate import MigrationStatus, current, downgrade, head_revision, upgrade


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'outbox.sql' has no attribute {name!r}")
    value = getattr(import_module(f"outbox.sql.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
