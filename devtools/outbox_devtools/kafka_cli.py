"""``outbox dev kafka start|stop|status|fetch``: a local broker for hands-on work.

``start`` leaves a detached broker running after the command returns and
records it in a JSON state file under :func:`outbox_devtools.processes.state_dir`,
so ``stop`` and ``status`` from another shell find it again.
"""

from __future__ import annotations

import json
import shutil
import time
from typing import Annotated

import typer

from outbox_devtools import processes
from outbox_devtools.kafka import (
    KAFKA_VERSION,
    KafkaRuntimeError,
    LocalKafka,
    ensure_kafka_jars,
    running_state,
    state_file,
)
from outbox_devtools.secure_kafka import BrokerSecurity

kafka_app = typer.Typer(
    help=f"A local Apache Kafka {KAFKA_VERSION} broker (KRaft, one node) from the official jars.",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    """Add ``kafka`` to ``outbox dev``."""
    app.add_typer(kafka_app, name="kafka")


@kafka_app.command()
def start(
    port: Annotated[int, typer.Option(help="Client port on 127.0.0.1 (0: any free).")] = 0,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for readiness.")] = 90.0,
    secure: Annotated[
        bool,
        typer.Option(
            help="SASL_SSL (SCRAM-SHA-512) with ACLs enforced; the admin's login is written"
            " to admin.env and admin.properties in the work dir."
        ),
    ] = False,
) -> None:
    """Start a detached broker with a fresh data dir; prints `bootstrap: HOST:PORT` last."""
    state = running_state()
    if state is not None:
        typer.echo(f"Kafka is already running (pid {state['pid']})", err=True)
        typer.echo(f"bootstrap: {state['bootstrap']}")
        return
    work_dir = processes.state_dir() / "kafka"
    shutil.rmtree(work_dir, ignore_errors=True)
    security = BrokerSecurity() if secure else None
    broker = LocalKafka(
        work_dir, port=port or None, start_timeout=timeout, detached=True, security=security
    )
    try:
        broker.start()
    except KafkaRuntimeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    except KeyboardInterrupt:
        broker.kill()  # detached: nobody else would ever stop it
        raise
    record = {
        "pid": broker.pid,
        "bootstrap": broker.bootstrap_servers,
        "work_dir": str(work_dir),
        "log": str(broker.log_path),
        "kafka_version": KAFKA_VERSION,
        "started_at": time.time(),
        "secure": secure,
    }
    state_file().parent.mkdir(parents=True, exist_ok=True)
    state_file().write_text(json.dumps(record, indent=2) + "\n")
    typer.echo(
        f"Kafka {KAFKA_VERSION} started in {broker.last_start_seconds:.1f}s "
        f"(pid {broker.pid}, log {broker.log_path})",
        err=True,
    )
    if security is not None:
        env, properties = security.write_admin_files(work_dir)
        typer.echo(
            f"SASL_SSL with ACLs enforced; as the admin: `source {env}` (outbox commands),"
            f" --command-config {properties} (Kafka's tools)",
            err=True,
        )
    typer.echo(f"bootstrap: {broker.bootstrap_servers}")


@kafka_app.command()
def stop(
    grace: Annotated[float, typer.Option(help="Seconds after SIGTERM before SIGKILL.")] = 30.0,
) -> None:
    """Stop the broker that `start` recorded."""
    state = running_state()
    if state is None:
        typer.echo("Kafka is not running")
        return
    processes.stop_pid(int(state["pid"]), grace)
    state_file().unlink(missing_ok=True)
    typer.echo(f"stopped Kafka (pid {state['pid']})")


@kafka_app.command()
def status() -> None:
    """Exit 0 and print the bootstrap address if running, else exit 1."""
    state = running_state()
    if state is None:
        typer.echo("Kafka is not running")
        raise typer.Exit(1)
    typer.echo(f"running: pid {state['pid']}, work dir {state['work_dir']}")
    typer.echo(f"bootstrap: {state['bootstrap']}")


@kafka_app.command()
def fetch() -> None:
    """Only resolve the broker jars into the cache (for CI images and offline work)."""
    try:
        libs = ensure_kafka_jars()
    except KafkaRuntimeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(str(libs))
