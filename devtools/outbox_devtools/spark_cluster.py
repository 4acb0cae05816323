"""A real Spark standalone cluster on this machine: one master, workers, pyspark's own jars.

The sink's cluster claims (executors lost mid-stream, batches retried on the
survivors, every committed event landed once) hold only on a real cluster, not
in ``local[*]``, where the driver and its tasks share one JVM. This starts
Spark's standalone master and workers as local processes from the installed
pyspark (``spark-class org.apache.spark.deploy.master.Master`` /
``...worker.Worker``) on loopback ports, each worker with one core and little
memory, and submits applications to it with pyspark's ``spark-submit``.

A worker can be killed with SIGKILL together with the executors it launched:
what a machine losing power does to the cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from outbox_devtools.processes import (
    free_port,
    kill_pid,
    log_tail,
    pid_alive,
    spawn,
    stop_pid,
    wait_until,
)

HOST = "127.0.0.1"
START_TIMEOUT_SECONDS = 90.0
DAEMON_MEMORY = "256m"
"""Heap of the master and worker JVMs themselves (they only schedule)."""
WORKER_MEMORY = "1g"
"""What a worker offers its executors."""
EXECUTOR_MEMORY = "512m"


class SparkClusterError(RuntimeError):
    """The local Spark cluster could not start or answer."""


def spark_home() -> Path:
    """The installed pyspark, which ships Spark's jars and its ``bin`` scripts."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _children(pid: int) -> list[int]:
    """The direct children of ``pid`` (a worker's executor JVMs)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


@dataclass
class _Daemon:
    """One master or worker JVM."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    web_port: int

    @property
    def pid(self) -> int:
        return self.process.pid

    def state(self) -> dict[str, Any]:
        """Its web UI's JSON (the master's lists workers and apps; a worker's, executors)."""
        with urllib.request.urlopen(f"http://{HOST}:{self.web_port}/json/", timeout=5) as reply:
            return dict(json.load(reply))


class LocalSparkCluster:
    """A standalone master and ``workers`` workers (one core each) on loopback ports."""

    def __init__(self, work_dir: Path | None = None, workers: int = 2) -> None:
        self.work_dir = work_dir or Path(tempfile.mkdtemp(prefix="spark-cluster-"))
        self.worker_count = workers
        self.master_port = free_port()
        self.master: _Daemon | None = None
        self.workers: list[_Daemon] = []

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.master_port}"

    def _env(self) -> dict[str, str]:
        home = spark_home()
        return {
            **os.environ,
            "SPARK_HOME": str(home),
            "SPARK_LOCAL_IP": HOST,
            "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
            "SPARK_LOG_DIR": str(self.work_dir / "logs"),
            "SPARK_WORKER_DIR": str(self.work_dir / "work"),
            # Every JVM of the cluster keeps its temporary files (block managers, native
            # libraries) in the cluster's directory, not in /tmp, which outlives it.
            "SPARK_LOCAL_DIRS": str(self._temp_dir()),
            "SPARK_DAEMON_JAVA_OPTS": self._temp_dir_option(),
            # Executors run no Python of ours (built-in SQL only), but keep one at hand.
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }

    def _launch(self, name: str, main_class: str, *args: str) -> _Daemon:
        web_port = free_port()
        argv = [
            str(spark_home() / "bin" / "spark-class"),
            main_class,
            "--host",
            HOST,
            "--webui-port",
            str(web_port),
            *args,
        ]
        log_path = self.work_dir / f"{name}.log"
        process = spawn(argv, log_path=log_path, env=self._env(), cwd=self.work_dir)
        return _Daemon(name, process, log_path, web_port)

    def start(self) -> LocalSparkCluster:
        """Start the master, then the workers; return once every worker is registered."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.master = self._launch(
            "master", "org.apache.spark.deploy.master.Master", "--port", str(self.master_port)
        )
        self._await(lambda: self._answers(self.master), "the master did not answer")
        self.workers = [self._start_worker(index) for index in range(self.worker_count)]
        return self.heal()

    def heal(self) -> LocalSparkCluster:
        """Replace every worker that died (a test killed it); return once all are registered."""
        for index, worker in enumerate(self.workers):
            if not pid_alive(worker.pid):
                self.workers[index] = self._start_worker(index)
        self._await(
            lambda: self.alive_workers() == self.worker_count,
            f"{self.worker_count} workers did not register with the master",
        )
        return self

    def _start_worker(self, index: int) -> _Daemon:
        return self._launch(
            f"worker-{index}",
            "org.apache.spark.deploy.worker.Worker",
            "--port",
            str(free_port()),
            "--cores",
            "1",
            "--memory",
            WORKER_MEMORY,
            "--work-dir",
            str(self.work_dir / f"work-{index}"),
            self.master_url,
        )

    @staticmethod
    def _answers(daemon: _Daemon | None) -> bool:
        if daemon is None or not pid_alive(daemon.pid):
            raise SparkClusterError(
                f"the Spark {daemon.name if daemon else 'master'} exited:\n"
                f"{log_tail(daemon.log_path) if daemon else ''}"
            )
        try:
            daemon.state()
        except OSError:
            return False
        return True

    def _await(self, condition: Any, failure: str) -> None:
        if not wait_until(condition, START_TIMEOUT_SECONDS, step=0.5):
            logs = self.master.log_path if self.master else self.work_dir
            raise SparkClusterError(
                f"{failure} within {START_TIMEOUT_SECONDS:.0f}s:\n{log_tail(logs)}"
            )

    def alive_workers(self) -> int:
        assert self.master is not None
        try:
            return int(self.master.state().get("aliveworkers", 0))
        except OSError:
            return 0

    def executors_on(self, worker: _Daemon) -> int:
        """Executors ``worker`` runs now, by its own account."""
        try:
            return len(worker.state().get("executors", []))
        except OSError:
            return 0

    def kill_worker(self, worker: _Daemon) -> None:
        """SIGKILL the worker and the executors it launched: a machine lost mid-work."""
        executors = _children(worker.pid)
        kill_pid(worker.pid)
        for pid in executors:
            kill_pid(pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.process.wait(5)

    def submit_argv(
        self, script: str, args: Sequence[str], conf: dict[str, str], jars: Sequence[Path] = ()
    ) -> list[str]:
        """A ``spark-submit`` (client mode) of ``script`` to this cluster."""
        argv = [str(spark_home() / "bin" / "spark-submit"), "--master", self.master_url]
        if jars:
            argv += ["--jars", ",".join(str(jar) for jar in jars)]
        settings = {"spark.executor.memory": EXECUTOR_MEMORY, "spark.driver.host": HOST, **conf}
        for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
            settings[key] = f"{self._temp_dir_option()} {settings.get(key, '')}".strip()
        for key, value in settings.items():
            argv += ["--conf", f"{key}={value}"]
        return [*argv, script, *args]

    def _temp_dir(self) -> Path:
        path = self.work_dir / "tmp"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _temp_dir_option(self) -> str:
        return f"-Djava.io.tmpdir={self._temp_dir()}"

    def submit_env(self) -> dict[str, str]:
        return self._env()

    def stop(self) -> None:
        """Stop the workers, then the master (quiet for those already gone)."""
        for worker in self.workers:
            executors = _children(worker.pid)
            stop_pid(worker.pid, grace_seconds=10)
            for pid in executors:
                stop_pid(pid, grace_seconds=5)
        if self.master is not None:
            stop_pid(self.master.pid, grace_seconds=10)
        for daemon in [*self.workers, *([self.master] if self.master else [])]:
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.process.wait(5)

    def __enter__(self) -> LocalSparkCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LocalSparkCluster({self.master_url}, workers={self.worker_count})"
