"""``outbox acls print``: the ACLs each component needs, for a security team to grant."""

from __future__ import annotations

from typing import Annotated

import typer

from outbox.acls import (
    COMPONENTS,
    Acl,
    Component,
    acl_table,
    component_acls,
    kafka_acls_commands,
)
from outbox.protocol import DEFAULT_PREFIX, TopicNames
from outbox_cli.options import PrefixOption

acls_app = typer.Typer(help="The Kafka ACLs of the outbox's components.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add ``acls`` to the ``outbox`` command line."""
    app.add_typer(acls_app, name="acls")


@acls_app.command("print")
def print_acls(
    group: Annotated[
        str,
        typer.Option(
            "--producer-group", "--group", "-g", help="Producer group whose producers get ACLs."
        ),
    ],
    topics: Annotated[
        list[str] | None,
        typer.Option(
            "--topic",
            "-t",
            help="Real topic the producers send to, the relay writes and the sink reads"
            " (repeatable).",
            show_default=False,
        ),
    ] = None,
    prefix: PrefixOption = DEFAULT_PREFIX,
    checker_group: Annotated[
        str | None,
        typer.Option(help="The checker's consumer group; default '<prefix>.checker'."),
    ] = None,
    producer: Annotated[str, typer.Option(help="Principal of the producers.")] = "User:producer",
    checker: Annotated[str, typer.Option(help="Principal of the checker.")] = "User:checker",
    sink: Annotated[str, typer.Option(help="Principal of the sink.")] = "User:sink",
    component: Annotated[
        list[str] | None,
        typer.Option(
            help="Only these components: producer, checker, sink (repeatable).",
            show_default=False,
        ),
    ] = None,
    as_commands: Annotated[
        str | None,
        typer.Option(
            "--kafka-acls",
            metavar="BOOTSTRAP",
            help="Print kafka-acls.sh commands for this cluster instead of a table.",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Print every ALLOW rule the producer, the checker and the sink need, and why."""
    unknown = sorted(set(component or ()) - set(COMPONENTS))
    if unknown:
        raise typer.BadParameter(
            f"unknown component(s) {', '.join(unknown)}; choose from {', '.join(COMPONENTS)}",
            param_hint="--component",
        )
    principals: dict[Component, str] = {"producer": producer, "checker": checker, "sink": sink}
    names = TopicNames(prefix)
    rows: list[tuple[str, Acl]] = [
        (principals[name], acl)
        for name in COMPONENTS
        if not component or name in component
        for acl in component_acls(
            name,
            names,
            producer_group=group,
            real_topics=topics or [],
            checker_group=checker_group,
        )
    ]
    if as_commands:
        typer.echo("\n".join(kafka_acls_commands(rows, as_commands)))
        return
    typer.echo(acl_table(rows))
    if not topics:
        typer.echo(
            "\n(no --topic given: the real topics' rules are left out; name each topic"
            " the producers send to with --topic)"
        )
