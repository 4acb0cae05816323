"""The Alembic migrations: up from empty, down, up again; custom names; from an installed copy."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.orm import sessionmaker

from outbox import LocalTransactionState, Message
from outbox.errors import ConfigurationError
from outbox.sql import (
    LogTarget,
    TransactionLogCheck,
    create_engine,
    current,
    downgrade,
    head_revision,
    upgrade,
)
from outbox.sql.log import transaction_log_table
from tests.sql.conftest import unique_name

REPO = Path(__file__).resolve().parents[2]


def outbox(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None):
    return subprocess.run(
        [sys.executable, "-m", "outbox", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=cwd,
    )


def tables(engine: sa.Engine, schema: str | None = None) -> set[str]:
    return set(sa.inspect(engine).get_table_names(schema=schema))


def drop(engine: sa.Engine, target: LogTarget) -> None:
    """Leave the shared PostgreSQL as found: downgrade to base keeps the version table."""
    with engine.begin() as connection:
        for name in (target.table, target.rollback_table, target.version_table):
            qualified = f"{target.schema}.{name}" if target.schema else name
            connection.execute(sa.text(f"DROP TABLE IF EXISTS {qualified}"))


def test_upgrade_downgrade_upgrade(database_url):
    engine = create_engine(database_url)
    target = LogTarget(unique_name("log"))
    head = head_revision()
    try:
        assert current(engine, target=target).current is None
        status = upgrade(engine, target=target)
        assert (status.current, status.at_head) == (head, True)
        assert {target.table, target.version_table} <= tables(engine)
        indexes = sa.inspect(engine).get_indexes(target.table)
        assert sorted(i["column_names"] for i in indexes) == [
            ["created_at"],
            ["half_partition", "created_at"],  # the parked rows' (partial: revision 0004)
        ]
        assert upgrade(engine, target=target).current == head  # idempotent

        assert target.rollback_table in tables(engine)

        status = downgrade(engine, "base", target=target)
        assert (status.current, status.at_head) == (None, False)
        assert not {target.table, target.rollback_table} & tables(engine)

        assert upgrade(engine, target=target).current == head
        assert current(engine, target=target).at_head
        assert target.table in tables(engine)
    finally:
        drop(engine, target)
        engine.dispose()


def test_migrated_table_matches_the_model(database_url):
    """The revisions and the table the listener queries must not drift apart."""
    engine = create_engine(database_url)
    target = LogTarget(unique_name("log"))
    try:
        upgrade(engine, target=target)
        model = transaction_log_table(target.table).metadata
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection,
                opts={"include_name": lambda name, kind, parent: _ours(name, kind, target)},
            )
            diff = compare_metadata(context, model)
        assert diff == [], diff
    finally:
        drop(engine, target)
        engine.dispose()


def _ours(name: str | None, kind: str, target: LogTarget) -> bool:
    """Compare the log's tables only: not the version table, nor other tests' tables."""
    return kind != "table" or name in (target.table, target.rollback_table)


@pytest.mark.postgres
def test_custom_table_and_schema_on_postgres(postgres_url):
    engine = create_engine(postgres_url)
    schema = f"s{uuid.uuid4().hex[:8]}"
    target = LogTarget("custom_log", schema)
    with engine.begin() as connection:
        connection.execute(sa.text(f"CREATE SCHEMA {schema}"))
    try:
        assert upgrade(engine, target=target).at_head
        assert tables(engine, schema) == {"custom_log", "custom_log_rollback", "custom_log_version"}
        assert "outbox_transaction_log" not in tables(engine)
        assert current(engine, target=target).at_head
        assert current(engine, target=LogTarget("custom_log")).current is None  # other schema
        downgrade(engine, "base", target=target)
        assert tables(engine, schema) == {"custom_log_version"}
    finally:
        with engine.begin() as connection:
            connection.execute(sa.text(f"DROP SCHEMA {schema} CASCADE"))
        engine.dispose()


@pytest.mark.postgres
def test_missing_schema_names_the_fix(postgres_url):
    with pytest.raises(ConfigurationError, match=r"schema 'nowhere' does not exist.*CREATE SCHEMA"):
        upgrade(postgres_url, target=LogTarget("custom_log", "nowhere"))


def test_cli_round_trip_with_a_custom_table(database_url):
    table = unique_name("log")
    env = {**os.environ, "OUTBOX_DATABASE_URL": database_url}
    engine = create_engine(database_url)
    try:
        before = outbox("db", "current", "--table", table, env=env)
        assert before.returncode == 1
        assert "none (no table yet" in before.stdout
        assert "outbox db upgrade --table " + table in before.stderr

        up = outbox("db", "upgrade", "--table", table, env=env)
        assert up.returncode == 0, up.stderr
        assert f"{table}: at revision {head_revision()} (head)" in up.stdout
        assert table in tables(engine)

        now = outbox("db", "current", "--table", table, env=env)
        assert now.returncode == 0, now.stderr
        assert now.stdout.strip() == f"{table}: {head_revision()} (head)"

        steps = (
            "at revision 0004",
            "at revision 0003",
            "at revision 0002",
            "at revision 0001",
            "none",
        )
        for step_back in steps:  # one step each
            down = outbox("db", "downgrade", "--table", table, env=env)
            assert down.returncode == 0, down.stderr
            assert step_back in down.stdout
        assert table not in tables(engine)

        again = outbox("db", "upgrade", "--table", table, env=env)
        assert again.returncode == 0, again.stderr
        assert table in tables(engine)
    finally:
        drop(engine, LogTarget(table))
        engine.dispose()


def test_migrations_work_from_an_installed_copy(tmp_path):
    """What a wheel carries (setuptools' build_py), run from elsewhere with no source tree."""
    source = tmp_path / "source"
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("outbox", "outbox_cli", "migrations", "checker", "spark_sink"):
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    build = tmp_path / "lib"
    setup = "from setuptools import setup; setup()"
    built = subprocess.run(
        [sys.executable, "-c", setup, "-q", "build_py", "--build-lib", str(build)],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert built.returncode == 0, built.stderr
    installed = build / "outbox_migrations"  # the repository's migrations/, by its unique name
    assert (installed / "script.py.mako").is_file()
    assert (installed / "env.py").is_file()
    assert list((installed / "versions").glob("0001_*.py"))

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(build)}
    where = subprocess.run(
        [sys.executable, "-c", "import outbox_migrations; print(outbox_migrations.__file__)"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert where.stdout.startswith(str(build)), (where.stdout, where.stderr)
    url = f"sqlite:///{tmp_path / 'installed.db'}"
    up = outbox("db", "upgrade", "--url", url, env=env, cwd=elsewhere)
    assert up.returncode == 0, up.stderr
    now = outbox("db", "current", "--url", url, env=env, cwd=elsewhere)
    assert now.returncode == 0, now.stderr
    assert "(head)" in now.stdout


def test_rows_from_before_the_half_identity_still_answer(database_url):
    """Revision 0002 adds the half's identity to the log; rows written under 0001 have none,
    and answer by id as they did; rows written since tell the halves of a reused id apart."""
    engine = create_engine(database_url)
    target = LogTarget(unique_name("log"))
    table = transaction_log_table(target.table)
    now = time.time()
    try:
        upgrade(engine, "0001", target=target)
        with engine.begin() as connection:
            connection.execute(
                sa.text(
                    f"INSERT INTO {target.table} (transaction_id, producer_group) "
                    "VALUES ('old', 'orders')"
                )
            )
        upgrade(engine, target=target)
        with engine.begin() as connection:
            connection.execute(
                sa.insert(table).values(
                    transaction_id="new", producer_group="orders", half_partition=1, half_offset=5
                )
            )
        check = TransactionLogCheck(sessionmaker(engine), target, clock=lambda: now)

        def answer(transaction_id: str, partition: int, offset: int) -> LocalTransactionState:
            born = int(now * 1000)
            return check.answer(
                Message(
                    "t",
                    b"v",
                    transaction_id=transaction_id,
                    born_ms=born,
                    half_partition=partition,
                    half_offset=offset,
                )
            )

        assert answer("old", 0, 3) is LocalTransactionState.COMMIT_MESSAGE
        assert answer("new", 1, 5) is LocalTransactionState.COMMIT_MESSAGE
        assert answer("new", 1, 9) is LocalTransactionState.ROLLBACK_MESSAGE
        assert answer("new", 0, 5) is LocalTransactionState.ROLLBACK_MESSAGE

        downgrade(engine, "0001", target=target)  # the rows stay, without their identity
        with engine.connect() as connection:
            ids = connection.execute(sa.text(f"SELECT transaction_id FROM {target.table}"))
            assert sorted(row[0] for row in ids) == ["new", "old"]
    finally:
        drop(engine, target)
        engine.dispose()
