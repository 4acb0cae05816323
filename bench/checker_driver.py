"""Check rounds back to back until a backlog of halves is walked: what ``bench-checker`` times.

Used in-process by :mod:`bench.checker` for the scan rate, and as a child
process (``python -m bench.checker_driver``) for the peak memory, so that the
RSS measured is a checker's alone and not the benchmark's. With
``--answer-group`` the child is instead the producer group answering checks.

``outbox checker`` cannot be used for either: the backlog must be walked at
once, rounds back to back, not every ``check_interval_seconds``, and the
clock may be skewed (see ``--clock-skew-seconds`` in :mod:`bench.checker`).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import logging
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from outbox.config import parse_properties
from outbox.message import LocalTransactionState, Message
from outbox.producer import TransactionProducer
from outbox.settings import ProducerSettings
from outbox_checker.service import Checker, freeze_startup_heap
from outbox_checker.settings import CheckerSettings


@dataclass
class WalkResult:
    """What the rounds that walked the backlog did, and how long they took."""

    rounds: int = 0
    round_seconds: float = 0.0
    """Sum of ``RoundReport.seconds``: time spent in rounds, not joining the group."""
    checks_sent: int = 0
    put_backs: int = 0
    discards: int = 0
    skipped_ended: int = 0
    half_checkpoint: int = 0
    stop_reasons: list[str] = field(default_factory=list)
    join_seconds: float = 0.0
    peak_rss_mb: float | None = None

    @property
    def halves_per_s(self) -> float:
        return self.checks_sent / self.round_seconds if self.round_seconds else 0.0


def skewed_clock(skew_seconds: float) -> Callable[[], float]:
    """``time.time`` moved forward: every half born before now + skew - timeout is due."""
    if not skew_seconds:
        return time.time
    return lambda: time.time() + skew_seconds


def walk_backlog(
    settings: CheckerSettings,
    *,
    target_offset: int,
    clock: Callable[[], float],
    progress: Callable[[WalkResult], None] | None = None,
    max_rounds: int = 1000,
    join_timeout: float = 60.0,
) -> WalkResult:
    """Join the checker group and run rounds until every owned half checkpoint reaches
    ``target_offset`` (the end of the backlog written before the walk)."""
    result = WalkResult()
    checker = Checker(settings, clock=clock)
    freeze_startup_heap()  # as ``outbox checker`` does once started
    try:
        began = time.monotonic()
        while not checker.owned_partitions():
            if time.monotonic() - began > join_timeout:
                raise RuntimeError(f"no half partition assigned within {join_timeout:g}s")
            checker.poll_membership(0.2)
        result.join_seconds = time.monotonic() - began
        while result.rounds < max_rounds:
            report = checker.run_round()
            result.rounds += 1
            result.round_seconds += report.seconds
            for part in report.partitions:
                result.checks_sent += part.checks_sent
                result.put_backs += part.put_backs
                result.discards += part.discards
                result.skipped_ended += part.skipped_ended
                result.stop_reasons.append(part.stop_reason)
            result.half_checkpoint = min(p.half_checkpoint for p in report.partitions)
            if progress is not None:
                progress(result)
            if result.half_checkpoint >= target_offset:
                break
    finally:
        checker.close()
    return result


def peak_rss_mb() -> float | None:
    """This process's peak resident set (VmHWM), in MiB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class CommitAtOnce:
    """A producer group's listener that answers every check COMMIT at once, and counts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.checked = 0

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        with self._lock:
            self.checked += 1
        return LocalTransactionState.COMMIT_MESSAGE


class Answerer:
    """The producer group answering every check COMMIT: this module as a child process."""

    def __init__(self, bootstrap: str, prefix: str, group: str, check_threads: int) -> None:
        self._argv = [
            sys.executable,
            "-m",
            "bench.checker_driver",
            "--bootstrap-servers",
            bootstrap,
            "--prefix",
            prefix,
            "--answer-group",
            group,
            "--check-threads",
            str(check_threads),
        ]
        self._child: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._ready = threading.Event()
        self.answered = 0
        self._ready_at = 0.0
        self._first: tuple[float, int] | None = None
        """(when, count) of the first report of an answer: the group had joined."""
        self._last_at = 0.0

    def start(self, timeout: float = 60.0) -> None:
        self._child = subprocess.Popen(
            self._argv, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1]
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._ready.wait(timeout):
            self.stop()
            raise RuntimeError(f"the answering producer did not start within {timeout:g}s")

    def _read(self) -> None:
        assert self._child is not None and self._child.stdout is not None
        for line in self._child.stdout:
            try:
                message = json.loads(line)
            except json.JSONDecodeError:
                continue
            now = time.monotonic()
            if message.get("ready"):
                self._ready_at = now
                self._ready.set()
            if "answered" in message and int(message["answered"]) != self.answered:
                self.answered = int(message["answered"])
                self._last_at = now
                if self._first is None:
                    self._first = (now, self.answered)

    def rate(self) -> float | None:
        """Answers a second from the first reported answer to the last.

        Counted from the first answer, so the group join is not in it; when every
        answer came in one report, from the child's start instead (an underestimate).
        """
        if self._first is None:
            return None
        at, count = self._first
        if self._last_at > at:
            return (self.answered - count) / (self._last_at - at)
        return self.answered / max(1e-9, self._last_at - self._ready_at)

    def wait_for(self, sent: int, stall: float = 30.0) -> float:
        """Until ``sent`` checks were answered, or none for ``stall`` s; seconds waited."""
        began = time.monotonic()
        last, last_change = -1, began
        while self.answered < sent and time.monotonic() - last_change < stall:
            if self.answered != last:
                last, last_change = self.answered, time.monotonic()
            time.sleep(0.5)
        return time.monotonic() - began

    def stop(self) -> None:
        if self._child is None:
            return
        self._child.terminate()
        try:
            self._child.wait(60)
        except subprocess.TimeoutExpired:
            self._child.kill()
            self._child.wait()
        if self._reader is not None:
            self._reader.join(5)


def answer(bootstrap: str, prefix: str, group: str, check_threads: int) -> None:
    """Run a producer of ``group`` answering checks until SIGTERM; report counts as JSON lines.

    A process of its own, as a producer service would be: in the checker's
    process its threads would compete with the round for the GIL.
    """
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    listener = CommitAtOnce()
    settings = ProducerSettings(
        bootstrap_servers=bootstrap,
        topic_prefix=prefix,
        check_threads=check_threads,
        check_queue_size=max(2000, check_threads * 4),
    )
    with TransactionProducer(group, listener, settings):
        print(json.dumps({"ready": True}), flush=True)
        while not stop.wait(0.1):
            print(json.dumps({"answered": listener.checked}), flush=True)
    print(json.dumps({"answered": listener.checked, "final": True}), flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.checker_driver")
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--target-offset", type=int, help="walk until the checkpoint is here")
    parser.add_argument("--clock-skew-seconds", type=float, default=0.0)
    parser.add_argument("--profile", type=Path, help="write cProfile stats of the walk here")
    parser.add_argument("--answer-group", help="instead: answer this group's checks (COMMIT)")
    parser.add_argument("--check-threads", type=int, default=16)
    parser.add_argument(
        "-X",
        dest="properties",
        action="append",
        default=[],
        help="extra librdkafka property KEY=VALUE for the checker (repeatable)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.answer_group:
        answer(args.bootstrap_servers, args.prefix, args.answer_group, args.check_threads)
        return
    if args.target_offset is None:
        parser.error("--target-offset is required to walk")
    settings = CheckerSettings(
        bootstrap_servers=args.bootstrap_servers,
        topic_prefix=args.prefix,
        http_address="",
        kafka_properties=parse_properties(args.properties),
    )

    def progress(result: WalkResult) -> None:
        print(
            json.dumps({"progress": result.half_checkpoint, "checks": result.checks_sent}),
            flush=True,
        )

    def walk() -> WalkResult:
        return walk_backlog(
            settings,
            target_offset=args.target_offset,
            clock=skewed_clock(args.clock_skew_seconds),
            progress=progress,
        )

    if args.profile:
        profiler = cProfile.Profile()
        result = profiler.runcall(walk)
        profiler.dump_stats(args.profile)
    else:
        result = walk()
    result.peak_rss_mb = peak_rss_mb()
    print(json.dumps({"result": asdict(result)}), flush=True)


if __name__ == "__main__":
    main()
