"""A real Apache Kafka broker as a local process, from the official jars.

Tests, the demo and the benchmarks need a broker with the real transaction
coordinator (the outbox relies on it), on machines without Docker. Maven fetches
the official ``kafka_2.13`` jars once into the cache; :class:`LocalKafka` then
runs one combined broker+controller KRaft node on loopback ports, configured so
that transactions work with a single replica.
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
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from outbox_devtools import processes
from outbox_devtools.secure_kafka import BrokerSecurity
from spark_sink import maven

KAFKA_VERSION = "4.1.1"
SCALA_VERSION = "2.13"
# kafka-server 4.1.1 brings log4j-api/core 2.24.3 and slf4j-api 1.7.36; this is
# the matching slf4j-1.x binding, without which the broker logs nothing.
LOG4J_VERSION = "2.24.3"

DEFAULT_START_TIMEOUT = 90.0
DEFAULT_STOP_GRACE = 30.0
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
        security: BrokerSecurity | None = None,
    ) -> None:
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
        self.security = security
        self.last_start_seconds: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
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
        """Single-node settings: every internal topic with one replica and min ISR 1."""
        controller = f"{self.host}:{self.controller_port}"
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": controller,
            "controller.listener.names": "CONTROLLER",
            "listeners": f"PLAINTEXT://{self.bootstrap_servers},CONTROLLER://{controller}",
            "advertised.listeners": (
                f"PLAINTEXT://{self.bootstrap_servers},CONTROLLER://{controller}"
            ),
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir),
            "num.partitions": "1",
            "default.replication.factor": "1",
            "min.insync.replicas": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "share.coordinator.state.topic.num.partitions": "4",
            "group.initial.rebalance.delay.ms": "0",
            # After a SIGKILL the controller keeps the dead incarnation registered
            # until its session expires (default 9s); shorter makes crash tests quicker.
            "broker.session.timeout.ms": "5000",
            "broker.heartbeat.interval.ms": "1000",
            "auto.create.topics.enable": "false",
        }
        if self.security is not None:
            self.security.prepare(self.work_dir)
            props.update(self.security.node_properties(self.bootstrap_servers, controller))
        props.update(self.overrides)
        return props

    def _write_config(self) -> Path:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        path = self.work_dir / "server.properties"
        lines = [f"{key}={value}" for key, value in self.server_properties().items()]
        path.write_text("# written by outbox_devtools.kafka.LocalKafka\n" + "\n".join(lines) + "\n")
        (self.work_dir / "log4j2.xml").write_text(_LOG4J2_XML)
        return path

    def _java_argv(self, main_class: str, *args: str, heap: str) -> list[str]:
        libs = self.libs_dir or ensure_kafka_jars()
        return [
            _java(),
            f"-Xmx{heap}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.work_dir / 'log4j2.xml'}",
            f"-Dkafka.logs.dir={self.work_dir}",
            "-cp",
            f"{libs}/*",
            main_class,
            *args,
        ]

    def _format_storage(self, config: Path) -> None:
        """First start only: KRaft refuses to run on an unformatted log dir."""
        if (self.data_dir / "meta.properties").is_file():
            return
        argv = self._java_argv(
            "kafka.tools.StorageTool",
            "format",
            "--standalone",
            f"--cluster-id={new_cluster_id()}",
            f"--config={config}",
            *(self.security.format_arguments() if self.security is not None else ()),
            heap="256m",
        )
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
        if result.returncode != 0:
            output = "\n".join((result.stdout + result.stderr).splitlines()[-40:])
            raise KafkaRuntimeError(
                f"formatting Kafka storage in {self.data_dir} failed "
                f"(exit {result.returncode}):\n{output}"
            )

    # -- lifecycle

    def start(self) -> LocalKafka:
        """Start and block until a metadata request is answered; idempotent."""
        if self.is_running():
            return self
        began = time.monotonic()
        if self.libs_dir is None:
            self.libs_dir = ensure_kafka_jars()
        _check_libs(self.libs_dir)
        for port in (self.port, self.controller_port):
            if _port_in_use(self.host, port):
                raise KafkaRuntimeError(
                    f"port {port} on {self.host} is already in use; "
                    "cannot start the local Kafka broker there"
                )
        config = self._write_config()
        self._format_storage(config)
        argv = self._java_argv("kafka.Kafka", str(config), heap=self.heap)
        self._proc = processes.spawn(argv, log_path=self.log_path, detached=self.detached)
        if not self.detached and not self._atexit_registered:
            atexit.register(self._stop_at_exit)
            self._atexit_registered = True
        ready = wait_for_broker(
            self.bootstrap_servers,
            self.start_timeout,
            self.is_running,
            client=self.security.client_config() if self.security is not None else None,
        )
        if not ready:
            self._fail_start()
        self.last_start_seconds = time.monotonic() - began
        log.info(
            "Kafka %s ready on %s in %.1fs (pid %s, work dir %s)",
            KAFKA_VERSION,
            self.bootstrap_servers,
            self.last_start_seconds,
            self.pid,
            self.work_dir,
        )
        return self

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
            self._proc = None

    def kill(self) -> None:
        """SIGKILL with no shutdown hooks, like a crashed machine's broker."""
        if self._proc is not None:
            processes.kill_pid(self._proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=1)
            self._proc = None

    def freeze(self) -> None:
        """SIGSTOP: a stalled machine, not a crash.

        Clients keep their connections open and hear nothing, the case where a
        client waiting on an answer (rather than on a refused connection) can wedge.
        """
        if not self.is_running():
            raise KafkaRuntimeError("cannot freeze a broker that is not running")
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP)

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
        return f"LocalKafka({self.bootstrap_servers}, pid={self.pid}, work_dir={self.work_dir})"


def _temp_work_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="outbox-kafka-"))


def _another_free_port(host: str, taken: int) -> int:
    """free_port may hand back the port just released; the two listeners need two."""
    while True:
        port = processes.free_port(host)
        if port != taken:
            return port


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


def running_state() -> dict[str, Any] | None:
    """The recorded dev broker if it is still alive; a stale record is removed."""
    path = state_file()
    try:
        state: dict[str, Any] = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    if _is_kafka_jvm(int(state.get("pid", 0))):
        return state
    path.unlink(missing_ok=True)
    return None


def running_bootstrap() -> str | None:
    """Bootstrap address of the ``outbox dev kafka start`` broker, if one runs."""
    state = running_state()
    return str(state["bootstrap"]) if state else None
