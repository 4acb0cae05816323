"""Pruning: rows older than the horizon go, in bounded batches; younger rows stay."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
import sqlalchemy as sa

from outbox import LocalTransactionState
from outbox.durations import DurationError, parse_duration
from outbox.errors import ConfigurationError
from outbox.sql import prune_transaction_log
from outbox.sql.log import rollback_table
from tests.sql.conftest import Database, execute_as_send, message

DAY = 86400.0


@pytest.fixture
def listener_kind() -> str:
    """Pruning is the same whichever listener wrote the rows: the sync one writes them here."""
    return "sync"


def write_rows(database: Database, count: int, age_seconds: float) -> set[str]:
    """``count`` committed transactions whose log rows are ``age_seconds`` old."""
    created = time.time() - age_seconds
    listener = database.listener(clock=lambda: created)
    ids = set()
    for _ in range(count):
        msg = message(born_ms=int(created * 1000))
        assert execute_as_send(listener, msg, {"id": msg.transaction_id})[0] is (
            LocalTransactionState.COMMIT_MESSAGE
        )
        ids.add(msg.transaction_id)
    return ids


@pytest.mark.parametrize("old_count,batches", [(10, 4), (9, 4), (0, 1)])
def test_old_rows_are_deleted_in_batches_young_rows_kept(database: Database, old_count, batches):
    write_rows(database, old_count, 10 * DAY)
    young = write_rows(database, 5, 1 * DAY)
    result = prune_transaction_log(
        database.engine, timedelta(days=7), batch_size=3, target=database.target
    )
    # 10 rows: 3+3+3+1. 9 rows: 3+3+3, then an empty batch says it is over.
    assert (result.deleted, result.batches) == (old_count, batches)
    assert set(database.log_rows()) == young
    assert len(database.order_rows()) == old_count + 5  # business rows are the app's own


def test_kept_rollback_answers_are_pruned_by_the_same_horizon(database: Database):
    """Each ROLLBACK answer is kept per half in ``<table>_rollback``: it ages out too."""
    answers = []
    for age in (10 * DAY, 1 * DAY):
        checked = time.time() - age
        half = message(born_ms=int((checked - 3600) * 1000))
        half = half.__class__(**{**half.__dict__, "half_partition": 0, "half_offset": len(answers)})
        checker = database.listener(clock=lambda checked=checked: checked)
        assert checker.check_local_transaction(half) is LocalTransactionState.ROLLBACK_MESSAGE
        answers.append(half)
    result = prune_transaction_log(database.engine, timedelta(days=7), target=database.target)
    assert (result.deleted, result.rollback_answers_deleted) == (1, 1)
    kept = rollback_table(database.target.table, database.target.schema)
    with database.engine.connect() as connection:
        rows = connection.execute(sa.select(kept.c.transaction_id)).scalars().all()
    assert rows == [answers[1].transaction_id]  # the younger answer is kept


def test_cli_prune_deletes_old_rows(database: Database):
    write_rows(database, 4, 8 * DAY)
    write_rows(database, 2, 60)
    options = ["--batch-size", "3", "--table", database.target.table, "--url", database.url]
    result = subprocess.run(
        [sys.executable, "-m", "outbox", "db", "prune", "--older-than", "7d", *options],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("deleted 4 rows older than 7d")
    assert "in 2 batches" in result.stdout
    assert len(database.log_rows()) == 2


@pytest.mark.postgres
def test_prune_while_the_service_writes(pg_database: Database):
    """Batches are short transactions: concurrent sends neither fail nor lose their rows."""
    database = pg_database
    write_rows(database, 300, 10 * DAY)
    listener = database.listener()
    stop = threading.Event()
    written: list[str] = []
    failures: list[object] = []

    def keep_writing() -> None:
        while not stop.is_set():
            msg = message()
            state, error = execute_as_send(listener, msg, {"id": msg.transaction_id})
            if state is LocalTransactionState.COMMIT_MESSAGE:
                written.append(msg.transaction_id)  # type: ignore[arg-type]
            else:
                failures.append(error)

    writers = [threading.Thread(target=keep_writing) for _ in range(2)]
    for writer in writers:
        writer.start()
    try:
        result = prune_transaction_log(
            database.engine, timedelta(days=7), batch_size=7, target=database.target
        )
    finally:
        stop.set()
        for writer in writers:
            writer.join(30)
    assert failures == []
    assert result.deleted == 300
    assert written and set(database.log_rows()) == set(written)


@pytest.mark.parametrize(
    "text,expected",
    [
        ("72h", timedelta(hours=72)),
        ("7d", timedelta(days=7)),
        ("1d12h", timedelta(days=1, hours=12)),
        ("90m", timedelta(minutes=90)),
        ("2w", timedelta(weeks=2)),
        ("3600s", timedelta(hours=1)),
        ("1.5h", timedelta(minutes=90)),
    ],
)
def test_durations(text, expected):
    """``--older-than`` reads the one duration syntax, with a unit always."""
    assert timedelta(seconds=parse_duration(text, unit=None)) == expected


@pytest.mark.parametrize("text", ["", "7", "h", "7x", "-1d", "7d junk"])
def test_bad_durations_name_the_format(text):
    with pytest.raises(DurationError, match=r"\(use 500ms, 10s, 5m, 1d12h\)"):
        parse_duration(text, unit=None)


def test_too_short_horizon_is_refused(database: Database):
    """A check-back for a half whose row was pruned would answer ROLLBACK."""
    with pytest.raises(ConfigurationError, match="refusing to prune rows younger than 1:00:00"):
        prune_transaction_log(database.engine, timedelta(minutes=5), target=database.target)
