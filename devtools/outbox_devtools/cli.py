"""The tooling's sub-commands of ``outbox``: ``demo``, ``chaos`` and ``config-reference``.

Declared in this distribution's ``kafka_outbox.commands`` entry points, so they
exist only where the tooling is installed (``make install``), never in the
library's wheel. Each ``register_*`` adds one command to the ``outbox`` group.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from outbox_cli.settings_flags import settings_command
from outbox_devtools.chaos.settings import ChaosSettings


def register_demo(app: typer.Typer) -> None:
    @app.command()
    def demo() -> None:
        """Run the main job end to end on embedded defaults (local Kafka broker)."""
        from outbox_devtools.demo import main as demo_main

        demo_main()


def _run_chaos(settings: ChaosSettings) -> None:
    from outbox_cli.console import make_console
    from outbox_devtools.chaos.run import run as run_chaos

    sys.exit(run_chaos(make_console(), settings))


def register_chaos(app: typer.Typer) -> None:
    settings_command(
        app,
        "chaos",
        ChaosSettings,
        _run_chaos,
        help="Run the pipeline under seeded faults (kill -9 of producers, of a producer answering"
        " a check, of one or every checker replica; broker restarts; freezes of the broker and"
        " of a checker; with --brokers 3 a rolling restart and kills of a half partition's"
        " leader and of a relay's transaction coordinator; with --network-partitions, links"
        " cut while both sides run: a checker replica or a producer from every broker, and on"
        " a cluster a node, or a half partition's leader, from the other nodes) and verify"
        " every commit is published once, nothing committed is lost and nothing rolled back"
        " is visible.",
        log_level="WARNING",
    )


def register_config_reference(app: typer.Typer) -> None:
    @app.command("config-reference")
    def config_reference_command(
        ctx: typer.Context,
        write: Annotated[
            Path | None,
            typer.Option(
                "--write",
                exists=True,
                dir_okay=False,
                writable=True,
                help="Rewrite the section between the config-reference markers of this Markdown"
                " file (docs/reference/configuration.md) instead of printing.",
                show_default=False,
            ),
        ] = None,
    ) -> None:
        """Print the configuration reference (Markdown), generated from the settings objects."""
        from outbox_devtools import config_reference

        reference = config_reference.render(ctx.find_root().command)
        if write is None:
            typer.echo(reference, nl=False)
            return
        changed = config_reference.write_section(write, reference)
        typer.echo(
            f"{write}: configuration reference {'updated' if changed else 'already current'}"
        )
