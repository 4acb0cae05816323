"""Fixtures of the command-line tests."""

from __future__ import annotations

import os

import pytest
import typer

import outbox.config
from outbox_checker.settings import CheckerSettings
from outbox_cli.settings_flags import settings_command


@pytest.fixture
def checker_runs(monkeypatch: pytest.MonkeyPatch) -> tuple[typer.Typer, list[CheckerSettings]]:
    """``outbox checker``'s flags on a command that records its settings instead of running,
    in an environment without ``OUTBOX_*`` variables (and no deprecation warned yet)."""
    for name in list(os.environ):
        if name.startswith("OUTBOX_"):
            monkeypatch.delenv(name)
    monkeypatch.setattr(outbox.config, "_warned", set())
    app = typer.Typer()
    runs: list[CheckerSettings] = []
    settings_command(app, "checker", CheckerSettings, runs.append, help="test")
    app.command("other")(lambda: None)  # two commands: typer keeps the group
    return app, runs
