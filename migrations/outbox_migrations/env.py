"""Alembic environment of the outbox transaction log.

``outbox db upgrade|downgrade|current`` run it with an open connection in
``config.attributes["connection"]`` and the table in ``config.attributes``. It
also works under the plain ``alembic`` command, with a config file whose
``script_location`` points here (``outbox_migrations:`` once installed) and
``-x url=URL [-x table=NAME] [-x schema=NAME]``.

The version table is ``<table>_version``, never ``alembic_version``: the
application's own Alembic history usually lives in the same database.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import pool
from sqlalchemy.engine import Connection

from outbox.sql.engine import create_engine
from outbox.sql.migration_target import resolve

config = context.config
x_arguments = context.get_x_argument(as_dictionary=True)
target = resolve(config, x_arguments)


def _url() -> str:
    url = x_arguments.get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database URL: pass -x url=URL or set sqlalchemy.url")
    return url


def _configure(**kwargs: object) -> None:
    context.configure(
        version_table=target.version_table,
        version_table_schema=target.schema,
        **kwargs,  # type: ignore[arg-type]
    )


def run_migrations_offline() -> None:
    """``--sql``: print the DDL instead of running it."""
    _configure(url=_url(), literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def _run_on(connection: Connection) -> None:
    _configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_on(connection)
        return
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.begin() as own_connection:
        _run_on(own_connection)


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
