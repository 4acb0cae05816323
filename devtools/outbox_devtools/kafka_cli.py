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

from outbox_cli.settings_flags import duration_option
from outbox_devtools import processes
from outbox_devtools.kafka import (
    KAFKA_VERSION,
    KafkaRuntimeError,
    LocalKafka,
    LocalKafkaCluster,
    check_node_count,
    ensure_kafka_jars,
    recorded_pids,
    running_state,
    state_file,
    stop_recorded,
)
from outbox_devtools.secure_kafka import BrokerSecurity

kafka_app = typer.Typer(
    help=f"A local Apache Kafka {KAFKA_VERSION} broker (KRaft; one node, or a cluster of 3-5)"
    " from the official jars.",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    """Add ``kafka`` to ``outbox dev``."""
    app.add_typer(kafka_app, name="kafka")


@kafka_app.command()
def start(
    port: Annotated[
        int, typer.Option(help="Client port on 127.0.0.1 (0: any free); one node only.")
    ] = 0,
    nodes: Annotated[
        int,
        typer.Option(
            "--brokers",
            "--nodes",
            help="1, or 3-5 for a cluster (static quorum, 3 copies, min.insync.replicas=2);"
            " as `outbox chaos --brokers`.",
        ),
    ] = 1,
    timeout: Annotated[float, duration_option(help="How long to wait for readiness")] = 90.0,
    secure: Annotated[
        bool,
        typer.Option(
            help="SASL_SSL (SCRAM-SHA-512) with ACLs enforced; the admin's login is written"
            " to admin.env and admin.properties in the work dir."
        ),
    ] = False,
) -> None:
    """Start a detached broker with a fresh data dir; prints `bootstrap: HOST:PORT[,...]` last."""
    try:
        check_node_count(nodes)
        if port and nodes != 1:
            raise KafkaRuntimeError("--port sets one node's port; a cluster picks free ports")
        if secure and nodes != 1:
            raise KafkaRuntimeError("--secure runs one node; a secure cluster is not made here")
    except KafkaRuntimeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    state = running_state()
    if state is not None:
        typer.echo(f"Kafka is already running (pids {_pids(state)})", err=True)
        typer.echo(f"bootstrap: {state['bootstrap']}")
        return
    work_dir = processes.state_dir() / "kafka"
    shutil.rmtree(work_dir, ignore_errors=True)
    security = BrokerSecurity() if secure else None
    kafka: LocalKafka | LocalKafkaCluster = (
        LocalKafka(
            work_dir, port=port or None, start_timeout=timeout, detached=True, security=security
        )
        if nodes == 1
        else LocalKafkaCluster(work_dir, nodes=nodes, start_timeout=timeout, detached=True)
    )
    members = [kafka] if isinstance(kafka, LocalKafka) else kafka.nodes
    try:
        kafka.start()
    except KafkaRuntimeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    except KeyboardInterrupt:
        kafka.kill()  # detached: nobody else would ever stop it
        raise
    record = {
        "pid": members[0].pid,
        "pids": [node.pid for node in members],
        "nodes": nodes,
        "bootstrap": kafka.bootstrap_servers,
        "work_dir": str(work_dir),
        "log": str(members[0].log_path),
        "logs": [str(node.log_path) for node in members],
        "kafka_version": KAFKA_VERSION,
        "started_at": time.time(),
        "secure": secure,
    }
    state_file().parent.mkdir(parents=True, exist_ok=True)
    state_file().write_text(json.dumps(record, indent=2) + "\n")
    shape = "" if nodes == 1 else f" cluster of {nodes} nodes"
    typer.echo(
        f"Kafka {KAFKA_VERSION}{shape} started in {kafka.last_start_seconds:.1f}s "
        f"(pids {_pids(record)}, logs {', '.join(record['logs'])})",
        err=True,
    )
    if security is not None:
        env, properties = security.write_admin_files(work_dir)
        typer.echo(
            f"SASL_SSL with ACLs enforced; as the admin: `source {env}` (outbox commands),"
            f" --command-config {properties} (Kafka's tools)",
            err=True,
        )
    typer.echo(f"bootstrap: {kafka.bootstrap_servers}")


def _pids(state: dict[str, object]) -> str:
    return ", ".join(str(pid) for pid in recorded_pids(state))


@kafka_app.command()
def stop(
    grace: Annotated[float, duration_option(help="How long after SIGTERM before SIGKILL")] = 30.0,
) -> None:
    """Stop the broker (every node of the cluster) that `start` recorded."""
    state = running_state()
    if state is None:
        typer.echo("Kafka is not running")
        return
    stop_recorded(state, grace)
    state_file().unlink(missing_ok=True)
    typer.echo(f"stopped Kafka (pids {_pids(state)})")


@kafka_app.command()
def status() -> None:
    """Exit 0 and print the bootstrap address if running, else exit 1."""
    state = running_state()
    if state is None:
        typer.echo("Kafka is not running")
        raise typer.Exit(1)
    nodes = int(state.get("nodes", 1))
    alive = [pid for pid in recorded_pids(state) if processes.pid_alive(pid)]
    shape = "" if nodes == 1 else f" {len(alive)} of {nodes} nodes,"
    typer.echo(f"running:{shape} pids {_pids(state)}, work dir {state['work_dir']}")
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
