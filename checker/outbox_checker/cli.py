"""``outbox checker``: run a checker replica until SIGTERM."""

from __future__ import annotations

import logging
import signal

import typer

from outbox_checker.http import serve
from outbox_checker.service import Checker, freeze_startup_heap
from outbox_checker.settings import CheckerSettings
from outbox_cli.settings_flags import KAFKA_PROPERTY_FLAGS, settings_command

log = logging.getLogger(__name__)


def run_checker(settings: CheckerSettings) -> None:
    """Serve probes, run rounds; SIGTERM/SIGINT finish the round, commit, exit 0.

    The probes' port is taken before Kafka is reached, so a port another process
    holds is the first error, not one found after the cluster answered."""
    started: list[Checker] = []
    server = None
    if settings.http_address:
        server = serve(
            settings.http_address,
            healthy=lambda: bool(started) and started[0].is_healthy(),
            ready=lambda: bool(started) and started[0].is_ready(),
        )
        log.info("probes and metrics on http://%s", settings.http_address)
    try:
        checker = Checker(settings)
        freeze_startup_heap()
        started.append(checker)
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: checker.stop())
        log.info("checker running: group=%s prefix=%s", settings.group_id, settings.topic_prefix)
        checker.run()
    finally:
        if server is not None:
            server.shutdown()
    log.info("checker stopped")


def checker_panel(field: str) -> str:
    """Where a checker flag shows in ``outbox checker --help``: 40 flags in one list
    hid which ones belong together."""
    if field.startswith("relay"):
        return "Relay (publication)"
    if field == "resolve_from_db" or field.startswith("db_"):
        return "Answers from the database"
    if field in ("http_address", "health_stall_seconds", "log_level"):
        return "Probes and logs"
    if field in (
        "checker_group",
        "instance_id",
        "start_timeout_seconds",
        "unreachable_report_seconds",
        "session_timeout_ms",
    ):
        return "Kafka"
    return "Check rounds (RocketMQ's)"


def register(app: typer.Typer) -> None:
    settings_command(
        app,
        "checker",
        CheckerSettings,
        run_checker,
        help="Run a checker replica: find halves with no outcome and ask their producers;"
        " publish every committed half to its real topic, exactly once (the relay).",
        flags={
            "kafka_properties": KAFKA_PROPERTY_FLAGS,
            # `outbox status` names the same group: one spelling for both.
            "checker_group": ("--checker-group", "--consumer-group"),
        },
        panel_of=checker_panel,
    )
