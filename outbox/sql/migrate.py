"""``outbox db upgrade|downgrade|current``: Alembic's Python API, configured in code.

No ``alembic.ini`` is needed: the Config is built here, with
``script_location`` pointing at the Alembic scripts (the repository's
``migrations/`` folder, installed as the package ``outbox_migrations``,
templates included), and the table name and schema passed through
``config.attributes``. The scripts are found by that unique name, never by a
bare ``migrations``: a service running from a root that holds its own
``migrations/`` (Flask-Migrate's layout) would get its own instead. The
connection is opened here too, so an unreachable database or a bad URL is one
clear error, not an Alembic traceback.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import pool
from sqlalchemy.engine import URL, Connection, Engine

import outbox_migrations
from outbox.errors import ConfigurationError
from outbox.sql.engine import connect, create_engine, describe_url
from outbox.sql.errors import MigrationError
from outbox.sql.log import LogTarget
from outbox.sql.migration_target import SCHEMA_ATTRIBUTE, TABLE_ATTRIBUTE

MIGRATIONS_DIR = Path(outbox_migrations.__file__).resolve().parent


@dataclass(frozen=True)
class MigrationStatus:
    """Where a database stands: its current revision (None: never migrated) and the head."""

    current: str | None
    head: str

    @property
    def at_head(self) -> bool:
        return self.current == self.head


def alembic_config(target: LogTarget, connection: Connection | None = None) -> Config:
    """An Alembic Config for the log ``target``; with ``connection``, runs on it."""
    config = Config()
    # ConfigParser interpolates '%': escape it in the path.
    config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    config.attributes[TABLE_ATTRIBUTE] = target.table
    config.attributes[SCHEMA_ATTRIBUTE] = target.schema
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config(LogTarget())).get_current_head()
    assert head is not None, f"no migrations found in {MIGRATIONS_DIR}"
    return head


def upgrade(
    database: str | URL | Engine,
    revision: str = "head",
    *,
    target: LogTarget | None = None,
) -> MigrationStatus:
    """Create or evolve the log table up to ``revision``; idempotent at the head."""
    target = target or LogTarget()

    def run(connection: Connection) -> None:
        _require_schema(connection, target)
        command.upgrade(alembic_config(target, connection), revision)

    return _migrate(database, target, run)


def downgrade(
    database: str | URL | Engine,
    revision: str = "-1",
    *,
    target: LogTarget | None = None,
) -> MigrationStatus:
    """Step back to ``revision`` (``-1``: one step; ``base``: drop the table and its rows)."""
    target = target or LogTarget()

    def run(connection: Connection) -> None:
        if _current(connection, target) is None:
            raise MigrationError(
                f"nothing to downgrade: {target.qualified} is at no revision in "
                f"{describe_url(connection.engine.url)}"
            )
        command.downgrade(alembic_config(target, connection), revision)

    return _migrate(database, target, run)


def current(database: str | URL | Engine, *, target: LogTarget | None = None) -> MigrationStatus:
    """The revision the database is at, and the head this package ships."""
    return _migrate(database, target or LogTarget(), lambda connection: None)


def _migrate(
    database: str | URL | Engine,
    target: LogTarget,
    run: Callable[[Connection], None],
) -> MigrationStatus:
    head = head_revision()
    with _engine(database) as engine, connect(engine) as connection:
        try:
            with connection.begin():
                run(connection)
        except CommandError as exc:
            raise MigrationError(f"{exc} (this package's head is {head})") from None
        with connection.begin():
            return MigrationStatus(_current(connection, target), head)


def _current(connection: Connection, target: LogTarget) -> str | None:
    context = MigrationContext.configure(
        connection,
        opts={"version_table": target.version_table, "version_table_schema": target.schema},
    )
    return context.get_current_revision()


def _require_schema(connection: Connection, target: LogTarget) -> None:
    """A missing schema is a setup step for the DBA; creating it unasked would surprise."""
    if target.schema is None:
        return
    if target.schema not in sa.inspect(connection).get_schema_names():
        raise ConfigurationError(
            f"schema {target.schema!r} does not exist in {describe_url(connection.engine.url)}: "
            f"create it first (CREATE SCHEMA {target.schema}), or leave out --schema"
        )


@contextmanager
def _engine(database: str | URL | Engine) -> Iterator[Engine]:
    """The caller's engine as is, or one made for this command and disposed after it."""
    if isinstance(database, Engine):
        yield database
        return
    engine = create_engine(database, poolclass=pool.NullPool)
    try:
        yield engine
    finally:
        engine.dispose()
