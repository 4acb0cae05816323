"""The ``outbox`` command line: one entry point, its sub-commands declared by each package.

The core library (``outbox``) must not import the parts built on it (the checker,
the sink, the developer tooling), and a wheel of the library must work without
the tooling. So no module names the sub-commands: each distribution lists its
own in the ``kafka_outbox.commands`` entry-point group and this module, above
them all, joins the ones installed. An entry's name is the command path it adds
(``checker``, ``dev.spark``), its value a ``register(parent)`` function that adds
that one command or group to ``parent``.

Errors the outbox raises on purpose (bad settings, an unreachable cluster,
mismatched topics, malformed records) end the command with their message and
exit code 1, not a traceback (``OUTBOX_DEBUG=1`` shows it).

The package also holds what the commands share, out of the library a service
imports: the flags generated from settings objects (:mod:`outbox_cli.settings_flags`),
the connection and output options (:mod:`outbox_cli.options`), the one-line errors
(:mod:`outbox_cli.errors`), the console, and the core's own commands (``topics``,
``acls``, ``db``). The checker's and the sink's command modules import them, so the
command tree (:data:`app`) is built on first use, never while this package is imported.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from importlib.metadata import EntryPoint, entry_points

import typer

import outbox
from outbox_cli.errors import PlainErrorsGroup, run_program
from outbox_cli.help_layout import fold_long_names

COMMANDS_GROUP = "kafka_outbox.commands"

GROUP_HELP = {"dev": "Local runtimes for development and tests."}
"""Help of the groups several distributions add to (``dev kafka`` and ``dev spark``)."""


def _names(app: typer.Typer) -> set[str]:
    commands = {
        info.name or typer.main.get_command_name(info.callback.__name__)
        for info in app.registered_commands
        if info.callback is not None
    }
    return commands | {info.name for info in app.registered_groups if info.name}


def _group(groups: dict[tuple[str, ...], typer.Typer], path: tuple[str, ...]) -> typer.Typer:
    """The group at ``path``, created (with its parents) the first time an entry needs it."""
    if path not in groups:
        group = typer.Typer(help=GROUP_HELP.get(path[-1]), no_args_is_help=True)
        _group(groups, path[:-1]).add_typer(group, name=path[-1])
        groups[path] = group
    return groups[path]


def _print_version(asked: bool) -> None:
    if asked:
        print(f"outbox {outbox.__version__}")
        raise typer.Exit()


def _root(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print the installed kafka-outbox version and exit.",
    ),
) -> None:
    """The root's own options; its help text is the app's."""


def build_app(entries: Iterable[EntryPoint] | None = None) -> typer.Typer:
    """The ``outbox`` command with every installed package's sub-commands.

    Two packages claiming one name, or an entry that adds another name than its
    own, is an error at start-up rather than one command silently hiding the other.
    """
    fold_long_names()
    app = typer.Typer(
        name="outbox",
        help="Transactional outbox on Kafka: topics, checker, sink, and the installed tooling.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        cls=PlainErrorsGroup,
    )
    app.callback()(_root)
    groups: dict[tuple[str, ...], typer.Typer] = {(): app}
    found = entry_points(group=COMMANDS_GROUP) if entries is None else entries
    for entry in sorted(found, key=lambda e: (e.name.count("."), e.name)):
        *parents, name = entry.name.split(".")
        parent = _group(groups, tuple(parents))
        if name in _names(parent):
            raise RuntimeError(f"`outbox {entry.name.replace('.', ' ')}` is declared twice")
        register: Callable[[typer.Typer], None] = entry.load()
        register(parent)
        if name not in _names(parent):
            raise RuntimeError(f"{entry.value} (entry {entry.name!r}) did not add {name!r}")
    return app


@functools.cache
def _installed_app() -> typer.Typer:
    return build_app()


def __getattr__(name: str) -> typer.Typer:
    """``outbox_cli.app``: the ``outbox`` command with the installed sub-commands."""
    if name == "app":
        return _installed_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    run_program(_installed_app())
