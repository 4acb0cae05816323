"""Engines from database URLs, with errors a person can act on.

SQLAlchemy's own errors for a mistyped URL (``NoSuchModuleError: Can't load
plugin: sqlalchemy.dialects:foo``) or a refused connection (a page of driver
text) do not say what to do; these do. Only the engines the outbox creates
itself (the ``outbox db`` commands, :meth:`SqlTransactionListener.from_url`)
go through here: an application's own engine is used as given.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Connection, Engine
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

from outbox.errors import ConfigurationError
from outbox.sql.errors import DatabaseUnavailableError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

DATABASE_URL_ENV = "OUTBOX_DATABASE_URL"
EXAMPLE_URLS = "sqlite:///outbox.db or postgresql+psycopg://USER:PASSWORD@HOST:5432/DB"
CONNECT_TIMEOUT_SECONDS = 10
"""libpq's default is to wait forever on a host that drops packets."""

# The project ships psycopg 3; a bare postgresql:// would mean psycopg2. Its mysql
# extra ships PyMySQL; a bare mysql:// or mariadb:// would mean mysqlclient.
_DRIVER_ALIASES = {
    "postgresql": "postgresql+psycopg",
    "postgres": "postgresql+psycopg",
    "mysql": "mysql+pymysql",
    "mariadb": "mariadb+pymysql",
}
# An asyncio engine's driver for a sync URL's. MySQL: asyncmy (aiomysql 0.3 sends no bytes
# parameter with PyMySQL >= 1.2.3, aio-libs/aiomysql#1080, and the log's halves are bytes).
_ASYNC_DRIVERS = {
    "sqlite": "sqlite+aiosqlite",
    "sqlite+pysqlite": "sqlite+aiosqlite",
    "mysql+pymysql": "mysql+asyncmy",
    "mariadb+pymysql": "mariadb+asyncmy",
}


def parse_url(url: str | URL) -> URL:
    """``url`` as a SQLAlchemy URL, ``postgresql://`` meaning the psycopg 3 driver."""
    if isinstance(url, URL):
        parsed = url
    else:
        if not isinstance(url, str) or not url.strip():
            raise ConfigurationError(
                f"no database URL: pass --url or set {DATABASE_URL_ENV}, e.g. {EXAMPLE_URLS}"
            )
        try:
            parsed = sa.make_url(url.strip())
        except ArgumentError:
            raise ConfigurationError(
                f"database URL {url!r} is not a URL; expected e.g. {EXAMPLE_URLS}"
            ) from None
    alias = _DRIVER_ALIASES.get(parsed.drivername)
    return parsed.set(drivername=alias) if alias else parsed


def describe_url(url: str | URL) -> str:
    """The URL with its password masked, for messages and logs."""
    try:
        return parse_url(url).render_as_string(hide_password=True)
    except ConfigurationError:
        return "<invalid URL>"


def create_engine(url: str | URL, **kwargs: Any) -> Engine:
    """An engine for ``url``; an unknown scheme or a missing driver is a ConfigurationError.

    No connection is made yet: use :func:`connect` for an error that says the
    database is unreachable.
    """
    parsed = parse_url(url)
    with _driver_errors(parsed):
        return sa.create_engine(parsed, **_engine_options(parsed, kwargs))


def create_async_engine(url: str | URL, **kwargs: Any) -> AsyncEngine:
    """An asyncio engine for ``url`` (for :class:`~outbox.sql.AsyncSqlTransactionListener`).

    The same URL as :func:`create_engine` serves: ``sqlite://`` means
    aiosqlite, ``postgresql://`` psycopg 3, whose async side SQLAlchemy picks
    for an asyncio engine, ``mysql://`` (PyMySQL) asyncmy; errors as
    :func:`create_engine`'s.
    """
    from sqlalchemy.ext.asyncio import create_async_engine as sa_create_async_engine

    parsed = parse_url(url)
    if parsed.drivername in _ASYNC_DRIVERS:
        parsed = parsed.set(drivername=_ASYNC_DRIVERS[parsed.drivername])
    with _driver_errors(parsed):
        return sa_create_async_engine(parsed, **_engine_options(parsed, kwargs))


def _engine_options(parsed: URL, kwargs: dict[str, Any]) -> dict[str, Any]:
    if parsed.get_backend_name() == "postgresql" and "connect_timeout" not in parsed.query:
        kwargs.setdefault("connect_args", {}).setdefault("connect_timeout", CONNECT_TIMEOUT_SECONDS)
    return kwargs


@contextmanager
def _driver_errors(parsed: URL) -> Iterator[None]:
    """An unknown scheme or a driver not installed, as a ConfigurationError naming the fix."""
    try:
        yield
    except NoSuchModuleError:
        raise ConfigurationError(
            f"unsupported database URL scheme {parsed.drivername!r} in {describe_url(parsed)}; "
            f"use e.g. {EXAMPLE_URLS}"
        ) from None
    except ImportError as exc:
        raise ConfigurationError(
            f"the driver for {parsed.drivername!r} is not installed ({exc}); for PostgreSQL "
            "install kafka-outbox[postgres] and use postgresql+psycopg://; for MySQL or "
            "MariaDB kafka-outbox[mysql] and mysql+pymysql://; for asyncio "
            "install kafka-outbox[async]"
        ) from None


def connect(engine: Engine) -> Connection:
    """``engine.connect()``, turning a refused or failed connection into one clear line."""
    try:
        return engine.connect()
    except DBAPIError as exc:
        raise unavailable(engine, exc) from None


def unavailable(engine: Engine, exc: BaseException) -> DatabaseUnavailableError:
    """A DatabaseUnavailableError for ``engine``, with the driver's first line of reason."""
    reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return DatabaseUnavailableError(
        f"cannot reach the database at {describe_url(engine.url)}: "
        f"{reason[0] if reason else type(exc).__name__}"
    )
