"""One error tree: every error the installed packages raise on purpose is an ``OutboxError``.

A caller catches ``OutboxError`` to handle whatever the outbox refused or could
not do, and finds every type a public call raises exported from ``outbox``. The
command line prints exactly those as one ``outbox: error:`` line; anything else
(a bare ``ValueError`` from a bug) keeps its traceback, so the bug is seen.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
import typer

import outbox
from outbox.errors import OutboxError
from outbox.protocol import MalformedRecordError, ProtocolError
from outbox_cli.errors import run_program

INSTALLED = ("outbox", "outbox_checker", "spark_sink")


def _defined_errors() -> dict[str, type[BaseException]]:
    """Every exception class defined in a module of the installed packages, by its full name."""
    found: dict[str, type[BaseException]] = {}
    for name in INSTALLED:
        package = importlib.import_module(name)
        modules = [package.__name__]
        walked = pkgutil.walk_packages(package.__path__, f"{name}.")
        modules += [m.name for m in walked if not m.name.endswith(".__main__")]  # runs the CLI
        for module_name in modules:
            module = importlib.import_module(module_name)
            for value in vars(module).values():
                defined_here = inspect.isclass(value) and value.__module__ == module_name
                if defined_here and issubclass(value, BaseException):
                    found[f"{module_name}.{value.__qualname__}"] = value
    return found


def test_every_error_defined_is_an_outbox_error() -> None:
    errors = _defined_errors()
    assert "outbox_checker.errors.FencedError" in errors  # the walk reaches the checker
    outside = sorted(name for name, error in errors.items() if not issubclass(error, OutboxError))
    assert not outside, f"errors outside the OutboxError tree: {outside}"


def test_the_checkers_errors_live_in_one_module() -> None:
    elsewhere = sorted(
        name
        for name in _defined_errors()
        if name.startswith("outbox_checker.") and not name.startswith("outbox_checker.errors.")
    )
    assert not elsewhere, f"checker errors outside outbox_checker.errors: {elsewhere}"


def test_protocol_errors_are_outbox_errors_and_value_errors() -> None:
    assert issubclass(ProtocolError, OutboxError)
    assert issubclass(MalformedRecordError, ValueError)


def test_every_public_error_of_the_library_is_exported_from_outbox() -> None:
    """The library's own errors (the checker's and the sink's stay in their packages)."""
    library = {
        error.__name__
        for name, error in _defined_errors().items()
        if name.startswith("outbox.") and not error.__name__.startswith("_")
    }
    missing = sorted(name for name in library if getattr(outbox, name, None) is None)
    assert not missing, f"raised by the library but not exported from outbox: {missing}"
    unlisted = sorted(library - set(outbox.__all__))
    assert not unlisted, f"exported from outbox but not in __all__: {unlisted}"


def _program(error: Exception) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    def fail() -> None:
        raise error

    return app


def test_the_command_line_prints_an_outbox_error_as_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        run_program(_program(outbox.ConfigurationError("bad setting x")), [])
    assert exited.value.code == 1
    assert capsys.readouterr().err == "outbox: error: bad setting x\n"


@pytest.mark.parametrize("bug", [ValueError("a bug"), KeyError("a bug"), TypeError("a bug")])
def test_the_command_line_keeps_the_traceback_of_a_bug(bug: Exception) -> None:
    """Not an ``outbox: error:`` line that hides where it came from."""
    with pytest.raises(type(bug)):
        run_program(_program(bug), [])
