"""``outbox status``: the checker's checkpoints and pending halves, as a table or JSON.

What is read, and what *pending* means, is :mod:`outbox_checker.status`; this module
only asks for it and shows it.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Annotated, Any

import typer
from rich.table import Table

from outbox.config import KafkaSettings, renamed_variable
from outbox.errors import ConnectionSecurityError, KafkaUnavailableError
from outbox.sql.log import DEFAULT_TABLE
from outbox_checker.display import format_age
from outbox_checker.names import default_checker_group
from outbox_checker.parked import ParkedSummary, read_parked
from outbox_checker.status import DEFAULT_SCAN_LIMIT, CheckerStatus, read_status
from outbox_cli.console import make_console
from outbox_cli.options import OutputFormat, OutputOption, admin_session, print_json
from outbox_cli.settings_flags import kafka_options


def status_table(status: CheckerStatus, title: str) -> Table:
    table = Table(title=title)
    for column in (
        "partition",
        "half end",
        "half checkpoint",
        "op checkpoint",
        "lag",
        "pending",
        "oldest pending",
        "unrelayed",
        "owner",
    ):
        table.add_column(column, justify="left" if column == "owner" else "right")
    for part in status.partitions:
        oldest = None
        if part.oldest_pending_born_ms is not None:
            oldest = (status.read_at_ms - part.oldest_pending_born_ms) / 1000
        pending = f"≥{part.pending:,}" if part.capped else f"{part.pending:,}"
        if part.malformed:
            pending += f" (+{part.malformed} malformed)"
        table.add_row(
            str(part.partition),
            f"{part.half_end:,}",
            "-" if part.half_checkpoint is None else f"{part.half_checkpoint:,}",
            "-" if part.op_checkpoint is None else f"{part.op_checkpoint:,}",
            f"{part.lag:,}",
            pending,
            format_age(oldest),
            f"{part.unrelayed:,}",
            part.owner or "-",
        )
    return table


def show_status(status: CheckerStatus, where: str) -> None:
    console = make_console()
    console.print(status_table(status, f"checker {status.group} on {status.half_topic} ({where})"))
    for line in status_notes(status):
        console.print(line, highlight=False)


def status_notes(status: CheckerStatus) -> list[str]:
    """The lines under the table: totals, then what needs a look (rich markup)."""
    total = sum(p.pending for p in status.partitions)
    capped = [p.partition for p in status.partitions if p.capped]
    bound = "at least " if capped else ""
    unrelayed = sum(p.unrelayed for p in status.partitions)
    out_yet = " (no event of theirs is on a real topic yet; is a checker running?)"
    lines = [
        f"pending: {bound}{total:,} transaction(s) over {len(status.partitions)} half partition(s)",
        f"waiting for the relay: {unrelayed:,} op record(s){out_yet if unrelayed else ''}",
    ]
    lines += [
        f"[bold red]lost:[/] {part.lost_to_retention:,} half record(s) on partition "
        f"{part.partition} were deleted by retention before the checker read them "
        f"(offsets {part.half_checkpoint:,}..{part.half_low - 1:,}); any without a "
        "decision is lost: keep a checker running, or raise the half topic's "
        "retention.ms above the longest outage"
        for part in status.partitions
        if part.lost_to_retention
    ]
    if capped:
        lines.append(
            f"note: partitions {', '.join(map(str, capped))} have more than "
            f"{status.scan_limit:,} halves or ops past their checkpoint; only the first "
            f"{status.scan_limit:,} were read (raise --scan-limit for an exact count)"
        )
    if all(p.half_checkpoint is None for p in status.partitions):
        why = (
            " (its replicas have not settled a half so far)"
            if any(p.owner for p in status.partitions)
            else ": has `outbox checker` run against these topics"
            " (same --topic-prefix, --checker-group)?"
        )
        lines.append(f"note: group {status.group} has committed no checkpoint yet{why}")
    return lines


GroupOption = Annotated[
    str | None,
    typer.Option(
        "--checker-group",
        "--group",
        envvar="OUTBOX_CHECKER_GROUP",
        help="Consumer group of the checker replicas; default '<prefix>.checker'.",
        show_default=False,
    ),
]
ScanLimitOption = Annotated[
    int,
    typer.Option(
        "--scan-limit",
        min=1,
        help="Most halves (and ops) read per partition past the checkpoints to count pending.",
    ),
]


DbOption = Annotated[
    str | None,
    typer.Option(
        "--db",
        envvar="OUTBOX_RESOLVE_FROM_DB",
        help="SQLAlchemy URL of the transaction log (the checker's --resolve-from-db): also"
        " show the sends parked there (park_when_unavailable) that wait to be published.",
        show_default=False,
    ),
]
DbTableOption = Annotated[
    str,
    typer.Option("--db-table", envvar="OUTBOX_DB_TABLE", help="Transaction-log table name."),
]
DbSchemaOption = Annotated[
    str | None,
    typer.Option(
        "--db-schema", envvar="OUTBOX_DB_SCHEMA", help="Transaction-log schema.", show_default=False
    ),
]


def parked_document(parked: ParkedSummary) -> dict[str, Any]:
    return {
        "rows": parked.rows,
        "oldest_age_seconds": parked.oldest_age_seconds,
        "partitions": {str(p): count for p, count in parked.by_partition.items()},
    }


def show_parked(parked: ParkedSummary) -> None:
    if not parked.rows:
        line = "parked in the transaction log: none"
    else:
        where = ", ".join(f"{p}: {n:,}" for p, n in parked.by_partition.items())
        line = (
            f"parked in the transaction log: {parked.rows:,} send(s) waiting to be published"
            f" (by half partition {where}), the oldest for {format_age(parked.oldest_age_seconds)}"
        )
    make_console().print(line, highlight=False)


def kafka_away_note(bootstrap: str, parked: ParkedSummary, error: KafkaUnavailableError) -> str:
    """What ``status --db`` says when Kafka does not answer: the parked sends are read from
    the log, the checkpoints and pending halves from Kafka."""
    return (
        f"Kafka at {bootstrap} did not answer, so the checkpoints and pending halves cannot"
        f" be shown; the transaction log holds {parked.rows:,} parked send(s) ({error})"
    )


def status_document(status: CheckerStatus) -> dict[str, Any]:
    """``outbox status --output json``: every figure of the table, as numbers."""
    return {
        "group": status.group,
        "half_topic": status.half_topic,
        "read_at_ms": status.read_at_ms,
        "scan_limit": status.scan_limit,
        "pending": sum(p.pending for p in status.partitions),
        "unrelayed": sum(p.unrelayed for p in status.partitions),
        "lost_to_retention": sum(p.lost_to_retention for p in status.partitions),
        "partitions": [
            {
                **asdict(part),
                "lag": part.lag,
                "unrelayed": part.unrelayed,
                "lost_to_retention": part.lost_to_retention,
            }
            for part in status.partitions
        ],
    }


@kafka_options
def status(
    group: GroupOption = None,
    scan_limit: ScanLimitOption = DEFAULT_SCAN_LIMIT,
    output: OutputOption = OutputFormat.TABLE,
    db: DbOption = None,
    db_table: DbTableOption = DEFAULT_TABLE,
    db_schema: DbSchemaOption = None,
    *,
    settings: KafkaSettings,
) -> None:
    """Show the checker's checkpoints and pending halves per half partition (and, with
    --db, the sends parked in the transaction log)."""
    checker_group = (
        group
        or renamed_variable("OUTBOX_CHECKER_GROUP")
        or default_checker_group(settings.topic_prefix)
    )
    parked = None
    if db:  # first: it is most wanted while Kafka is away, when the rest may fail
        parked = read_parked(db, table=db_table, schema=db_schema, now=time.time())
        if output is not OutputFormat.JSON:
            show_parked(parked)
    try:
        with admin_session(settings):
            result = read_status(settings, checker_group, scan_limit=scan_limit)
    except ConnectionSecurityError:
        raise
    except KafkaUnavailableError as exc:
        if parked is None:
            raise
        raise KafkaUnavailableError(
            kafka_away_note(settings.bootstrap_servers, parked, exc)
        ) from None
    if output is OutputFormat.JSON:
        document = status_document(result)
        if parked is not None:
            document["parked"] = parked_document(parked)
        print_json(document)
    else:
        show_status(result, settings.bootstrap_servers)


def register(app: typer.Typer) -> None:
    """Add ``outbox status`` to the top-level command line."""
    app.command("status")(status)
