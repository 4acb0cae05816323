"""Errors of the SQL transaction log, each naming the fix where there is one.

They derive from :class:`~outbox.errors.OutboxError`, so the ``outbox`` command
line prints them as one ``outbox: error: ...`` line and exits 1. A bad URL or
table name is an :class:`~outbox.errors.ConfigurationError` instead, like every
other invalid setting.
"""

from __future__ import annotations

from outbox.errors import CallerTransactionError, OutboxError


class TransactionLogError(OutboxError):
    """Base of the errors of :mod:`outbox.sql`."""


class DatabaseUnavailableError(TransactionLogError):
    """The database did not answer (refused, unreachable, authentication failed)."""


class TransactionLogMissingError(TransactionLogError):
    """The transaction-log table does not exist: the migrations were not run."""


class TransactionLogPrivilegeError(TransactionLogError):
    """The database user may not read or write the transaction log: a grant is missing.

    A service often runs as a user of its own, the migrations as another; the log's
    tables need SELECT, INSERT, UPDATE and DELETE for the service's user.
    """


class MigrationError(TransactionLogError):
    """Alembic could not run the requested migration (unknown revision, ...)."""


class CommitOutcomeUnknownError(TransactionLogError):
    """The database commit failed in a way that does not say whether it happened.

    Typically the connection was lost while COMMIT was in flight: the server may
    have committed before it went away. The transaction is left UNKNOW, and the
    check-back finds out from the log table.
    """


class LocalTransactionMisuseError(TransactionLogError):
    """The business function ended the database transaction the helper owns."""


class LocalTransactionTooSlowError(TransactionLogError):
    """The local transaction outlived the grace period, so it was rolled back.

    A check-back may already have found no log row and answered ROLLBACK for a
    half that old; committing now would leave a business row with no event.
    """


class LocalTransactionRolledBackByCheckError(TransactionLogError):
    """A check-back already answered ROLLBACK for this half, so it was rolled back.

    The check found no log row past the grace period (the local transaction was
    slower than it, or the checking host's clock runs ahead) and recorded its
    answer in the log; committing now would leave a change with no event.
    """


class JoinError(TransactionLogError, CallerTransactionError):
    """``txn.join(session)`` cannot put the log row into that session; nothing was joined.

    A :class:`~outbox.errors.CallerTransactionError` like every misuse of the form.
    """
