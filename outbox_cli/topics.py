"""``outbox topics create|describe``: the outbox's own topics on a cluster."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from outbox.admin import (
    MIN_INSYNC_REPLICAS,
    TopicState,
    ensure_topics,
    plan_topics,
    read_topic_states,
)
from outbox.config import KafkaSettings
from outbox_cli.console import make_console
from outbox_cli.options import admin_session
from outbox_cli.settings_flags import kafka_options

topics_app = typer.Typer(help="Create and inspect the outbox topics.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add ``topics`` to the ``outbox`` command line."""
    app.add_typer(topics_app, name="topics")


def _group_option(help_text: str) -> Any:
    """``--producer-group`` (or ``--group``/``-g``) of a producer group's check topic."""
    return Annotated[
        list[str] | None,
        typer.Option("--producer-group", "--group", "-g", help=help_text, show_default=False),
    ]


CreateGroupOption = _group_option(
    "Also create the check topic of this producer group (repeatable)."
)
DescribeGroupOption = _group_option(
    "Also show the check topic of this producer group, which must then exist too (repeatable)."
)


def _table(title: str, states: list[TopicState], created: dict[str, bool] | None = None) -> Table:
    table = Table(title=title)
    for column in ("topic", "partitions", "replication", "min.insync", "retention.ms", "status"):
        table.add_column(column)
    for state in states:
        if not state.exists:
            status = "missing"
        elif created is not None:
            status = "created" if created.get(state.name) else "exists"
        else:
            status = "ok"
        table.add_row(
            state.name,
            str(state.partitions or "-"),
            str(state.replication_factor or "-"),
            state.config.get(MIN_INSYNC_REPLICAS, "-"),
            state.config.get("retention.ms", "-"),
            status,
        )
    return table


@topics_app.command()
@kafka_options
def create(
    partitions: Annotated[
        int,
        typer.Option(
            "--partitions",
            "-p",
            envvar="OUTBOX_TOPIC_PARTITIONS",
            min=1,
            help="Partitions of the half and op topics (and the others).",
        ),
    ] = 8,
    replication_factor: Annotated[
        int | None,
        typer.Option(
            "--replication-factor",
            "-r",
            min=1,
            help="Replicas per partition [default: 3, or every broker of a smaller cluster;"
            " min.insync.replicas is 2 with three replicas, else 1].",
            show_default=False,
        ),
    ] = None,
    groups: CreateGroupOption = None,
    real_topics: Annotated[
        list[str] | None,
        typer.Option(
            "--topic",
            "-t",
            help="Also create this real topic, one the producers send to and the relay"
            " publishes to, with the same partitions and replication (repeatable;"
            " an existing one is kept as it is).",
            show_default=False,
        ),
    ] = None,
    *,
    settings: KafkaSettings,
) -> None:
    """Create the half, op and discard topics (and check and real topics); idempotent."""
    specs = plan_topics(
        settings.topics,
        partitions,
        replication_factor,
        tuple(groups or ()),
        tuple(real_topics or ()),
    )
    with admin_session(settings) as admin:
        created = ensure_topics(admin, specs)
        states = read_topic_states(admin, [s.name for s in specs])
    make_console().print(
        _table(f"outbox topics on {settings.bootstrap_servers}", list(states.values()), created)
    )


@topics_app.command()
@kafka_options
def describe(
    groups: DescribeGroupOption = None,
    *,
    settings: KafkaSettings,
) -> None:
    """Show the outbox topics; exits 1 if any is missing or half and op disagree."""
    names = [*settings.topics.fixed, *(settings.topics.check(g) for g in groups or ())]
    with admin_session(settings) as admin:
        states = read_topic_states(admin, names)
    make_console().print(
        _table(f"outbox topics on {settings.bootstrap_servers}", list(states.values()))
    )
    half, op = states[settings.topics.half], states[settings.topics.op]
    if half.exists and op.exists and half.partitions != op.partitions:
        typer.echo(
            f"error: {half.name} has {half.partitions} partitions but {op.name} has "
            f"{op.partitions}; they must match (half partition p pairs with op partition p)",
            err=True,
        )
        raise typer.Exit(1)
    if not all(s.exists for s in states.values()):
        raise typer.Exit(1)
