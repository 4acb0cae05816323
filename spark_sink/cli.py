"""``outbox sink`` and ``outbox dev spark fetch``.

Importing this module must not import pyspark: the ``outbox`` command line is
also installed where Spark is not (the checker's image), and ``outbox --help``
should stay fast. Spark is imported when the sink actually runs.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from outbox.cli_options import BootstrapOption, PrefixOption
from outbox.config import parse_properties
from outbox.errors import ConfigurationError, OutboxError
from spark_sink.errors import SparkJarsError
from spark_sink.progress import BatchProgress
from spark_sink.settings import SinkSettings, load_settings

spark_app = typer.Typer(
    help="Spark's Kafka source (spark-sql-kafka-0-10), resolved once into the cache.",
    no_args_is_help=True,
)


@spark_app.command()
def fetch() -> None:
    """Only resolve the Spark Kafka source jars into the cache (for CI images and offline work)."""
    from spark_sink.jars import connector_coordinates, ensure_spark_kafka_jars, spark_kafka_jars

    try:
        libs = ensure_spark_kafka_jars()
        jars = spark_kafka_jars(libs)
    except SparkJarsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(f"{connector_coordinates()}: {len(jars)} jars beyond pyspark's own", err=True)
    typer.echo(str(libs))


def _option(*names: str, env: str, help: str) -> typer.models.OptionInfo:
    return typer.Option(*names, envvar=env, help=help, show_default=False)


def _properties(pairs: list[str] | None, what: str) -> dict[str, str] | None:
    if not pairs:
        return None
    try:
        return parse_properties(pairs)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{what}: {exc}") from None


def _resolve_bootstrap(bootstrap: str | None) -> str | None:
    if bootstrap or os.environ.get("OUTBOX_SINK_BOOTSTRAP_SERVERS"):
        return bootstrap
    from outbox.dev.kafka import running_bootstrap

    found = running_bootstrap()
    if found is None:
        raise ConfigurationError(
            "no Kafka to read: pass --bootstrap HOST:PORT, set OUTBOX_BOOTSTRAP_SERVERS, "
            "or start a local broker with `outbox dev kafka start`"
        )
    return found


def sink(
    topics: Annotated[
        str | None,
        _option("--topics", env="OUTBOX_SINK_TOPICS", help="Real topics to read, comma-separated."),
    ] = None,
    pattern: Annotated[
        str | None,
        _option(
            "--pattern",
            env="OUTBOX_SINK_PATTERN",
            help="Java regex of real topics to read (instead of --topics); new matches join.",
        ),
    ] = None,
    output: Annotated[
        str | None, _option("--output", env="OUTBOX_SINK_OUTPUT", help="Table path or URI.")
    ] = None,
    checkpoint: Annotated[
        str | None,
        _option(
            "--checkpoint",
            env="OUTBOX_SINK_CHECKPOINT",
            help="Checkpoint path or URI; keep it for the life of the table.",
        ),
    ] = None,
    format: Annotated[
        str | None,
        _option("--format", env="OUTBOX_SINK_FORMAT", help="Spark data source to write. [parquet]"),
    ] = None,
    once: Annotated[
        bool,
        typer.Option(
            "--once",
            envvar="OUTBOX_SINK_ONCE",
            help="Write what the topics hold now (available-now trigger), then exit.",
        ),
    ] = False,
    trigger: Annotated[
        str | None,
        _option(
            "--trigger",
            env="OUTBOX_SINK_TRIGGER",
            help="Time between micro-batches when continuous (500ms, 10s, 1m). [10s]",
        ),
    ] = None,
    bootstrap: BootstrapOption = None,
    master: Annotated[
        str | None,
        _option(
            "--master",
            env="OUTBOX_SINK_MASTER",
            help="Spark master (local[4], spark://host:7077, yarn, k8s://...). [local[*]]",
        ),
    ] = None,
    starting_offsets: Annotated[
        str | None,
        _option(
            "--starting-offsets",
            env="OUTBOX_SINK_STARTING_OFFSETS",
            help="Where a new checkpoint starts: earliest, latest or Spark's JSON. [earliest]",
        ),
    ] = None,
    fail_on_data_loss: Annotated[
        bool | None,
        typer.Option(
            "--fail-on-data-loss/--no-fail-on-data-loss",
            envvar="OUTBOX_SINK_FAIL_ON_DATA_LOSS",
            help="Fail when offsets to read are gone (retention, deleted topic). [fail]",
            show_default=False,
        ),
    ] = None,
    dedup_window: Annotated[
        str | None,
        _option(
            "--dedup-window",
            env="OUTBOX_SINK_DEDUP_WINDOW",
            help="How long a transaction id is remembered, in ingestion time (30m, 1h, 7d). [1h]",
        ),
    ] = None,
    max_offsets_per_trigger: Annotated[
        int | None,
        _option(
            "--max-offsets-per-trigger",
            env="OUTBOX_SINK_MAX_OFFSETS_PER_TRIGGER",
            help="Cap on records per micro-batch. [all available]",
        ),
    ] = None,
    shuffle_partitions: Annotated[
        int | None,
        _option(
            "--shuffle-partitions",
            env="OUTBOX_SINK_SHUFFLE_PARTITIONS",
            help="State partitions of the de-duplication; fixed once the checkpoint exists. [8]",
        ),
    ] = None,
    state_store: Annotated[
        str | None,
        _option(
            "--state-store",
            env="OUTBOX_SINK_STATE_STORE",
            help="De-duplication state store: rocksdb or memory. [rocksdb]",
        ),
    ] = None,
    kafka_property: Annotated[
        list[str] | None,
        typer.Option(
            "--kafka-property",
            "-X",
            help="Java Kafka client property KEY=VALUE (repeatable) or one JSON object;"
            " env OUTBOX_SINK_KAFKA_OPTIONS takes a JSON object.",
            show_default=False,
        ),
    ] = None,
    conf: Annotated[
        list[str] | None,
        typer.Option(
            "--conf",
            help="Spark setting KEY=VALUE (repeatable), as spark-submit's;"
            " env OUTBOX_SINK_SPARK_CONF takes a JSON object.",
            show_default=False,
        ),
    ] = None,
    kafka_timeout: Annotated[
        float | None,
        _option(
            "--kafka-timeout",
            env="OUTBOX_SINK_KAFKA_TIMEOUT_SECONDS",
            help="Seconds the start-up check waits for the brokers. [30]",
        ),
    ] = None,
    prefix: PrefixOption = "outbox",
) -> None:
    """Land the committed events of real topics in a table, de-duplicated by transaction id.

    Reads with read_committed, drops later copies of a transaction id seen within
    --dedup-window, and writes Parquet (or --format) partitioned by topic and date.
    Prints one line per micro-batch and a summary line last.
    """
    settings = load_settings(
        bootstrap_servers=_resolve_bootstrap(bootstrap),
        topics=topics,
        pattern=pattern,
        output=output,
        checkpoint=checkpoint,
        format=format,
        once=once or None,
        trigger=trigger,
        starting_offsets=starting_offsets,
        fail_on_data_loss=fail_on_data_loss,
        dedup_window=dedup_window,
        max_offsets_per_trigger=max_offsets_per_trigger,
        master=master,
        shuffle_partitions=shuffle_partitions,
        state_store=state_store,
        kafka_options=_properties(kafka_property, "--kafka-property"),
        spark_conf=_properties(conf, "--conf"),
        kafka_timeout_seconds=kafka_timeout,
        topic_prefix=prefix,
    )
    run(settings)


def describe(settings: SinkSettings) -> str:
    source = f"topics {','.join(settings.topics)}" if settings.topics else f"/{settings.pattern}/"
    mode = "once (available now)" if settings.once else f"every {settings.trigger:g}s"
    return (
        f"sink: {source} from {settings.bootstrap_servers} -> {settings.format} "
        f"{settings.output} (checkpoint {settings.checkpoint}), {mode}, "
        f"dedup window {settings.dedup_window:g}s"
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
    """``sink`` as a program of its own (``spark-submit spark_sink/job.py ...``)."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(sink)
    try:
        app(args=argv, prog_name="spark_sink.job")
    except (OutboxError, ValueError) as exc:
        if os.environ.get("OUTBOX_DEBUG"):
            raise
        print(f"outbox: error: {exc}", file=sys.stderr)
        sys.exit(1)
