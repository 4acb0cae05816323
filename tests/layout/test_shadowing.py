"""A service's own ``migrations`` and ``checker`` packages never stand in for ours.

Flask-Migrate (and many an Alembic setup) keeps a ``migrations/`` package at the
service's root, and ``checker`` is as common a name. Python puts the directory a
program runs from first on ``sys.path`` (``python app.py``, ``python -m app``,
``python -c``), so a library that imports a bare ``migrations`` gets the
service's. Here a service directory holds both, each refusing to be imported,
and the library, its migrations and the command line run from there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

REFUSE = "raise ImportError(\"the service's own {name} package was imported, not the outbox's\")\n"


@pytest.fixture
def service(tmp_path: Path) -> Path:
    """A service's root: its own ``migrations`` (Flask-Migrate's layout) and ``checker``."""
    root = tmp_path / "service"
    for name in ("migrations", "checker"):
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text(REFUSE.format(name=name))
    (root / "migrations" / "env.py").write_text(REFUSE.format(name="migrations"))
    (root / "migrations" / "versions").mkdir()
    return root


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_the_library_migrates_with_its_own_scripts_from_a_service_root(service: Path) -> None:
    """``python -c`` puts the service's root first on ``sys.path``, as ``python app.py`` does."""
    url = f"sqlite:///{service / 'app.db'}"
    program = f"from outbox.sql import upgrade; print(upgrade({url!r}).current)"
    done = _run(["-c", program], service)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() != "None"
    assert "outbox_transaction_log" in sa.inspect(sa.create_engine(url)).get_table_names()


@pytest.mark.parametrize(
    "command",
    [["db", "upgrade", "--url", "sqlite:///cli.db"], ["checker", "--help"], ["status", "--help"]],
)
def test_the_command_line_uses_its_own_packages_from_a_service_root(
    service: Path, command: list[str]
) -> None:
    """``python -m outbox`` from the service's root: the outbox's migrations and checker."""
    done = _run(["-m", "outbox", *command], service)
    assert done.returncode == 0, done.stderr
    assert "service's own" not in done.stdout + done.stderr


def test_a_service_on_the_path_with_its_own_checker_runs_the_outbox_checker(service: Path) -> None:
    """A service that puts its root on ``PYTHONPATH`` (a container's usual setting) and runs
    the ``outbox`` console script beside its own code: the checker is installed under a name
    of its own (``outbox_checker``), so a service's ``checker`` package cannot stand in."""
    script = Path(sys.executable).with_name("outbox")
    done = subprocess.run(
        [str(script), "checker", "--help"],
        cwd=service,
        env={**os.environ, "PYTHONPATH": str(service)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "service's own" not in done.stdout + done.stderr
