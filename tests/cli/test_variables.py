"""One variable per setting, whoever reads it; the replaced names still work, with a warning.

``outbox db`` read the transaction-log table from ``OUTBOX_TRANSACTION_LOG_TABLE``
and the checker from ``OUTBOX_DB_TABLE``; the checker's group was
``OUTBOX_CONSUMER_GROUP`` though its flag is ``--checker-group``. A deployment that
set the old names must keep working: the old one is read while the new one is unset.
"""

from __future__ import annotations

import logging
import sqlite3
import subprocess
from pathlib import Path

from typer.testing import CliRunner

from outbox.config import RENAMED_VARIABLES
from outbox_checker.settings import CheckerSettings
from tests.cli.support import outbox


def db_upgrade(database: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return outbox("db", "upgrade", "--url", f"sqlite:///{database}", **env)


def tables(database: Path) -> set[str]:
    """The log tables created, each named by its log (``<log>_rollback`` names ``<log>``)."""
    with sqlite3.connect(database) as connection:
        rows = connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        return {name.removesuffix("_rollback") for (name,) in rows if not name.endswith("_version")}


def test_db_reads_the_table_from_the_checkers_variable(tmp_path: Path):
    result = db_upgrade(tmp_path / "log.db", OUTBOX_DB_TABLE="shared_log")
    assert result.returncode == 0, result.stderr
    assert tables(tmp_path / "log.db") == {"shared_log"}
    assert "deprecated" not in result.stderr


def test_db_still_reads_the_old_table_variable_with_a_warning(tmp_path: Path):
    result = db_upgrade(tmp_path / "log.db", OUTBOX_TRANSACTION_LOG_TABLE="legacy_log")
    assert result.returncode == 0, result.stderr
    assert tables(tmp_path / "log.db") == {"legacy_log"}
    assert "OUTBOX_TRANSACTION_LOG_TABLE is deprecated" in result.stderr
    assert "OUTBOX_DB_TABLE" in result.stderr


def test_the_new_variable_wins_over_the_old(tmp_path: Path):
    result = db_upgrade(
        tmp_path / "log.db", OUTBOX_DB_TABLE="shared_log", OUTBOX_TRANSACTION_LOG_TABLE="legacy"
    )
    assert result.returncode == 0, result.stderr
    assert tables(tmp_path / "log.db") == {"shared_log"}
    assert "deprecated" not in result.stderr


def run_checker(checker_runs, *args: str, **env: str) -> CheckerSettings:
    app, runs = checker_runs
    result = CliRunner().invoke(app, ["checker", "--bootstrap-servers", "h:1", *args], env=env)
    assert result.exit_code == 0, result.output
    return runs[-1]


def test_checker_reads_every_old_name_while_the_new_one_is_unset(checker_runs, caplog):
    caplog.set_level(logging.WARNING, "outbox.config")
    old = {RENAMED_VARIABLES[new]: f"old_{n}" for n, new in enumerate(RENAMED_VARIABLES)}
    settings = run_checker(checker_runs, **old)
    assert (settings.checker_group, settings.db_table, settings.db_schema) == (
        "old_0",
        "old_1",
        "old_2",
    )
    warned = " ".join(record.getMessage() for record in caplog.records)
    for old_name, new_name in ((v, k) for k, v in RENAMED_VARIABLES.items()):
        assert f"{old_name} is deprecated (read as {new_name} is unset)" in warned


def test_checker_new_names_and_flags_win(checker_runs, caplog):
    caplog.set_level(logging.WARNING, "outbox.config")
    both = {"OUTBOX_CHECKER_GROUP": "new", "OUTBOX_CONSUMER_GROUP": "old"}
    assert run_checker(checker_runs, **both).group_id == "new"
    flag = run_checker(checker_runs, "--checker-group", "flag", **both)
    assert flag.group_id == "flag"
    assert "deprecated" not in caplog.text


def test_every_renamed_variable_is_the_one_a_setting_reads():
    """A new name no settings object or command reads would leave the old one dead."""
    from outbox.config import env_names

    read = {env_names(CheckerSettings, name)[0] for name in CheckerSettings.model_fields}
    assert set(RENAMED_VARIABLES) <= read
