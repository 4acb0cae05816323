"""The ``outbox`` command line: one entry point, one sub-command group per part.

Errors the outbox raises on purpose (bad settings, an unreachable cluster,
mismatched topics, malformed records) end the command with their message and
exit code 1, not a traceback (``OUTBOX_DEBUG=1`` shows it).
"""

from __future__ import annotations

import os
import sys

import typer
from pydantic import ValidationError

from checker.cli import register as register_checker
from checker.discard import register as register_discard
from checker.status import register as register_status
from outbox.dev.kafka_cli import kafka_app
from outbox.errors import OutboxError
from outbox.protocol import ProtocolError
from outbox.sql.cli import db_app
from outbox.topics_cli import topics_app
from spark_sink.cli import sink, spark_app

app = typer.Typer(
    name="outbox",
    help="Transactional outbox on Kafka: topics, local runtimes, checker, sink.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
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
app.command("sink")(sink)


@app.command()
def demo() -> None:
    """Run the main job end to end on embedded defaults (local Kafka broker)."""
    from outbox.demo import main as demo_main

    demo_main()


def main() -> None:
    try:
        app()
    except (OutboxError, ProtocolError, ValidationError, ValueError) as exc:
        if os.environ.get("OUTBOX_DEBUG"):
            raise
        print(f"outbox: error: {exc}", file=sys.stderr)
        sys.exit(1)
