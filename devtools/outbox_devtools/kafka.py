"""A real Apache Kafka broker as a local process, from the official jars.

Tests, the demo and the benchmarks need a broker with the real transaction
coordinator (the outbox relies on it), on machines without Docker. Maven fetches
the official ``kafka_2.13`` jars once into the cache; :class:`LocalKafka` then
runs one combined broker+controller KRaft node on loopback ports, configured so
that transactions work with a single replica. :class:`LocalKafkaCluster` runs
three (or more) such nodes with a static controller quorum and every internal
topic replicated three times, the shape production runs, so that leader and
coordinator moves can be shown.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from outbox import maven
from outbox_devtools import processes
from outbox_devtools.class_archive import ClassArchive, archive_path
from outbox_devtools.secure_kafka import BrokerSecurity

KAFKA_VERSION = "4.1.1"
SCALA_VERSION = "2.13"
# kafka-server 4.1.1 brings log4j-api/core 2.24.3 and slf4j-api 1.7.36; this is
# the matching slf4j-1.x binding, without which the broker logs nothing.
LOG4J_VERSION = "2.24.3"

DEFAULT_START_TIMEOUT = 90.0
QUICK_JIT_VARIABLE = "OUTBOX_DEV_KAFKA_QUICK_JIT"
"""Set to ``1``, local brokers compile with the JVM's quick compiler only (C1,
``-XX:TieredStopAtLevel=1``). The test suite sets it: its brokers live seconds to
minutes, and the optimising compiler (C2) spent more CPU compiling than it saved on
them. Measured 2026-12-04 on the 2-core machine, a broker started and 300 one-record
transactions committed, twice each: 7.3-8.6 CPU seconds and 6.0-7.1 s for the
transactions with both compilers, 3.6-4.2 CPU seconds and 3.5-4.1 s with C1 alone.
Benchmarks leave it unset: a long-running broker at full speed is what they measure."""
DEFAULT_STOP_GRACE = 30.0
TRANSACTION_STATE_PARTITIONS = 4
"""``transaction.state.log.num.partitions`` of every local broker (the default 50 slows starts)."""
OFFSETS_PARTITIONS = 4
"""``offsets.topic.num.partitions`` of every local broker."""
CLUSTER_NODE_COUNTS = range(3, 6)
"""Node counts a :class:`LocalKafkaCluster` accepts; one node is :class:`LocalKafka` itself."""
NAMESPACED_PORTS = (9092, 9093)
"""Client and controller port of a node on an address of its own (a network namespace)."""
_BROKER_JAR_GLOB = f"kafka_{SCALA_VERSION}-*.jar"

log = logging.getLogger(__name__)


class KafkaRuntimeError(RuntimeError):
    """The local broker could not be provided; the message says why."""


# --------------------------------------------------------------------- jars


def kafka_home() -> Path:
    """Per-version cache directory holding the generated pom and the jars."""
    return maven.cache_dir() / f"kafka-{KAFKA_VERSION}"


def ensure_kafka_jars() -> Path:
    """Directory with the broker's runtime classpath; runs Maven only the first time."""
    return maven.ensure_resolved(
        kafka_home(),
        maven.pom_xml(
            "local-kafka-runtime",
            KAFKA_VERSION,
            [
                ("org.apache.kafka", f"kafka_{SCALA_VERSION}", KAFKA_VERSION),
                ("org.apache.logging.log4j", "log4j-slf4j-impl", LOG4J_VERSION),
            ],
        ),
        what=f"Kafka {KAFKA_VERSION}",
        coordinates=f"org.apache.kafka:kafka_{SCALA_VERSION}:{KAFKA_VERSION}",
        required_glob=_BROKER_JAR_GLOB,
        error=KafkaRuntimeError,
    )


def _check_libs(libs: Path) -> None:
    if not any(libs.glob(_BROKER_JAR_GLOB)):
        raise KafkaRuntimeError(
            f"no Kafka broker jars ({_BROKER_JAR_GLOB}) in {libs}; "
            "run `outbox dev kafka fetch` or pass a directory from ensure_kafka_jars()"
        )


# ---------------------------------------------------------------- readiness


TEMPLATE_CLUSTER_ID = "b3V0Ym94LWxvY2FsLWthZg"
"""The cluster id of every plain local node, so its storage can come from a template.

Local clusters never meet, so sharing an id costs nothing; a secure node gets its own."""


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, url-safe base64 without padding.

    Like Kafka's own ``Uuid.randomUuid`` it never starts with ``-``, which
    command-line parsers would take for an option.
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(secrets.token_bytes(16)).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def _quiet_logger() -> logging.Logger:
    """librdkafka logs every refused connection while the broker boots; drop that."""
    quiet = logging.getLogger("outbox_devtools.kafka.probe")
    quiet.propagate = False
    if not quiet.handlers:
        quiet.addHandler(logging.NullHandler())
    return quiet


def broker_answers(
    bootstrap: str, timeout: float = 2.0, client: Mapping[str, str] | None = None
) -> bool:
    """True when a metadata request is answered and lists at least one broker.

    ``client``: further librdkafka properties, such as a secure broker's credentials.
    """
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(
        {
            **(client or {}),
            "bootstrap.servers": bootstrap,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 500,
            "logger": _quiet_logger(),
        }
    )
    try:
        return bool(admin.list_topics(timeout=timeout).brokers)
    except Exception:  # KafkaException while the broker is still starting
        return False


def wait_for_broker(
    bootstrap: str,
    timeout: float = DEFAULT_START_TIMEOUT,
    alive: Callable[[], bool] | None = None,
    client: Mapping[str, str] | None = None,
) -> bool:
    """Poll until the broker answers; stops early (False) once ``alive`` says it died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            return False
        wait = min(2.0, max(0.1, deadline - time.monotonic()))
        if broker_answers(bootstrap, timeout=wait, client=client):
            return True
        time.sleep(0.2)
    return False


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Same option the JVM uses, so TIME_WAIT leftovers of our last run don't count.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def quick_jit_wanted() -> bool:
    """Whether :data:`QUICK_JIT_VARIABLE` asks for the quick JIT: ``1`` yes, unset, empty
    or ``0`` no; anything else is refused, naming the variable, rather than read as no."""
    value = os.environ.get(QUICK_JIT_VARIABLE, "").strip()
    if value not in ("", "0", "1"):
        raise KafkaRuntimeError(f"{QUICK_JIT_VARIABLE}={value!r}: use 1 (C1 only) or 0 (both JITs)")
    return value == "1"


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise KafkaRuntimeError("Java 17+ ('java') is not on PATH and JAVA_HOME is not set")
    return found


# ------------------------------------------------------------------- broker

_LOG4J2_XML = """<?xml version="1.0" encoding="UTF-8"?>
<!-- Broker log to stdout, which LocalKafka appends to kafka.log in the work dir. -->
<Configuration status="WARN">
  <Appenders>
    <Console name="stdout" target="SYSTEM_OUT">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </Console>
  </Appenders>
  <Loggers>
    <Root level="INFO"><AppenderRef ref="stdout"/></Root>
    <Logger name="org.apache.kafka.common.config.AbstractConfig" level="WARN"/>
    <Logger name="kafka.request.logger" level="WARN"/>
    <Logger name="state.change.logger" level="WARN"/>
    <Logger name="kafka.log.LogCleaner" level="WARN"/>
    <Logger name="org.apache.kafka.common.utils.AppInfoParser" level="WARN"/>
  </Loggers>
</Configuration>
"""


def replication_properties(replicas: int) -> dict[str, str]:
    """Cluster-wide settings for a cluster of ``replicas`` nodes (capped at 3 copies).

    Three copies with ``min.insync.replicas=2`` is the production shape: one
    node may be down and acks=all writes, transactions and offset commits go on.
    With fewer copies the minimum in-sync count is 1, else nothing could be written.
    """
    copies = min(3, replicas)
    min_isr = "2" if copies >= 3 else "1"
    return {
        "num.partitions": "1",
        "default.replication.factor": str(copies),
        "min.insync.replicas": min_isr,
        "offsets.topic.replication.factor": str(copies),
        "offsets.topic.num.partitions": str(OFFSETS_PARTITIONS),
        "transaction.state.log.replication.factor": str(copies),
        "transaction.state.log.min.isr": min_isr,
        "transaction.state.log.num.partitions": str(TRANSACTION_STATE_PARTITIONS),
        "share.coordinator.state.topic.replication.factor": str(copies),
        "share.coordinator.state.topic.min.isr": min_isr,
        "share.coordinator.state.topic.num.partitions": "4",
        "group.initial.rebalance.delay.ms": "0",
        # After a SIGKILL the controller keeps the dead incarnation registered
        # until its session expires (default 9s); shorter makes crash tests quicker.
        "broker.session.timeout.ms": "5000",
        "broker.heartbeat.interval.ms": "1000",
        "auto.create.topics.enable": "false",
    }


@dataclass(frozen=True)
class Quorum:
    """What the nodes of one multi-node cluster share: its id and the controller voters.

    A static quorum (``controller.quorum.voters``) needs no ``--standalone`` format
    and no later ``add-controller``: every node is formatted with the same cluster
    id and knows all voters from its first start.
    """

    cluster_id: str
    voters: tuple[tuple[int, str, int], ...]
    """(node id, host, controller port) of every node."""

    @property
    def voters_property(self) -> str:
        return ",".join(f"{node}@{host}:{port}" for node, host, port in self.voters)


class LocalKafka:
    """One KRaft node (broker+controller) on loopback, data kept in ``work_dir``.

    Ports are chosen once and kept, so :meth:`restart` (and ``stop`` then
    ``start``) brings back the same cluster at the same address with its data,
    which is what crash and restart tests need. With ``security`` the node
    serves SASL_SSL with ACLs enforced instead of PLAINTEXT (:mod:`outbox_devtools.secure_kafka`).
    """

    def __init__(
        self,
        work_dir: Path | None = None,
        *,
        libs_dir: Path | None = None,
        host: str = "127.0.0.1",
        port: int | None = None,
        controller_port: int | None = None,
        heap: str = "512m",
        start_timeout: float = DEFAULT_START_TIMEOUT,
        detached: bool = False,
        overrides: dict[str, str] | None = None,
        node_id: int = 1,
        quorum: Quorum | None = None,
        security: BrokerSecurity | None = None,
        launcher: Sequence[str] = (),
    ) -> None:
        """``quorum`` makes this node one of a :class:`LocalKafkaCluster` (see there).

        ``launcher`` prefixes the JVM's command, e.g. ``ip netns exec NAME`` to run the node
        in a network namespace of the chaos run (then ``host`` is that namespace's address
        and the ports are its own: the machine's are not checked)."""
        self._owns_work_dir = work_dir is None
        self.work_dir = Path(work_dir) if work_dir else _temp_work_dir()
        self.libs_dir = libs_dir
        self.host = host
        self.port = port or processes.free_port(host)
        self.controller_port = controller_port or _another_free_port(host, self.port)
        self.heap = heap
        self.start_timeout = start_timeout
        self.detached = detached
        self.overrides = dict(overrides or {})
        self.node_id = node_id
        self.quorum = quorum
        self.security = security
        self.launcher = list(launcher)
        self.last_start_seconds: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._class_archive: ClassArchive | None = None
        self._atexit_registered = False

    # -- addresses and files

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.work_dir / "kafka.log"

    @property
    def data_dir(self) -> Path:
        return self.work_dir / "data"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def server_properties(self) -> dict[str, str]:
        """This node's listeners, its quorum, the cluster-wide replication, then ``overrides``."""
        replicas = len(self.quorum.voters) if self.quorum else 1
        return {
            **self.node_properties(),
            **self.quorum_properties(),
            **replication_properties(replicas),
            **self.overrides,
        }

    def node_properties(self) -> dict[str, str]:
        """What only this node has: its id, roles, listeners and data dir."""
        controller = f"{self.host}:{self.controller_port}"
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.listener.names": "CONTROLLER",
            "listeners": f"PLAINTEXT://{self.bootstrap_servers},CONTROLLER://{controller}",
            "advertised.listeners": (
                f"PLAINTEXT://{self.bootstrap_servers},CONTROLLER://{controller}"
            ),
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir),
        }
        if self.security is not None:
            self.security.prepare(self.work_dir)
            props.update(self.security.node_properties(self.bootstrap_servers, controller))
        return props

    def quorum_properties(self) -> dict[str, str]:
        """The static controller voters: this node alone, or every node of its cluster.

        Static, not a dynamic quorum (``--standalone``): a dynamic quorum's first
        voter is written into the formatted storage with its port, so every node
        would need its own format (a JVM, 1-2 s); static storage is the same for
        every node of an id and is copied from a template (:meth:`_format_storage`).
        """
        voters = self.quorum.voters_property if self.quorum else self.voter
        return {"controller.quorum.voters": voters}

    @property
    def voter(self) -> str:
        """This node as a controller voter: ``id@host:port``."""
        return f"{self.node_id}@{self.host}:{self.controller_port}"

    def _write_config(self, name: str = "server.properties", **changes: str) -> Path:
        """This node's ``server_properties`` (with ``changes``) as ``name`` in its work dir."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        path = self.work_dir / name
        lines = [f"{key}={value}" for key, value in {**self.server_properties(), **changes}.items()]
        path.write_text("# written by outbox_devtools.kafka.LocalKafka\n" + "\n".join(lines) + "\n")
        (self.work_dir / "log4j2.xml").write_text(_LOG4J2_XML)
        return path

    def _java_argv(
        self, main_class: str, *args: str, heap: str, jvm_flags: Sequence[str] = ()
    ) -> list[str]:
        libs = self.libs_dir or ensure_kafka_jars()
        quick_jit = quick_jit_wanted()
        # The JVM's temporary files (native libraries it unpacks: snappy, lz4, zstd) go
        # to /tmp whatever TMPDIR says; in the work dir they go when the node does.
        temp_dir = self.work_dir / "tmp"
        temp_dir.mkdir(parents=True, exist_ok=True)
        return [
            _java(),
            *jvm_flags,
            *(["-XX:TieredStopAtLevel=1"] if quick_jit else []),
            f"-Xmx{heap}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.work_dir / 'log4j2.xml'}",
            f"-Dkafka.logs.dir={self.work_dir}",
            f"-Djava.io.tmpdir={temp_dir}",
            "-cp",
            f"{libs}/*",
            main_class,
            *args,
        ]

    @property
    def cluster_id(self) -> str:
        return self.quorum.cluster_id if self.quorum else TEMPLATE_CLUSTER_ID

    def _format_storage(self, config: Path) -> None:
        """First start only: KRaft refuses to run on an unformatted log dir.

        A plain node's formatted storage depends only on its node id and cluster id,
        so it is formatted once per Kafka version into a template and copied; a
        secure node's holds its admin's credentials and is formatted each time.
        """
        if (self.data_dir / "meta.properties").is_file():
            return
        if self.security is not None or self.cluster_id != TEMPLATE_CLUSTER_ID:
            self._run_storage_format(config, self.data_dir)
            return
        template = kafka_home() / "storage-templates" / f"node-{self.node_id}"
        if not (template / "meta.properties").is_file():
            staging = template.with_name(f".{template.name}-{os.getpid()}-{secrets.token_hex(4)}")
            self._run_storage_format(
                self._write_config("format.properties", **{"log.dirs": str(staging)}), staging
            )
            with contextlib.suppress(OSError):  # another process made it first
                staging.rename(template)
            shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(template, self.data_dir, dirs_exist_ok=True)

    def _run_storage_format(self, config: Path, data_dir: Path) -> None:
        """Kafka's StorageTool on ``config``, whose ``log.dirs`` is ``data_dir``."""
        argv = self._java_argv(
            "kafka.tools.StorageTool",
            "format",
            f"--cluster-id={self.cluster_id}",
            f"--config={config}",
            *(self.security.format_arguments() if self.security is not None else ()),
            heap="256m",
        )
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if result.returncode != 0:
            output = "\n".join((result.stdout + result.stderr).splitlines()[-40:])
            raise KafkaRuntimeError(
                f"formatting Kafka storage in {data_dir} failed "
                f"(exit {result.returncode}):\n{output}"
            )

    # -- lifecycle

    def start(self) -> LocalKafka:
        """Start and block until a metadata request is answered; idempotent."""
        if self.is_running():
            return self
        began = time.monotonic()
        self.prepare()
        self.launch()
        self.await_ready(began)
        return self

    def prepare(self) -> None:
        """Everything before the JVM: jars, free ports, config, formatted storage.

        Split from :meth:`launch` so a cluster can format its nodes in threads
        while it launches them from its own thread (see :meth:`launch`).
        """
        if self.libs_dir is None:
            self.libs_dir = ensure_kafka_jars()
        _check_libs(self.libs_dir)
        for port in () if self.launcher else (self.port, self.controller_port):
            if _port_in_use(self.host, port):
                raise KafkaRuntimeError(
                    f"port {port} on {self.host} is already in use; "
                    "cannot start the local Kafka broker there"
                )
        self._format_storage(self._write_config())

    def launch(self) -> None:
        """Spawn the JVM without waiting for it.

        Attached JVMs die with the thread that forked them (PR_SET_PDEATHSIG), so
        this runs on the caller's long-lived thread, never on a helper thread.
        """
        config = self.work_dir / "server.properties"
        assert self.libs_dir is not None  # (prepare)
        self._settle_class_archive(exited_cleanly=False)  # a JVM that ended by itself
        self._class_archive = ClassArchive(archive_path(self.libs_dir, _java()))
        argv = [
            *self.launcher,
            *self._java_argv(
                "kafka.Kafka",
                str(config),
                heap=self.heap,
                jvm_flags=self._class_archive.jvm_flags(may_write=not self.detached),
            ),
        ]
        self._proc = processes.spawn(argv, log_path=self.log_path, detached=self.detached)
        if not self.detached and not self._atexit_registered:
            atexit.register(self._stop_at_exit)
            self._atexit_registered = True

    def _probe_client(self) -> dict[str, str] | None:
        """What a readiness probe needs beyond the address: a secure node's admin login."""
        return self.security.client_config() if self.security is not None else None

    def answers(self) -> bool:
        """Whether this node answers a metadata request now."""
        return self.is_running() and broker_answers(
            self.bootstrap_servers, timeout=1.0, client=self._probe_client()
        )

    def ready_steps(self) -> Iterator[None]:
        """:meth:`await_ready` a step at a time, for a caller that must keep ticking."""
        began = time.monotonic()
        while not self.answers():
            if not self.is_running() or time.monotonic() - began > self.start_timeout:
                self._fail_start()
            yield

    def await_ready(self, began: float) -> None:
        """Block until the launched node answers; a JVM that exits or hangs is an error."""
        ready = wait_for_broker(
            self.bootstrap_servers, self.start_timeout, self.is_running, client=self._probe_client()
        )
        if not ready:
            self._fail_start()
        self.last_start_seconds = time.monotonic() - began
        log.info(
            "Kafka %s node %s ready on %s in %.1fs (pid %s, work dir %s)",
            KAFKA_VERSION,
            self.node_id,
            self.bootstrap_servers,
            self.last_start_seconds,
            self.pid,
            self.work_dir,
        )

    def _fail_start(self) -> None:
        assert self._proc is not None
        code = self._proc.poll()
        if code is None:
            self.kill()
            problem = f"did not answer on {self.bootstrap_servers} within {self.start_timeout:.0f}s"
        else:
            problem = f"exited with code {code} during start"
        self._proc = None
        raise KafkaRuntimeError(
            f"Kafka broker {problem}; tail of {self.log_path}:\n{processes.log_tail(self.log_path)}"
        )

    def stop(self, grace_seconds: float = DEFAULT_STOP_GRACE) -> None:
        """Clean shutdown (SIGTERM, SIGKILL after the grace); data and ports are kept."""
        if self._proc is not None:
            processes.stop_pid(self._proc.pid, grace_seconds)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=1)
            self._settle_class_archive(exited_cleanly=self._proc.returncode not in (None, -9))
            self._proc = None

    def kill(self) -> None:
        """SIGKILL with no shutdown hooks, like a crashed machine's broker."""
        if self._proc is not None:
            processes.kill_pid(self._proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=1)
            self._settle_class_archive(exited_cleanly=False)
            self._proc = None

    def _settle_class_archive(self, *, exited_cleanly: bool) -> None:
        if self._class_archive is not None:
            self._class_archive.settle(exited_cleanly=exited_cleanly)

    def freeze(self) -> None:
        """SIGSTOP: a stalled machine, not a crash.

        Clients keep their connections open and hear nothing, the case where a
        client waiting on an answer (rather than on a refused connection) can wedge.
        """
        if not self.is_running():
            raise KafkaRuntimeError("cannot freeze a broker that is not running")
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)
        wait_until_stopped(self._proc.pid)

    def thaw(self) -> None:
        """SIGCONT after :meth:`freeze` (a broker stopped or killed meanwhile: nothing to do)."""
        if self.is_running():
            assert self._proc is not None
            self._proc.send_signal(signal.SIGCONT)

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """Frozen for the block, then thawed."""
        self.freeze()
        try:
            yield
        finally:
            self.thaw()

    def restart(self, grace_seconds: float = DEFAULT_STOP_GRACE) -> LocalKafka:
        """Stop cleanly and start again on the same ports with the same data."""
        self.stop(grace_seconds)
        return self.start()

    def close(self) -> None:
        """Stop, and delete the work dir if this object made it up."""
        self.stop()
        if self._atexit_registered:
            atexit.unregister(self._stop_at_exit)
            self._atexit_registered = False
        if self._owns_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def _stop_at_exit(self) -> None:
        # Backstop for attached brokers; PR_SET_PDEATHSIG covers hard deaths.
        self.stop(grace_seconds=10.0)

    def __enter__(self) -> LocalKafka:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"LocalKafka(node {self.node_id}, {self.bootstrap_servers}, pid={self.pid}, "
            f"work_dir={self.work_dir})"
        )


def _temp_work_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="outbox-kafka-"))


def _another_free_port(host: str, taken: int) -> int:
    """free_port may hand back the port just released; the two listeners need two."""
    while True:
        port = processes.free_port(host)
        if port != taken:
            return port


# ------------------------------------------------------------------ cluster


def java_string_hash(text: str) -> int:
    """``String.hashCode()`` of the JVM: 31-polynomial over UTF-16 code units, as an int32."""
    units = text.encode("utf-16-be")
    value = 0
    for index in range(0, len(units), 2):
        value = (31 * value + int.from_bytes(units[index : index + 2], "big")) & 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def coordinator_partition(key: str, partitions: int) -> int:
    """The internal-topic partition whose leader coordinates ``key``: a transactional id in
    ``__transaction_state``, a consumer group in ``__consumer_offsets``.

    Kafka's ``Utils.abs`` maps ``Integer.MIN_VALUE`` to 0 (``Math.abs`` would
    keep it negative), then takes the remainder by the partition count.
    """
    value = java_string_hash(key)
    return (0 if value == -(1 << 31) else abs(value)) % partitions


def check_node_count(nodes: int) -> None:
    """One node, or a cluster that survives losing one: 3 to 5.

    Two nodes are refused: two controller voters lose their quorum when either
    stops, and with two copies and ``min.insync.replicas=2`` every acks=all write
    (halves, ops, transactions) stops with one broker down, so a two-node cluster
    shows nothing that one node does not.
    """
    if nodes != 1 and nodes not in CLUSTER_NODE_COUNTS:
        raise KafkaRuntimeError(
            f"a local Kafka runs 1 node or a cluster of {CLUSTER_NODE_COUNTS.start} to "
            f"{CLUSTER_NODE_COUNTS.stop - 1}, not {nodes}"
            + (
                " (two voters lose their quorum and, with min.insync.replicas=2,"
                " every write stops when either node is down)"
                if nodes == 2
                else ""
            )
        )


def _distinct_free_ports(host: str, count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = processes.free_port(host)
        if port not in ports:
            ports.append(port)
    return ports


def _in_parallel(calls: list[Callable[[], object]]) -> None:
    """Run ``calls`` on threads and raise the first error; for work that spawns nothing."""
    errors: list[BaseException] = []

    def call(target: Callable[[], object]) -> None:
        try:
            target()
        except BaseException as exc:  # re-raised on the caller's thread below
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(c,), daemon=True) for c in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


class LocalKafkaCluster:
    """Three (to five) KRaft nodes, each broker and controller, with a static quorum.

    Each node is a :class:`LocalKafka` in ``work_dir/node-<id>`` (``nodes[i]`` has
    node id ``i + 1``) that can be stopped, killed, frozen and restarted on its
    own; ports are chosen once and kept. Internal topics and new topics get three
    copies with ``min.insync.replicas=2`` (:func:`replication_properties`).
    """

    def __init__(
        self,
        work_dir: Path | None = None,
        *,
        nodes: int = 3,
        libs_dir: Path | None = None,
        host: str = "127.0.0.1",
        ports: list[tuple[int, int]] | None = None,
        heap: str = "512m",
        start_timeout: float = DEFAULT_START_TIMEOUT,
        detached: bool = False,
        overrides: dict[str, str] | None = None,
        hosts: Sequence[str] | None = None,
        launchers: Sequence[Sequence[str]] | None = None,
    ) -> None:
        """``ports``: (client, controller) per node, e.g. to bring a recorded cluster back.

        ``hosts`` and ``launchers``: each node's own address and command prefix (see
        :class:`LocalKafka`), for nodes in network namespaces that can be cut from each
        other; each node then has the default ports on its own address."""
        if nodes == 1:
            raise KafkaRuntimeError("a single node is LocalKafka; LocalKafkaCluster needs 3 to 5")
        check_node_count(nodes)
        if ports is not None and len(ports) != nodes:
            raise KafkaRuntimeError(f"{len(ports)} port pairs given for {nodes} nodes")
        self._owns_work_dir = work_dir is None
        self.work_dir = Path(work_dir) if work_dir else _temp_work_dir()
        node_hosts = list(hosts) if hosts is not None else [host] * nodes
        node_launchers = [list(x) for x in launchers] if launchers is not None else [[]] * nodes
        if len(node_hosts) != nodes or len(node_launchers) != nodes:
            raise KafkaRuntimeError(f"{nodes} nodes need {nodes} hosts and launchers")
        if ports is None and hosts is not None:
            ports = [(NAMESPACED_PORTS[0], NAMESPACED_PORTS[1])] * nodes
        if ports is None:
            flat = _distinct_free_ports(host, 2 * nodes)
            ports = [(flat[2 * i], flat[2 * i + 1]) for i in range(nodes)]
        self.quorum = Quorum(
            TEMPLATE_CLUSTER_ID,
            tuple((i + 1, node_hosts[i], controller) for i, (_, controller) in enumerate(ports)),
        )
        self.nodes = [
            LocalKafka(
                self.work_dir / f"node-{i + 1}",
                libs_dir=libs_dir,
                host=node_hosts[i],
                port=port,
                controller_port=controller,
                heap=heap,
                start_timeout=start_timeout,
                detached=detached,
                overrides=overrides,
                node_id=i + 1,
                quorum=self.quorum,
                launcher=node_launchers[i],
            )
            for i, (port, controller) in enumerate(ports)
        ]
        self.start_timeout = start_timeout
        self.last_start_seconds: float | None = None

    @property
    def bootstrap_servers(self) -> str:
        """Every node's address, so a client finds the cluster with any node down."""
        return ",".join(node.bootstrap_servers for node in self.nodes)

    def node(self, node_id: int) -> LocalKafka:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise KafkaRuntimeError(f"no node {node_id} in this cluster (nodes 1-{len(self.nodes)})")

    def is_running(self) -> bool:
        """Every node runs (one down is a degraded cluster, not a stopped one)."""
        return all(node.is_running() for node in self.nodes)

    # -- lifecycle

    def start(self) -> LocalKafkaCluster:
        """Start the nodes that are down, together, until every broker is registered.

        The nodes must start together: none answers before a majority of the
        controller voters has elected a leader.
        """
        began = time.monotonic()
        down = [node for node in self.nodes if not node.is_running()]
        try:
            _in_parallel([node.prepare for node in down])
            for node in down:
                node.launch()
            _in_parallel([lambda node=node: node.await_ready(began) for node in down])
            self.wait_for_brokers(self.start_timeout)
        except BaseException:
            for node in down:
                node.kill()
            raise
        self.last_start_seconds = time.monotonic() - began
        log.info(
            "Kafka cluster of %d nodes ready on %s in %.1fs",
            len(self.nodes),
            self.bootstrap_servers,
            self.last_start_seconds,
        )
        return self

    def stop(self, grace_seconds: float = DEFAULT_STOP_GRACE) -> None:
        """SIGTERM to every node at once (one by one, the last would wait for a lost quorum)."""
        _in_parallel([lambda node=node: node.stop(grace_seconds) for node in self.nodes])

    def kill(self) -> None:
        for node in self.nodes:
            node.kill()

    def close(self) -> None:
        """Stop every node, and delete the work dir if this object made it up."""
        self.stop(grace_seconds=10.0)
        for node in self.nodes:
            node.close()
        if self._owns_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> LocalKafkaCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LocalKafkaCluster({self.bootstrap_servers}, work_dir={self.work_dir})"

    # -- who does what

    def _admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap_servers, "logger": _quiet_logger()})

    def leader_of(self, topic: str, partition: int, timeout: float = 30.0) -> LocalKafka:
        """The node leading ``topic``/``partition`` now (waits while it has no leader)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                metadata = self._admin().list_topics(topic, timeout=5)
                leader = metadata.topics[topic].partitions[partition].leader
            except Exception:  # KafkaException, or the topic/partition not known yet
                leader = -1
            if leader >= 0:
                return self.node(leader)
            if time.monotonic() > deadline:
                raise KafkaRuntimeError(f"{topic}[{partition}] has no leader after {timeout:.0f}s")
            time.sleep(0.2)

    def transaction_coordinator_of(self, transactional_id: str) -> LocalKafka:
        """The node whose transaction coordinator serves ``transactional_id``.

        That is the leader of the ``__transaction_state`` partition the id hashes
        to; the topic exists once a first transactional producer initialised.
        """
        partition = coordinator_partition(transactional_id, TRANSACTION_STATE_PARTITIONS)
        return self.leader_of("__transaction_state", partition)

    def group_coordinator_of(self, group_id: str) -> LocalKafka:
        """The node whose group coordinator serves consumer group ``group_id``.

        The leader of the ``__consumer_offsets`` partition the group hashes to;
        the topic exists once a first group committed or joined.
        """
        partition = coordinator_partition(group_id, OFFSETS_PARTITIONS)
        return self.leader_of("__consumer_offsets", partition)

    def under_replicated(self) -> list[str]:
        """Partitions (internal ones too) whose in-sync replicas are not all their replicas.

        Also names nodes that are down or not registered, whose partitions would
        otherwise only show up once the controller notices.
        """
        try:
            metadata = self._admin().list_topics(timeout=5)
        except Exception as exc:  # KafkaException: no node answers
            return [f"no metadata ({exc})"]
        behind = [
            f"node {node.node_id} not registered"
            for node in self.nodes
            if node.node_id not in metadata.brokers
        ]
        for topic in metadata.topics.values():
            for partition in topic.partitions.values():
                if partition.leader < 0 or set(partition.isrs) != set(partition.replicas):
                    behind.append(f"{topic.topic}[{partition.id}] isr {sorted(partition.isrs)}")
        return behind

    def in_sync_steps(self, timeout: float = 120.0) -> Iterator[None]:
        """Yield until every partition has all its replicas in sync again; raise past ``timeout``.

        A generator, so a controller that must keep doing other work while a
        node catches up can advance it a step at a time.
        """
        deadline = time.monotonic() + timeout
        while behind := self.under_replicated():
            if time.monotonic() > deadline:
                raise KafkaRuntimeError(
                    f"in-sync replicas not recovered within {timeout:.0f}s: "
                    + ", ".join(behind[:10])
                )
            yield

    def wait_in_sync(self, timeout: float = 120.0) -> None:
        """Block until every partition's in-sync replicas are complete (after a restart)."""
        for _ in self.in_sync_steps(timeout):
            time.sleep(0.2)

    def wait_for_brokers(self, timeout: float) -> None:
        """Block until the metadata lists every node as a broker."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                registered = set(self._admin().list_topics(timeout=2).brokers)
            except Exception:  # KafkaException while nodes start
                registered = set()
            missing = [n.node_id for n in self.nodes if n.node_id not in registered]
            if not missing:
                return
            if time.monotonic() > deadline:
                raise KafkaRuntimeError(
                    f"nodes {missing} of the cluster did not register within {timeout:.0f}s"
                )
            time.sleep(0.2)

    def rolling_restart_steps(self, grace_seconds: float = DEFAULT_STOP_GRACE) -> Iterator[str]:
        """Restart the nodes one at a time, each once the replicas are in sync again.

        Yields a line on each node it restarts and ``""`` while it waits, so the
        caller keeps its own loop going (the restarted JVM is spawned on the
        caller's thread, which it must die with).
        """
        yield from ("" for _ in self.in_sync_steps())
        for node in self.nodes:
            yield f"restarting node {node.node_id}"
            node.stop(grace_seconds)
            node.prepare()
            node.launch()
            yield from ("" for _ in node.ready_steps())
            yield from ("" for _ in self.in_sync_steps())

    def rolling_restart(self, grace_seconds: float = DEFAULT_STOP_GRACE) -> None:
        """:meth:`rolling_restart_steps`, blocking."""
        for _ in self.rolling_restart_steps(grace_seconds):
            time.sleep(0.2)


# ------------------------------------------------- the `outbox dev kafka` broker


def state_file() -> Path:
    """Where ``outbox dev kafka start`` records its detached broker."""
    return processes.state_dir() / "kafka.json"


def _is_kafka_jvm(pid: int) -> bool:
    """Guards against a recycled pid: only a live ``kafka.Kafka`` JVM counts."""
    if not processes.pid_alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc to look at: trust the pid
    return b"kafka.Kafka" in cmdline


def recorded_pids(state: dict[str, Any]) -> list[int]:
    """Every node's pid in a state record (``pids`` for a cluster, ``pid`` for one node)."""
    return [int(pid) for pid in state.get("pids", [state.get("pid", 0)])]


def running_state() -> dict[str, Any] | None:
    """The recorded dev broker (or cluster, while any node lives); a stale record is removed."""
    path = state_file()
    try:
        state: dict[str, Any] = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    if any(_is_kafka_jvm(pid) for pid in recorded_pids(state)):
        return state
    path.unlink(missing_ok=True)
    return None


FREEZE_WAIT_SECONDS = 2.0


def wait_until_stopped(pid: int, timeout: float = FREEZE_WAIT_SECONDS) -> None:
    """Return once every thread of ``pid`` is stopped (after a SIGSTOP), or ``timeout`` passed.

    The signal is delivered asynchronously: a request sent right after ``kill`` was
    once answered by the broker it was meant to find frozen (a flaky test).
    """
    tasks = Path(f"/proc/{pid}/task")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            states = [
                (task / "stat").read_text().rsplit(")", 1)[1].split()[0] for task in tasks.iterdir()
            ]
        except (OSError, IndexError):
            return  # gone, or no /proc: nothing to wait for
        if states and all(state in ("T", "t") for state in states):
            return
        time.sleep(0.005)


def stop_recorded(state: dict[str, Any], grace_seconds: float) -> None:
    """Stop every recorded node at once (one by one, the last waits for a lost quorum)."""
    _in_parallel(
        [
            lambda pid=pid: processes.stop_pid(pid, grace_seconds)
            for pid in recorded_pids(state)
            if _is_kafka_jvm(pid)
        ]
    )


def running_bootstrap() -> str | None:
    """Bootstrap address of the ``outbox dev kafka start`` broker, if one runs."""
    state = running_state()
    return str(state["bootstrap"]) if state else None
