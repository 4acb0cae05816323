"""``outbox discard list|resume``: the command line over :mod:`outbox_checker.discard`.

Why resuming is safe to repeat (resume markers written in one Kafka transaction
with the halves they put back, or with the real records of committed halves the
relay could not publish) is explained there; this module reads the operator's
options, runs it, and shows the outcome.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import typer
from rich.table import Table

from outbox.config import KafkaSettings
from outbox.protocol import Header
from outbox_checker.discard import (
    DiscardedHalf,
    ResumeMarker,
    ResumeOutcome,
    read_discards,
    resume_discards,
)
from outbox_checker.display import iso_ms
from outbox_checker.settings import CheckerSettings
from outbox_cli.console import make_console
from outbox_cli.options import OutputFormat, OutputOption, admin_session, print_json
from outbox_cli.settings_flags import kafka_options

discard_app = typer.Typer(
    help="Halves the checker gave up on: list them, put them back to be checked again.",
    no_args_is_help=True,
)


def _position(partition: int | None, offset: int | None) -> str:
    return "-" if partition is None or offset is None else f"{partition}@{offset}"


def _went(marker: ResumeMarker) -> str:
    """Where a resume sent a discard: its half back to a half partition, or, for a committed
    half, its real record published (the one thing the operator then looks for)."""
    if marker.published is not None:
        where = marker.published
        return f"published to {where.topic} {_position(where.partition, where.offset)}"
    return f"half back at {_position(marker.half_partition, marker.half_offset)}"


def discards_table(discards: list[DiscardedHalf], title: str, with_resumed: bool) -> Table:
    table = Table(title=title)
    columns = [
        "transaction id",
        "producer group",
        "real topic",
        "reason",
        "detail",
        "checks",
        "discarded at",
        "half partition@offset",
    ]
    if with_resumed:
        columns.append("resumed")
    for column in columns:
        if column == "detail":
            table.add_column(column, max_width=48, overflow="fold")
        else:
            table.add_column(column, overflow="fold")
    for discard in discards:
        shown, marker = discard_document(discard), discard.resumed
        row = [
            shown["transaction_id"] or "-",
            shown["producer_group"] or "-",
            shown["real_topic"] or "-",
            shown["reason"] or "?",
            shown["detail"] or "-",
            discard.field(Header.CHECK_TIMES) or "-",
            iso_ms(shown["discarded_ms"]),
            _position(shown["half_partition"], shown["half_offset"]),
        ]
        if with_resumed:
            row.append(f"{iso_ms(marker.resumed_ms)}: {_went(marker)}" if marker else "-")
        table.add_row(*row)
    return table


def discard_document(discard: DiscardedHalf) -> dict[str, Any]:
    """One discarded half in ``outbox discard list --output json``: the table's columns, typed."""
    record, marker = discard.record, discard.resumed
    check_times = discard.field(Header.CHECK_TIMES)
    return {
        "transaction_id": discard.transaction_id,
        "producer_group": discard.field(Header.PRODUCER_GROUP),
        "real_topic": discard.field(Header.REAL_TOPIC),
        "reason": record.reason.value if record else None,
        "detail": record.detail if record else discard.problem,
        "check_times": int(check_times) if check_times and check_times.isdigit() else None,
        "discarded_ms": record.discarded_ms if record else None,
        "half_partition": record.half_partition if record else None,
        "half_offset": record.half_offset if record else None,
        "discard_partition": discard.position[0],
        "discard_offset": discard.position[1],
        "resumable": discard.problem is None,
        "resumed": None
        if marker is None
        else {
            "resumed_ms": marker.resumed_ms,
            "half_partition": marker.half_partition,
            "half_offset": marker.half_offset,
            "published": None
            if marker.published is None
            else {
                "topic": marker.published.topic,
                "partition": marker.published.partition,
                "offset": marker.published.offset,
            },
        },
    }


@discard_app.command("list")
@kafka_options
def list_command(
    include_resumed: Annotated[
        bool, typer.Option("--include-resumed", help="Also show discards already resumed.")
    ] = False,
    output: OutputOption = OutputFormat.TABLE,
    *,
    settings: KafkaSettings,
) -> None:
    """List the discarded halves (not yet resumed), oldest first."""
    with admin_session(settings):
        discards = read_discards(settings.client_config(), settings.topics)
    shown = discards if include_resumed else [d for d in discards if d.resumed is None]
    if output is OutputFormat.JSON:
        print_json([discard_document(discard) for discard in shown])
        return
    console = make_console()
    console.print(
        discards_table(shown, f"discarded halves on {settings.topics.discard}", include_resumed)
    )
    resumed = sum(1 for d in discards if d.resumed is not None)
    console.print(
        f"discarded: {len(discards) - resumed} to resume, {resumed} resumed before",
        highlight=False,
    )


def _now_ms() -> int:
    return int(time.time() * 1000)


def _retention_warning(outcome: ResumeOutcome, now: int) -> str | None:
    hours = CheckerSettings.model_fields["retention_hours"].default
    horizon = now - int(hours * 3600 * 1000)
    old = [
        r
        for r in outcome.resumed
        if r.marker.published is None and r.source.half and r.source.half.born_ms < horizon
    ]
    if not old:
        return None
    return (
        f"note: {len(old)} resumed half(s) were born more than {hours:g} h ago; a checker "
        f"with the default retention (--retention-hours {hours:g}) discards them again at "
        "once (reason retention): raise OUTBOX_RETENTION_HOURS on the checker first"
    )


@discard_app.command("resume")
@kafka_options
def resume_command(
    transaction_ids: Annotated[
        list[str] | None,
        typer.Argument(help="Transaction ids of discarded halves to put back.", show_default=False),
    ] = None,
    resume_all: Annotated[
        bool, typer.Option("--all", help="Resume every discarded half that can be.")
    ] = False,
    past_op_retention: Annotated[
        bool,
        typer.Option(
            "--past-op-retention",
            help="Also resume halves older than the op topic's history: one committed "
            "and published before would be published a second time.",
        ),
    ] = False,
    *,
    settings: KafkaSettings,
) -> None:
    """Put discarded halves back into the half topic with the check count reset;
    publish committed ones the relay could not (unpublishable) once their cause is fixed.

    Idempotent: a discard already resumed is not put back, nor published, twice. Exits 1
    if a named transaction id has no discard or cannot be resumed (malformed, or its real
    record still does not fit or has no topic); the others are resumed all the same.
    """
    if bool(transaction_ids) == resume_all:
        raise typer.BadParameter("give transaction ids or --all (not both)")
    with admin_session(settings):
        outcome = resume_discards(
            settings,
            None if resume_all else transaction_ids,
            now_ms=_now_ms,
            past_op_retention=past_op_retention,
        )
    console = make_console()
    errors = make_console(stderr=True)
    if outcome.resumed:
        table = Table(title="resumed")
        for column in ("transaction id", "reason", "discarded at", "went to partition@offset"):
            table.add_column(column, overflow="fold")
        for item in outcome.resumed:
            record = item.source.record
            table.add_row(
                item.transaction_id,
                record.reason.value if record else "-",
                iso_ms(record.discarded_ms) if record else "-",
                _went(item.marker),
            )
        console.print(table)
    for discard in outcome.already:
        marker = discard.resumed
        assert marker is not None
        console.print(
            f"already resumed: {discard.transaction_id} at {iso_ms(marker.resumed_ms)} "
            f"({_went(marker)}); not resumed again",
            highlight=False,
        )
    for label, why in outcome.refused:
        target = errors if not resume_all else console
        prefix_word = "error" if not resume_all else "skipped"
        target.print(
            f"{prefix_word}: cannot resume {label}: {why}",
            highlight=False,
            markup=False,
            soft_wrap=True,  # whole at any width: the terminal wraps, rich does not cut
        )
    for transaction_id in outcome.unknown:
        errors.print(
            f"error: no discarded half with transaction id {transaction_id!r} "
            f"on {settings.topics.discard}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    warning = _retention_warning(outcome, _now_ms())
    if warning:
        console.print(warning, highlight=False)
    published = sum(1 for item in outcome.resumed if item.marker.published is not None)
    console.print(
        f"resumed: {len(outcome.resumed)} half(s), {published} of them published", highlight=False
    )
    if outcome.unknown or (outcome.refused and not resume_all):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``outbox discard list|resume`` to the top-level command line."""
    app.add_typer(discard_app, name="discard")
