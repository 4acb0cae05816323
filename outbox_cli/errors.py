"""How an ``outbox`` command ends on an error: whole lines on stderr, never a cut box.

Typer draws usage errors (a bad flag value, a missing file) in a rich panel as
wide as the terminal: in 80 columns, in a CI log or in a narrow pane it cut the
message with an ellipsis or folded it inside the box, so the path or value the
user needed was gone. Here they are printed the way click prints them, as plain
lines the terminal wraps without losing a character; the outbox's own errors
(bad settings, an unreachable cluster) are one ``outbox: error:`` line.
Help screens keep typer's rich layout.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import typer
from typer.core import TyperGroup

from outbox.errors import OutboxError

EXPECTED_ERRORS = (OutboxError,)
"""Errors raised on purpose with a message for the user: ours only (settings that fail
validation become a ``ConfigurationError``). Anything else, a bare ``ValueError`` too,
is a bug and keeps its traceback."""


def _exit_with_plain_errors(main: Callable[..., Any], *args: Any, **extra: Any) -> NoReturn:
    """Run a click ``main`` in non-standalone mode and end the process as standalone
    mode would, but with click's plain error text instead of typer's panel."""
    try:
        code = main(*args, standalone_mode=False, **extra)
    except typer.TyperException as exc:
        show = getattr(exc, "show", None)  # every usage error has one; the base class not
        if show is not None:
            show()
        else:
            print(f"Error: {exc.format_message()}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except typer.Abort:
        print("Aborted!", file=sys.stderr)
        sys.exit(1)
    # Non-standalone mode returns an Exit's code, or the command's (None) result.
    sys.exit(code if isinstance(code, int) else 0)


class PlainErrorsGroup(TyperGroup):
    """The root command group: usage errors as whole lines (see the module docstring)."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        extra["windows_expand_args"] = windows_expand_args
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        _exit_with_plain_errors(super().main, args, prog_name, complete_var, **extra)


def run_program(
    app: typer.Typer, args: Sequence[str] | None = None, prog_name: str | None = None
) -> None:
    """A program's entry point: usage errors whole, the outbox's own errors as one
    ``outbox: error:`` line and exit code 1 (``OUTBOX_DEBUG=1`` shows the traceback)."""
    command = typer.main.get_command(app)
    try:
        _exit_with_plain_errors(command.main, args, prog_name)
    except EXPECTED_ERRORS as exc:
        if os.environ.get("OUTBOX_DEBUG"):
            raise
        print(f"outbox: error: {exc}", file=sys.stderr)
        sys.exit(1)
