"""``outbox db upgrade|downgrade|current|prune``: the transaction-log table from a shell.

SQLAlchemy and Alembic are imported inside the commands, so that other
``outbox`` commands do not pay for them at start-up.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from outbox.config import renamed_variable
from outbox.durations import format_duration
from outbox.errors import ConfigurationError
from outbox_cli.settings_flags import duration_option

if TYPE_CHECKING:
    from outbox.sql.log import LogTarget

db_app = typer.Typer(
    help="The SQL transaction log: its migrations (Alembic) and pruning.",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    """Add ``db`` to the ``outbox`` command line."""
    app.add_typer(db_app, name="db")


UrlOption = Annotated[
    str | None,
    typer.Option(
        "--url",
        envvar="OUTBOX_DATABASE_URL",
        help="SQLAlchemy database URL, e.g. sqlite:///outbox.db or"
        " postgresql+psycopg://USER:PASSWORD@HOST:5432/DB.",
        show_default=False,
    ),
]
TableOption = Annotated[
    str | None,
    typer.Option(
        "--table",
        envvar="OUTBOX_DB_TABLE",
        help="Name of the transaction-log table (default: outbox_transaction_log).",
        show_default=False,
    ),
]
SchemaOption = Annotated[
    str | None,
    typer.Option(
        "--schema",
        envvar="OUTBOX_DB_SCHEMA",
        help="Schema of the table (PostgreSQL); default: the connection's search path.",
        show_default=False,
    ),
]


def _require_url(url: str | None) -> str:
    if not url or not url.strip():
        raise ConfigurationError(
            "no database: pass --url URL or set OUTBOX_DATABASE_URL, e.g. "
            "sqlite:///outbox.db or postgresql+psycopg://USER:PASSWORD@HOST:5432/DB"
        )
    return url


def _target(table: str | None, schema: str | None) -> LogTarget:
    from outbox.sql.log import DEFAULT_TABLE, LogTarget

    table = table or renamed_variable("OUTBOX_DB_TABLE")
    schema = schema or renamed_variable("OUTBOX_DB_SCHEMA")
    return LogTarget(table or DEFAULT_TABLE, schema or None)


@contextmanager
def _database_errors() -> Iterator[None]:
    """A database error the commands did not foresee (a privilege, a lock) as one line."""
    from sqlalchemy.exc import SQLAlchemyError

    from outbox.sql.errors import TransactionLogError

    try:
        yield
    except SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        raise TransactionLogError(f"database error: {reason[0] if reason else exc!r}") from None


def _migrate(
    step: Literal["upgrade", "downgrade"],
    revision: str,
    url: str | None,
    table: str | None,
    schema: str | None,
) -> None:
    """Run ``upgrade`` or ``downgrade`` to ``revision`` and say where the table ends up."""
    from outbox.sql import migrate
    from outbox.sql.engine import describe_url

    url = _require_url(url)
    target = _target(table, schema)
    with _database_errors():
        status = getattr(migrate, step)(url, revision, target=target)
    typer.echo(f"{target.qualified}: at revision {_describe(status)} in {describe_url(url)}")


@db_app.command()
def upgrade(
    revision: Annotated[
        str, typer.Option("--revision", help="Target revision; the newest by default.")
    ] = "head",
    url: UrlOption = None,
    table: TableOption = None,
    schema: SchemaOption = None,
) -> None:
    """Create or evolve the transaction-log table (idempotent)."""
    _migrate("upgrade", revision, url, table, schema)


@db_app.command()
def downgrade(
    revision: Annotated[
        str,
        typer.Option(
            "--revision", help="Target revision: -1 is one step back; base drops the table."
        ),
    ] = "-1",
    url: UrlOption = None,
    table: TableOption = None,
    schema: SchemaOption = None,
) -> None:
    """Step the transaction-log table back (base: drop it, with its rows)."""
    _migrate("downgrade", revision, url, table, schema)


@db_app.command()
def current(url: UrlOption = None, table: TableOption = None, schema: SchemaOption = None) -> None:
    """Show the table's revision; exits 1 unless it is at the head."""
    from outbox.sql import migrate

    url = _require_url(url)
    target = _target(table, schema)
    with _database_errors():
        status = migrate.current(url, target=target)
    typer.echo(f"{target.qualified}: {_describe(status)}")
    if not status.at_head:
        typer.echo(
            f"error: {target.qualified} is not at the head revision {status.head}: "
            f"run {target.upgrade_hint()}",
            err=True,
        )
        raise typer.Exit(1)


@db_app.command()
def prune(
    older_than: Annotated[
        float,
        duration_option(
            "--older-than",
            envvar="OUTBOX_PRUNE_OLDER_THAN",
            help="Delete rows older than this, at least 1h",
            unit=None,
            show_default=False,
        ),
    ],
    batch_size: Annotated[
        int,
        typer.Option("--batch-size", min=1, help="Rows deleted per database transaction."),
    ] = 1000,
    url: UrlOption = None,
    table: TableOption = None,
    schema: SchemaOption = None,
) -> None:
    """Delete old transaction-log rows in short batches; safe while the service writes."""
    from outbox.sql.engine import create_engine
    from outbox.sql.log import prune_transaction_log

    horizon = timedelta(seconds=older_than)
    url = _require_url(url)
    target = _target(table, schema)
    engine = create_engine(url)
    try:
        with _database_errors():
            result = prune_transaction_log(engine, horizon, batch_size=batch_size, target=target)
    finally:
        engine.dispose()
    typer.echo(
        f"deleted {result.deleted} rows older than {format_duration(older_than)} "
        f"(created before {result.horizon:%Y-%m-%d %H:%M:%S} UTC) from {target.qualified} "
        f"in {result.batches} batches"
        + (
            f", and {result.rollback_answers_deleted} kept ROLLBACK answers"
            if result.rollback_answers_deleted
            else ""
        )
    )


def _describe(status: object) -> str:
    from outbox.sql.migrate import MigrationStatus

    assert isinstance(status, MigrationStatus)
    if status.current is None:
        return f"none (no table yet; head is {status.head})"
    if status.at_head:
        return f"{status.current} (head)"
    return f"{status.current} (head is {status.head})"
