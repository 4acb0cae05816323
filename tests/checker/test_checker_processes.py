"""Checker replicas as real processes: kill -9 mid-round, takeover between replicas, SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator

import pytest

from outbox.protocol import OutgoingRecord
from outbox_devtools.processes import free_port
from tests.checker.support import (
    check_requests,
    ensure_check_topic,
    pending_half,
    wait_for,
    write,
)
from tests.producer.conftest import OutboxTopics

pytestmark = pytest.mark.kafka


TIMEOUT_SECONDS = 1.0
"""The checkers' transaction timeout: a half's age counts from its store time (the broker's)."""


def write_due(topics: OutboxTopics, *records: OutgoingRecord) -> None:
    """Write halves, then wait until they are past the checkers' transaction timeout."""
    write(topics, *records)
    time.sleep(TIMEOUT_SECONDS * 1.5)


class CheckerProcess:
    """``outbox checker`` in a subprocess, its log collected line by line."""

    def __init__(self, topics: OutboxTopics, instance: str, **env: str) -> None:
        self.port = free_port()
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "outbox", "checker"],
            env={
                **os.environ,
                "OUTBOX_BOOTSTRAP_SERVERS": topics.bootstrap,
                "OUTBOX_TOPIC_PREFIX": topics.names.prefix,
                "OUTBOX_INSTANCE_ID": instance,
                "OUTBOX_HTTP_ADDRESS": f"127.0.0.1:{self.port}",
                "OUTBOX_CHECK_INTERVAL_SECONDS": "3600",  # one round at start, then idle
                "OUTBOX_TRANSACTION_TIMEOUT_SECONDS": str(TIMEOUT_SECONDS),
                "OUTBOX_KAFKA_TRANSACTION_TIMEOUT_MS": "10000",
                "OUTBOX_KAFKA_PROPERTIES": '{"session.timeout.ms": "6000",'
                ' "heartbeat.interval.ms": "1000"}',
                **env,
            },
            stderr=subprocess.PIPE,
            text=True,
        )
        self._reader = threading.Thread(target=self._collect, daemon=True)
        self._reader.start()

    def _collect(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line.rstrip())

    def owned(self) -> set[int]:
        """Partitions owned according to the log's assign/revoke lines."""
        owned: set[int] = set()
        for line in self.lines:
            found = re.search(r"(assigned|revoked) half partitions \[([\d, ]*)\]", line)
            if found:
                partitions = {int(p) for p in found.group(2).split(",") if p.strip()}
                owned = owned | partitions if found.group(1) == "assigned" else owned - partitions
        return owned

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(30)

    def terminate(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(60)

    def log(self) -> str:
        return "\n".join(line for line in self.lines if not line.startswith("%"))


@pytest.fixture
def processes(outbox_topics: OutboxTopics) -> Iterator[list[CheckerProcess]]:
    ensure_check_topic(outbox_topics)
    started: list[CheckerProcess] = []
    yield started
    for checker in started:
        if checker.process.poll() is None:
            checker.kill()


def test_kill_9_mid_round_loses_no_half_and_repeats_no_copy(outbox_topics: OutboxTopics, processes):
    count = 20_000
    write_due(
        outbox_topics,
        *(
            pending_half(outbox_topics, f"t{i}").to_record(outbox_topics.names, i % 3)
            for i in range(count)
        ),
    )
    first = CheckerProcess(outbox_topics, "replica-a")
    processes.append(first)
    wait_for(lambda: len(check_requests(outbox_topics)) > 0, 120, "the first chunk")
    first.kill()
    asked_before_restart = len(check_requests(outbox_topics))
    assert asked_before_restart < count, "the round finished before the kill: not mid-round"

    again = CheckerProcess(outbox_topics, "replica-a")  # same instance: fences the zombie
    processes.append(again)

    def first_checks_done() -> bool:
        requests = check_requests(outbox_topics)
        return len({r.half.transaction_id for r in requests if r.half.check_times == 1}) >= count

    wait_for(first_checks_done, 180, "the rest of the round")
    assert again.terminate() == 0

    requests = check_requests(outbox_topics)
    first_checks = Counter(r.half.transaction_id for r in requests if r.half.check_times == 1)
    assert set(first_checks) == {f"t{i}" for i in range(count)}, "a pending half was lost"
    assert set(first_checks.values()) == {1}, "a half was put back (and asked) twice"
    # The restarted round may reach copies the first process committed (they are
    # due too) and ask about them: each copy once, each (transaction, check) once.
    assert set(Counter((r.half.transaction_id, r.half.check_times) for r in requests).values()) == {
        1
    }
    copies = Counter((r.half_partition, r.half_offset) for r in requests)
    assert set(copies.values()) == {1}


def test_two_replicas_split_partitions_and_one_takes_over(outbox_topics: OutboxTopics, processes):
    a = CheckerProcess(outbox_topics, "replica-a")
    b = CheckerProcess(outbox_topics, "replica-b")
    processes.extend([a, b])
    wait_for(
        lambda: a.owned() and b.owned() and a.owned() | b.owned() == {0, 1, 2},
        90,
        "both replicas to own partitions",
    )
    assert not a.owned() & b.owned()
    a.kill()
    wait_for(lambda: b.owned() == {0, 1, 2}, 90, "the survivor to take every partition")
    # Halves in every partition, including the dead replica's, are now checked.
    # The survivor runs a round for partitions it gains (their checkpoints load
    # at their first round), so restart its interval with a fresh process.
    b.terminate()
    write_due(
        outbox_topics,
        *(pending_half(outbox_topics, f"p{p}").to_record(outbox_topics.names, p) for p in range(3)),
    )
    c = CheckerProcess(outbox_topics, "replica-b")
    processes.append(c)
    wait_for(lambda: len(check_requests(outbox_topics)) >= 3, 90, "checks in every partition")
    assert sorted(r.half_partition for r in check_requests(outbox_topics)) == [0, 1, 2]


def test_sigterm_exits_0_after_committing(outbox_topics: OutboxTopics, processes):
    write_due(outbox_topics, pending_half(outbox_topics, "one").to_record(outbox_topics.names, 0))
    checker = CheckerProcess(outbox_topics, "replica-a")
    processes.append(checker)
    wait_for(checker.ready, 90, "/readyz")
    wait_for(lambda: len(check_requests(outbox_topics)) == 1, 60, "the check request")

    def metrics() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{checker.port}/metrics", timeout=5) as r:
            return r.read().decode()

    assert "outbox_checker_checks_sent_total 1.0" in metrics()
    lags = [f'outbox_checker_relay_lag{{partition="{p}"}} 0.0' for p in range(3)]
    wait_for(lambda: all(lag in metrics() for lag in lags), 60, "the relay's lag on /metrics")
    with urllib.request.urlopen(f"http://127.0.0.1:{checker.port}/healthz", timeout=5) as r:
        assert r.status == 200
    assert checker.terminate() == 0, checker.log()  # exited by itself: no kill after it
    assert "checker stopped" in checker.log()
