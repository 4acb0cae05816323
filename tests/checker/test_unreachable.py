"""``outbox checker`` at bootstrap servers that do not answer says so, in seconds (issue 39).

It used to print nothing for the whole start timeout (a minute): its probe's log is kept
quiet, and nothing else spoke. Now one line on stderr after 5 s at most, naming the
bootstrap servers and what a connection to each met, again every
``unreachable_report_seconds`` (never every poll), and one line once the cluster answers.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka.admin import AdminClient

from outbox.admin import ensure_topics, plan_topics
from outbox.config import kafka_client_config
from outbox.protocol import TopicNames
from outbox_devtools.processes import free_port

REPORT_SECONDS = 2
"""The tests' ``unreachable_report_seconds``: the default (30 s) would make them wait."""


class Checker:
    """``outbox checker`` in a subprocess, each stderr line kept with when it came."""

    def __init__(self, bootstrap: str, **env: str) -> None:
        self.http = f"127.0.0.1:{free_port()}"
        self.started = time.monotonic()
        self.lines: list[tuple[float, str]] = []
        clean = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "outbox", "checker"],
            env={
                **clean,
                "OUTBOX_DEV_HOME": "/nonexistent-outbox-dev",
                "OUTBOX_BOOTSTRAP_SERVERS": bootstrap,
                "OUTBOX_HTTP_ADDRESS": self.http,
                "OUTBOX_START_TIMEOUT_SECONDS": "120",
                "OUTBOX_UNREACHABLE_REPORT_SECONDS": str(REPORT_SECONDS),
                "COLUMNS": "40",  # a narrow terminal: lines stay whole all the same
                **env,
            },
            stderr=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self._collect, daemon=True).start()

    def _collect(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append((time.monotonic() - self.started, line.rstrip("\n")))

    def wait_for(self, pattern: str, count: int = 1, within: float = 10.0) -> list[str]:
        """The first ``count`` lines matching ``pattern``, seen ``within`` seconds of start."""
        deadline = self.started + within
        while True:
            found = [(at, line) for at, line in self.lines if re.search(pattern, line)]
            if len(found) >= count:
                assert found[count - 1][0] <= within, self.text()
                return [line for _, line in found[:count]]
            assert time.monotonic() < deadline, f"no {count} x {pattern!r}:\n{self.text()}"
            assert self.process.poll() is None, f"checker exited:\n{self.text()}"
            time.sleep(0.1)

    def readyz(self) -> int:
        try:
            with urllib.request.urlopen(f"http://{self.http}/readyz", timeout=5) as reply:
                return int(reply.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    def text(self) -> str:
        return "\n".join(f"+{at:.1f}s {line}" for at, line in self.lines)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(10)


@pytest.fixture
def checker_at() -> Iterator[Callable[..., Checker]]:
    started: list[Checker] = []

    def start(bootstrap: str, **env: str) -> Checker:
        started.append(Checker(bootstrap, **env))
        return started[-1]

    yield start
    for checker in started:
        checker.stop()


def test_a_port_nobody_listens_on_is_one_line_in_seconds_then_again_and_not_ready(checker_at):
    address = f"127.0.0.1:{free_port()}"
    checker = checker_at(address)
    first, second = checker.wait_for(
        rf"cannot reach Kafka at {re.escape(address)} \(bootstrap servers\)",
        count=2,
        within=10 + REPORT_SECONDS,
    )
    for line in (first, second):
        assert " WARNING outbox_checker.service " in line
        assert f"{address}: connection refused" in line  # what a connection met, one line
        assert line.endswith("without an answer (start_timeout_seconds)"), line
    assert next(at for at, line in checker.lines if line == first) <= 10
    assert checker.readyz() == 503
    assert checker.process.poll() is None  # still trying


def test_an_unresolvable_host_is_one_line_saying_so(checker_at):
    checker = checker_at("nosuchhost.invalid:9092")
    (line,) = checker.wait_for(r"cannot reach Kafka at nosuchhost\.invalid:9092")
    assert "nosuchhost.invalid:9092: host name does not resolve (" in line
    assert line.endswith("without an answer (start_timeout_seconds)"), line


def test_waiting_is_no_flood(checker_at):
    """Nothing but the report, once per interval: no librdkafka line, no line per poll."""
    checker = checker_at(f"127.0.0.1:{free_port()}", OUTBOX_HTTP_ADDRESS="")  # no probes' line
    watched = 4 * REPORT_SECONDS + 1.0
    time.sleep(watched)
    lines = [line for at, line in checker.lines if at <= watched]
    assert all("cannot reach Kafka at" in line for line in lines), checker.text()
    assert 2 <= len(lines) <= watched / REPORT_SECONDS + 1, checker.text()


class Forwarder:
    """A TCP port that forwards to ``target`` once :meth:`start` is called; closed before."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.port = free_port()
        self.server: socket.socket | None = None

    def start(self) -> None:
        self.server = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        assert self.server is not None
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            return
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


@pytest.mark.kafka
def test_a_cluster_that_comes_up_later_is_reached_and_said_once(checker_at, kafka_bootstrap):
    """The bootstrap port opens after the checker started: it keeps trying, then says so."""
    forwarder = Forwarder(kafka_bootstrap.split(",")[0])
    address = f"127.0.0.1:{forwarder.port}"
    checker = checker_at(address, OUTBOX_TOPIC_PREFIX=f"unreachable{os.getpid()}")
    try:
        checker.wait_for(rf"cannot reach Kafka at {re.escape(address)}")
        forwarder.start()
        (reached,) = checker.wait_for(
            rf"INFO outbox_checker\.service reached Kafka at {re.escape(address)} after \d+s$",
            within=30,
        )
        time.sleep(REPORT_SECONDS + 1)
        lines = [line for _, line in checker.lines]
        after = lines[lines.index(reached) :]
        assert not [line for line in after if "cannot reach Kafka" in line], checker.text()
        assert len([line for line in after if "reached Kafka" in line]) == 1
    finally:
        checker.stop()
        forwarder.close()


@pytest.mark.kafka
def test_an_outage_after_start_is_a_few_lines_not_a_flood(checker_at, own_kafka_broker):
    """The broker dies under a running checker: each kind of failure once, not once per retry.

    Measured on 2026-11-27 before the fix: a dead broker under one checker gave ~58
    librdkafka lines a second (3 485 a minute, every connection attempt of every client,
    each at ERROR), 800 lines for an 8 s restart. Now each distinct line is said once,
    then again at most every 30 s with how many like it were held back.
    """
    bootstrap = own_kafka_broker.bootstrap_servers
    ensure_topics(
        AdminClient(kafka_client_config(bootstrap)), plan_topics(TopicNames("flood"), 2, 1, ())
    )
    checker = checker_at(bootstrap, OUTBOX_TOPIC_PREFIX="flood")
    checker.wait_for(r"relaying op partitions", within=60)
    time.sleep(2)
    killed_at = time.monotonic() - checker.started
    own_kafka_broker.kill()
    watched = 25.0
    time.sleep(watched)
    outage = [line for at, line in checker.lines if at > killed_at]
    assert any("Connection refused" in line for line in outage), checker.text()
    assert len(outage) <= 40, f"{len(outage)} lines in {watched:.0f}s:\n" + "\n".join(outage)
    assert checker.process.poll() is None
