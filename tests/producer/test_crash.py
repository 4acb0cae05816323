"""kill -9 of a producer mid-transaction: each half has its op, or none; nothing is published.

The producer runs in a subprocess (``crash_producer.py``) whose local
transaction blocks until the test SIGKILLs it, so nothing in the process can
clean up: whatever Kafka holds afterwards is what a crash leaves behind.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest
from confluent_kafka.admin import AdminClient

from outbox.admin import TopicSpec, ensure_topics, plan_topics
from outbox.config import kafka_client_config
from outbox.protocol import HalfRecord, OpRecord, RawRecord, Resolution, TopicNames
from outbox.reading import read_topic
from tests.producer.crash_producer import BLOCK, COMMIT_THEN_BLOCK, GROUP, KINDS

pytestmark = pytest.mark.kafka

SCRIPT = Path(__file__).with_name("crash_producer.py")
REPO_ROOT = Path(__file__).resolve().parents[2]
LINE_TIMEOUT = 60.0
EXIT_TIMEOUT = 15.0
READ_TIMEOUT = 60.0


@dataclass
class CrashSetup:
    """The topics of one crash test and a way to read them back."""

    bootstrap: str
    names: TopicNames
    real_topic: str
    tmp_path: Path

    def read(self, topic: str, isolation: str = "read_committed") -> list[RawRecord]:
        config = kafka_client_config(self.bootstrap)
        return read_topic(config, topic, isolation=isolation, timeout=READ_TIMEOUT)


class ProducerProcess:
    """``crash_producer.py`` in a subprocess, its stdout lines readable with a timeout."""

    def __init__(self, setup: CrashSetup, mode: str, kind: str) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])
            ),
        }
        self.stderr_path = setup.tmp_path / f"crash_producer-{mode}-{kind}.stderr"
        self._stderr: IO[bytes] = self.stderr_path.open("wb")
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(SCRIPT),
                setup.bootstrap,
                setup.names.prefix,
                setup.real_topic,
                mode,
                kind,
            ],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read_lines, daemon=True)
        self._reader.start()

    def _read_lines(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def expect(self, word: str, timeout: float = LINE_TIMEOUT) -> list[str]:
        """The fields of the next stdout line, which must start with ``word``."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                line = self._lines.get(timeout=max(0.0, remaining))
            except queue.Empty:
                pytest.fail(f"no {word} line within {timeout:g}s{self._diagnostics()}")
            if line is None:
                self.process.wait(EXIT_TIMEOUT)
                pytest.fail(
                    f"producer exited ({self.process.returncode}) before {word}"
                    f"{self._diagnostics()}"
                )
            fields = line.split()
            if fields and fields[0] == word:
                return fields[1:]
            if fields and fields[0] in {"HALF_WRITTEN", "COMMITTED", "UNREACHABLE"}:
                pytest.fail(f"expected {word}, got {line!r}{self._diagnostics()}")

    def kill_9(self) -> None:
        """SIGKILL the producer and wait until it is gone."""
        os.kill(self.process.pid, signal.SIGKILL)
        assert self.process.wait(EXIT_TIMEOUT) == -signal.SIGKILL

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(EXIT_TIMEOUT)
        self._reader.join(EXIT_TIMEOUT)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._stderr.close()

    def _diagnostics(self) -> str:
        self._stderr.flush()
        tail = self.stderr_path.read_text(errors="replace")[-3000:]
        return f"\n--- producer stderr (tail) ---\n{tail}" if tail else ""


@pytest.fixture
def crash_setup(
    kafka_bootstrap: str, kafka_admin: AdminClient, unique_prefix: str, tmp_path: Path
) -> CrashSetup:
    names = TopicNames(unique_prefix)
    real_topic = f"{unique_prefix}-events"
    ensure_topics(kafka_admin, [*plan_topics(names, 2, 1, (GROUP,)), TopicSpec(real_topic, 2, 1)])
    return CrashSetup(kafka_bootstrap, names, real_topic, tmp_path)


@pytest.fixture(params=KINDS)
def start_producer(
    crash_setup: CrashSetup, request: pytest.FixtureRequest
) -> Iterator[Callable[[str], ProducerProcess]]:
    """Starts ``crash_producer.py`` processes, threaded or asyncio; kills any still alive."""
    started: list[ProducerProcess] = []

    def start(mode: str) -> ProducerProcess:
        process = ProducerProcess(crash_setup, mode, request.param)
        started.append(process)
        return process

    yield start
    for process in started:
        process.close()


def _halves(setup: CrashSetup) -> dict[str, tuple[RawRecord, HalfRecord]]:
    """Every half on the half topic by transaction id; each id must appear once."""
    decoded = [(raw, HalfRecord.from_record(raw)) for raw in setup.read(setup.names.half)]
    halves = {half.transaction_id: (raw, half) for raw, half in decoded}
    assert len(halves) == len(decoded), "a transaction has more than one half"
    return halves


def test_kill_9_mid_transaction_leaves_only_the_half(
    crash_setup: CrashSetup, start_producer: Callable[[str], ProducerProcess]
) -> None:
    producer = start_producer(BLOCK)
    producer.expect("STARTED")
    (transaction_id,) = producer.expect("HALF_WRITTEN")
    producer.kill_9()

    halves = _halves(crash_setup)
    assert list(halves) == [transaction_id]
    _, half = halves[transaction_id]
    assert (half.producer_group, half.real_topic, half.value) == (
        GROUP,
        crash_setup.real_topic,
        b"second",
    )
    assert crash_setup.read(crash_setup.names.op, "read_uncommitted") == []
    assert crash_setup.read(crash_setup.real_topic, "read_uncommitted") == []


def test_kill_9_after_a_commit_keeps_the_commit_and_leaves_the_second_half(
    crash_setup: CrashSetup, start_producer: Callable[[str], ProducerProcess]
) -> None:
    producer = start_producer(COMMIT_THEN_BLOCK)
    producer.expect("STARTED")
    first_id, first_partition, first_offset, first_status = producer.expect("COMMITTED")
    assert first_status == "COMMITTED"
    (second_id,) = producer.expect("HALF_WRITTEN")
    assert second_id != first_id
    producer.kill_9()

    halves = _halves(crash_setup)
    assert set(halves) == {first_id, second_id}
    first_raw, first_half = halves[first_id]
    assert (first_raw.partition, first_raw.offset) == (int(first_partition), int(first_offset))
    assert (first_half.value, halves[second_id][1].value) == (b"first", b"second")

    # The committed half has its op (acknowledged before COMMITTED was printed);
    # the second has none. The real topic is the relay's: empty here.
    ops = [OpRecord.from_record(raw) for raw in crash_setup.read(crash_setup.names.op)]
    assert [(op.transaction_id, op.resolution) for op in ops] == [(first_id, Resolution.COMMIT)]
    (op,) = ops
    assert (op.half_partition, op.half_offset, op.origin_offset) == (
        first_raw.partition,
        first_raw.offset,
        first_raw.offset,
    )
    assert crash_setup.read(crash_setup.real_topic, "read_uncommitted") == []
