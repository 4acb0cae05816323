"""``outbox sink`` and ``outbox dev spark fetch``.

Importing this module must not import pyspark: the ``outbox`` command line is
also installed where Spark is not (the checker's image), and ``outbox --help``
should stay fast. Spark is imported when the sink actually runs.

The sink's flags are generated from :class:`~spark_sink.settings.SinkSettings`
(:mod:`outbox_cli.settings_flags`), one per field and each also the field's
variables, so they cannot drift from the settings; only the spellings users
already type are named here.
"""

from __future__ import annotations

import sys

import typer

from outbox_cli.errors import run_program
from outbox_cli.settings_flags import KAFKA_PROPERTY_FLAGS, FlagNames, settings_command
from spark_sink.errors import SparkJarsError
from spark_sink.progress import BatchProgress
from spark_sink.settings import SinkSettings

spark_app = typer.Typer(
    help="Spark's Kafka source (spark-sql-kafka-0-10), resolved once into the cache.",
    no_args_is_help=True,
)


def register_fetch(app: typer.Typer) -> None:
    """Add ``spark`` (``fetch``) to ``outbox dev``."""
    app.add_typer(spark_app, name="spark")


@spark_app.command()
def fetch(
    delta: bool = typer.Option(False, "--delta", help="also Delta Lake's jars (--format delta)"),
) -> None:
    """Only resolve the Spark Kafka source jars into the cache (for CI images and offline work)."""
    from spark_sink import jars as spark_jars

    try:
        libs = spark_jars.ensure_spark_kafka_jars()
        jars = spark_jars.spark_kafka_jars(libs)
        delta_libs = spark_jars.ensure_delta_jars() if delta else None
        delta_jars = spark_jars.delta_jars(delta_libs) if delta_libs else []
    except SparkJarsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    coordinates = spark_jars.connector_coordinates()
    typer.echo(f"{coordinates}: {len(jars)} jars beyond pyspark's own", err=True)
    typer.echo(str(libs))
    if delta_libs is not None:
        coordinates = spark_jars.delta_coordinates()
        typer.echo(f"{coordinates}: {len(delta_jars)} jars beyond pyspark's own", err=True)
        typer.echo(str(delta_libs))


SINK_FLAGS: FlagNames = {
    "kafka_options": KAFKA_PROPERTY_FLAGS,
    "spark_conf": ("--conf",),
    "kafka_timeout_seconds": ("--kafka-timeout", "--kafka-timeout-seconds"),
}

SINK_HELP = """Land the committed events of real topics in a table, de-duplicated by transaction id.

Reads with read_committed and writes Parquet (or --format, e.g. delta)
partitioned by topic and date. --dedup window drops later copies of a
transaction id seen within --dedup-window; merge (Delta) recognises a copy
against the whole table; off keeps every record.
Prints one line per micro-batch and a summary line last."""


def register(app: typer.Typer) -> None:
    """Add ``sink`` to ``app``: the ``outbox`` command line, or spark-submit's entry."""
    settings_command(
        app,
        "sink",
        SinkSettings,
        run,
        help=SINK_HELP,
        # The sink's output is its progress lines; py4j and Spark's Python side
        # chatter at INFO.
        log_level="WARNING",
        flags=SINK_FLAGS,
    )


def describe(settings: SinkSettings) -> str:
    source = f"topics {','.join(settings.topics)}" if settings.topics else f"/{settings.pattern}/"
    mode = "once (available now)" if settings.once else f"every {settings.trigger:g}s"
    dedup = {
        "window": f"dedup window {settings.dedup_window:g}s",
        "merge": f"dedup merge (lookback {settings.dedup_lookback:g}s)",
        "off": "no dedup",
    }[settings.dedup_mode]
    return (
        f"sink: {source} from {settings.bootstrap_servers} -> {settings.format} "
        f"{settings.output} (checkpoint {settings.checkpoint}), {mode}, {dedup}"
    )


def run(settings: SinkSettings) -> None:
    """Run the job, printing each batch on stdout as it finishes."""
    from spark_sink.job import run_sink

    typer.echo(describe(settings), err=True)

    def report(batch: BatchProgress) -> None:
        typer.echo(batch.line())
        sys.stdout.flush()

    summary = run_sink(settings, on_progress=report)
    typer.echo(summary.line())


def run_standalone(argv: list[str]) -> None:
    """``sink`` as a program of its own (``spark-submit spark_sink/submit.py ...``)."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    register(app)
    run_program(app, argv, prog_name="spark_sink.job")
