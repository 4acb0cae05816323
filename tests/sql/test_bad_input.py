"""Bad input: each error names the problem and the fix, in the library and on the CLI."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.orm import sessionmaker

from outbox import LocalTransactionState
from outbox.errors import ConfigurationError
from outbox.sql import (
    DatabaseUnavailableError,
    LogTarget,
    SqlTransactionListener,
    TransactionLogMissingError,
    create_engine,
    current,
    describe_url,
    downgrade,
    prune_transaction_log,
    upgrade,
)
from tests.cli.support import outbox
from tests.sql.conftest import Database, execute_as_send, free_port, message, unique_name


def unreachable_pg() -> str:
    return f"postgresql+psycopg://postgres:secret@127.0.0.1:{free_port()}/outbox"


@pytest.fixture
def listener_on() -> Iterator[Callable[[str], SqlTransactionListener]]:
    """Listeners on a URL; their engines are disposed after the test (no leaked connections)."""
    engines: list[Engine] = []

    def make(url: str) -> SqlTransactionListener:
        engines.append(create_engine(url))
        return SqlTransactionListener(
            sessionmaker(engines[-1]),
            lambda s, m, a: None,
            group="orders",
            table="never_migrated_log",
        )

    yield make
    for engine in engines:
        engine.dispose()


# ---------------------------------------------------------------------- library


@pytest.mark.parametrize(
    "url,match",
    [
        ("foo://somewhere/db", r"unsupported database URL scheme 'foo'.*e\.g\. sqlite:///"),
        ("not a url", r"is not a URL; expected e\.g\. sqlite:///"),
        ("", r"no database URL: pass --url or set OUTBOX_DATABASE_URL"),
    ],
)
def test_bad_urls_are_configuration_errors(url, match):
    with pytest.raises(ConfigurationError, match=match):
        create_engine(url)
    with pytest.raises(ConfigurationError, match=match):
        upgrade(url)


def test_unreachable_database_is_one_clear_error(listener_on):
    url = unreachable_pg()
    started = time.monotonic()
    with pytest.raises(DatabaseUnavailableError, match=r"cannot reach the database at") as caught:
        upgrade(url)
    assert "secret" not in str(caught.value)
    assert time.monotonic() - started < 120  # refused at once: no retry loop
    with pytest.raises(DatabaseUnavailableError):
        listener_on(url).verify()


def test_plain_postgresql_scheme_means_psycopg():
    assert create_engine("postgresql://u@h/db").dialect.driver == "psycopg"


def test_password_never_shown():
    assert "secret" not in describe_url("postgresql+psycopg://u:secret@h/db")


@pytest.mark.parametrize(
    "table,schema",
    [("bad-name", None), ("x" * 49, None), ("1log", None), ("log", "bad schema")],
)
def test_bad_table_names_are_refused(table, schema):
    with pytest.raises(ConfigurationError, match="is not a valid name"):
        LogTarget(table, schema)


def test_missing_table_names_the_fix(database_url, listener_on):
    listener = listener_on(database_url)
    with pytest.raises(TransactionLogMissingError, match=r"run `outbox db upgrade .*--table"):
        listener.verify()
    # A send rolls back, and says why.
    state, error = execute_as_send(listener, message(), None)
    assert state is LocalTransactionState.ROLLBACK_MESSAGE
    assert isinstance(error, TransactionLogMissingError)
    assert "outbox db upgrade" in str(error)
    engine = create_engine(database_url)
    with pytest.raises(TransactionLogMissingError, match="outbox db upgrade"):
        prune_transaction_log(engine, timedelta(days=7), target=LogTarget("never_migrated_log"))
    engine.dispose()
    assert current(database_url, target=LogTarget("never_migrated_log")).current is None


def test_verify_passes_once_migrated(database: Database):
    database.listener().verify()


# ---------------------------------------------------------------------- command line


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert result.stderr.startswith("outbox: error: "), result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


@pytest.mark.parametrize("command", [["upgrade"], ["current"], ["prune", "--older-than", "7d"]])
def test_cli_unreachable_database(command):
    result = outbox("db", *command, "--url", unreachable_pg())
    assert_one_line_error(result, "cannot reach the database at", "Connection refused")
    assert "secret" not in result.stderr


def test_cli_wrong_scheme():
    result = outbox("db", "upgrade", "--url", "foo://somewhere/db")
    assert_one_line_error(result, "unsupported database URL scheme 'foo'", "postgresql+psycopg://")


def test_cli_missing_url():
    assert_one_line_error(outbox("db", "upgrade"), "pass --url URL or set OUTBOX_DATABASE_URL")


def test_cli_missing_table(database_url):
    result = outbox("db", "prune", "--older-than", "7d", "--table", "never_migrated_log",
                    OUTBOX_DATABASE_URL=database_url)  # fmt: skip
    assert_one_line_error(result, "'never_migrated_log' does not exist", "outbox db upgrade")
    status = outbox("db", "current", "--url", database_url)
    assert status.returncode == 1
    assert "run `outbox db upgrade`" in status.stderr


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["prune", "--older-than", "10m"], "refusing to prune rows younger than"),
        (["upgrade", "--table", "bad-name"], "is not a valid name"),
        (["upgrade", "--revision", "nonsense"], "nonsense"),
    ],
)
def test_cli_bad_options(sqlite_url, args, fragment):
    if args[0] == "prune":
        assert outbox("db", "upgrade", "--url", sqlite_url).returncode == 0
    assert_one_line_error(outbox("db", *args, "--url", sqlite_url), fragment)


@pytest.mark.parametrize(
    ("revision", "missing"), [("0001", "column half_partition"), ("0002", "its table {}_rollback")]
)
def test_a_log_table_at_an_older_revision_names_the_fix(database_url, revision, missing):
    """Code that records the half's identity, and keeps ROLLBACK answers per half, on a
    table migrated to an older revision."""
    engine = create_engine(database_url)
    target = LogTarget(unique_name("log"))
    upgrade(engine, revision, target=target)
    listener = SqlTransactionListener(
        sessionmaker(engine), lambda s, m, a: None, group="orders", table=target.table
    )
    try:
        with pytest.raises(
            TransactionLogMissingError, match=rf"lacks {missing.format(target.table)}.*up"
        ):
            listener.verify()
        sent = message()
        sent = sent.__class__(**{**sent.__dict__, "half_partition": 0, "half_offset": 1})
        state, error = execute_as_send(listener, sent, None)
        assert state is LocalTransactionState.ROLLBACK_MESSAGE
        assert isinstance(error, TransactionLogMissingError)
        assert "outbox db upgrade" in str(error)
    finally:
        downgrade(engine, "base", target=target)
        with engine.begin() as connection:
            connection.execute(sa.text(f"DROP TABLE IF EXISTS {target.version_table}"))
        engine.dispose()
