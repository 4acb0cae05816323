"""The one ``outbox`` command is joined from what each installed distribution declares.

With the tooling installed (``make install``) every command exists, as before
the tooling moved out of the library; a wheel of the library alone has the
library's commands and no tooling. A name two packages claim, or an entry that
adds another command than its name says, fails at start-up instead of one
command silently replacing the other.
"""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import pytest
import typer

from outbox_cli import COMMANDS_GROUP, build_app

EVERY_COMMAND = {
    ("topics", "create"),
    ("topics", "describe"),
    ("acls", "print"),
    ("db", "upgrade"),
    ("db", "downgrade"),
    ("db", "current"),
    ("db", "prune"),
    ("checker",),
    ("status",),
    ("discard", "list"),
    ("discard", "resume"),
    ("acls", "print"),
    ("sink",),
    ("dev", "spark", "fetch"),
    ("dev", "kafka", "start"),
    ("dev", "kafka", "stop"),
    ("dev", "kafka", "status"),
    ("dev", "kafka", "fetch"),
    ("demo",),
    ("chaos",),
    ("config-reference",),
}
TOOLING = {path for path in EVERY_COMMAND if path[0] in ("demo", "chaos", "config-reference")}
TOOLING |= {path for path in EVERY_COMMAND if path[:2] == ("dev", "kafka")}


def _paths(command: Any, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    children = getattr(command, "commands", None)
    if not children:
        return {prefix}
    return {path for name, child in children.items() for path in _paths(child, (*prefix, name))}


def _commands(app: typer.Typer) -> set[tuple[str, ...]]:
    return _paths(typer.main.get_command(app))


def test_with_the_tooling_installed_every_command_exists() -> None:
    assert _commands(build_app()) == EVERY_COMMAND


def test_the_library_alone_has_its_own_commands_and_no_tooling() -> None:
    library = [e for e in entry_points(group=COMMANDS_GROUP) if e.dist.name == "kafka-outbox"]
    assert _commands(build_app(library)) == EVERY_COMMAND - TOOLING


def _entry(name: str, value: str) -> EntryPoint:
    return EntryPoint(name=name, value=value, group=COMMANDS_GROUP)


def test_a_name_declared_twice_is_an_error() -> None:
    twice = [_entry("topics", "outbox_cli.topics:register")] * 2
    with pytest.raises(RuntimeError, match="`outbox topics` is declared twice"):
        build_app(twice)


def test_an_entry_adding_another_name_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="did not add 'tables'"):
        build_app([_entry("tables", "outbox_cli.topics:register")])


def test_version_is_the_installed_distributions() -> None:
    """``outbox --version`` and ``outbox.__version__`` both say what pip installed."""
    from importlib.metadata import version

    import outbox

    installed = version("kafka-outbox")
    assert outbox.__version__ == installed
    shown = subprocess.run(
        [sys.executable, "-m", "outbox", "--version"], capture_output=True, text=True
    )
    assert (shown.returncode, shown.stdout, shown.stderr) == (0, f"outbox {installed}\n", "")


def _command(path: tuple[str, ...]) -> Any:
    command = typer.main.get_command(build_app())
    for name in path:
        command = command.commands[name]
    return command


@pytest.mark.parametrize(
    "path",
    [
        ("checker",),
        ("sink",),
        ("status",),
        ("discard", "list"),
        ("discard", "resume"),
        ("topics", "create"),
        ("topics", "describe"),
        ("acls", "print"),
    ],
)
def test_every_command_spells_the_connection_alike(path: tuple[str, ...]) -> None:
    """``--bootstrap-servers`` and ``--topic-prefix`` everywhere, the short spellings as
    aliases, each with the same variable: a flag that works in one command works in all."""
    options = {
        name: parameter
        for parameter in _command(path).params
        for name in getattr(parameter, "opts", ())
    }
    assert options["--topic-prefix"] is options["--prefix"]
    assert options["--topic-prefix"].envvar in (
        "OUTBOX_TOPIC_PREFIX",
        ["OUTBOX_SINK_TOPIC_PREFIX", "OUTBOX_TOPIC_PREFIX"],
    )
    if path != ("acls", "print"):  # prints rules; talks to no cluster
        assert options["--bootstrap-servers"] is options["--bootstrap"]
