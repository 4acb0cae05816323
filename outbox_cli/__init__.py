"""The ``outbox`` command line: one entry point, one sub-command group per part.

Errors the outbox raises on purpose (bad settings, an unreachable cluster,
mismatched topics, malformed records) end the command with their message and
exit code 1, not a traceback (``OUTBOX_DEBUG=1`` shows it).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from checker.cli import register as register_checker
from checker.discard import register as register_discard
from checker.status import register as register_status
from outbox.cli_errors import PlainErrorsGroup, run_program
from outbox.settings_cli import settings_command
from outbox.sql.cli import db_app
from outbox.topics_cli import topics_app
from outbox_devtools import config_reference
from outbox_devtools.chaos.settings import ChaosSettings
from outbox_devtools.kafka_cli import kafka_app
from spark_sink.cli import register as register_sink
from spark_sink.cli import spark_app

app = typer.Typer(
    name="outbox",
    help="Transactional outbox on Kafka: topics, local runtimes, checker, sink.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    cls=PlainErrorsGroup,
)
app.add_typer(topics_app, name="topics")
register_checker(app)
register_status(app)
register_discard(app)
app.add_typer(db_app, name="db")

dev_app = typer.Typer(help="Local runtimes for development and tests.", no_args_is_help=True)
dev_app.add_typer(kafka_app, name="kafka")
dev_app.add_typer(spark_app, name="spark")
app.add_typer(dev_app, name="dev")
register_sink(app)


@app.command()
def demo() -> None:
    """Run the main job end to end on embedded defaults (local Kafka broker)."""
    from outbox_devtools.demo import main as demo_main

    demo_main()


def _run_chaos(settings: ChaosSettings) -> None:
    from outbox.console import make_console
    from outbox_devtools.chaos.run import run as run_chaos

    sys.exit(run_chaos(make_console(), settings))


settings_command(
    app,
    "chaos",
    ChaosSettings,
    _run_chaos,
    help="Run the pipeline under seeded faults (kill -9 of producers, of a producer answering"
    " a check, of one or every checker replica; broker restarts) and verify every commit is"
    " published once, nothing committed is lost and nothing rolled back is visible.",
    log_level="WARNING",
)


@app.command("config-reference")
def config_reference_command(
    write: Annotated[
        Path | None,
        typer.Option(
            "--write",
            exists=True,
            dir_okay=False,
            writable=True,
            help="Rewrite the section between the config-reference markers of this Markdown"
            " file (README.md) instead of printing.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Print the configuration reference (Markdown), generated from the settings objects."""
    reference = config_reference.render(app)
    if write is None:
        typer.echo(reference, nl=False)
        return
    changed = config_reference.write_section(write, reference)
    typer.echo(f"{write}: configuration reference {'updated' if changed else 'already current'}")


def main() -> None:
    run_program(app)
