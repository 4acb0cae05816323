"""``make bench-checker``: how fast the checker walks a backlog, and what memory it needs.

Two measurements, each on topics of its own (one half partition, so the rate
is a per-partition figure):

* **scan rate**: 100 000 pending halves (1 KiB values) are written with a plain
  idempotent producer. Ages count from the broker's store time, so the walk
  starts once the last half is older than the transaction timeout: every one is
  due, and no round stops at a half still young (which would measure waiting).
  :class:`outbox_checker.service.Checker` then runs rounds in-process, back to back,
  until its half checkpoint has passed the backlog. The figure is the
  checker's alone: check requests sent per second of round time
  (``RoundReport.seconds``, so joining the group is not counted).
* **answers/s**: only then does a :class:`~outbox.producer.TransactionProducer`
  of the halves' producer group start (a process of its own) and answer every
  waiting check with COMMIT at once; checks answered per second, from its first
  answer to its last, is the producer group's figure. Afterwards the ops it wrote
  are counted, to show every check was real and answered.
* **peak RSS**: 1 000 000 pending halves (100 B values, to keep the write
  short) are walked by a checker in a child process
  (``python -m bench.checker_driver``); its peak resident set (VmHWM) is the
  figure, read from ``/proc`` while it runs and reported by the child at exit.

Why the clock is *not* skewed by default: a half is due when its store time is
older than the transaction timeout, and the walk waits for that, so a real
clock makes them all due. A clock skewed forward also moves
the round's start past the put-back copies the round itself writes; the rule
"stored after the round began: stop" then never fires, and the round chases
its own copies (re-checking unanswered ones) until the time budget is spent,
measuring re-checks rather than the backlog. ``--clock-skew-seconds`` is there
to see that effect.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import confluent_kafka
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from rich.console import Console

from bench.aims import AIM_HALVES_PER_S, AIM_RSS_MB
from bench.checker_driver import Answerer, WalkResult, skewed_clock, walk_backlog
from bench.checker_table import RssResult, ScanResult, fmt, results_table
from bench.common import (
    bench_main,
    count_label,
    figure,
    host_cpu_seconds,
    print_last_line,
    process_cpu_seconds,
    run_on_broker,
    save_results,
    warn_if_noisy,
)
from outbox.acked_writer import produce_when_room
from outbox.admin import TopicSpec, ensure_topics, plan_topics
from outbox.config import kafka_client_config
from outbox.protocol import HalfRecord, TopicNames
from outbox.reading import read_topic
from outbox_checker.settings import CheckerSettings
from outbox_devtools.kafka import KAFKA_VERSION

GROUP = "bench-checker"
RESULTS_PATH = Path(__file__).resolve().parent / "results" / "checker.json"
BORN_AGO_MS = 600_000


# --------------------------------------------------------------------------- writing the backlog


def write_halves(
    console: Console,
    bootstrap: str,
    topics: TopicNames,
    count: int,
    value_bytes: int,
    compression: str = "none",
) -> float:
    """``count`` due halves into half partition 0, as fast as a plain producer goes; seconds.

    Uncompressed by default, as :mod:`outbox.acked_writer` writes them: the
    checker's memory depends on it (librdkafka holds ~55 MiB more while
    reading big lz4 batches, measured), so the backlog should look like a real one.
    """
    producer = Producer(
        kafka_client_config(
            bootstrap,
            {
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 50,
                "batch.size": 900_000,
                "compression.type": compression,
                "queue.buffering.max.messages": 1_000_000,
                "queue.buffering.max.kbytes": 1_048_576,
            },
        )
    )
    value = os.urandom(value_bytes)
    run = uuid.uuid4().hex[:8]
    born_ms = int(time.time() * 1000) - BORN_AGO_MS
    step = max(1, count // 5)
    began = time.monotonic()
    for index in range(count):
        half = HalfRecord(f"{run}-{index}", GROUP, f"{topics.prefix}.events", None, value, born_ms)
        produce_when_room(producer, **half.to_record(topics, 0).produce_kwargs())
        if (index + 1) % step == 0:
            producer.poll(0)
            console.print(f"    written {index + 1:,} of {count:,} halves", highlight=False)
    if producer.flush(300) > 0:
        raise RuntimeError("the backlog was not acknowledged within 300s")
    return time.monotonic() - began


def wait_until_due(console: Console, written_at: float, skew_seconds: float) -> None:
    """Until the last half written (stored by ``written_at``, monotonic) is due.

    A half's age counts from its store time (``LogAppendTime``), not from the
    born time written here: without the wait the rounds would meet halves still
    younger than the transaction timeout, stop, and start again until they age.
    """
    timeout = CheckerSettings.model_construct().transaction_timeout_seconds
    remaining = written_at + timeout + 0.5 - skew_seconds - time.monotonic()
    if remaining > 0:
        console.print(
            f"    waiting {remaining:.1f}s until the last half is older than the "
            f"transaction timeout ({timeout:g}s)",
            highlight=False,
        )
        time.sleep(remaining)


def fresh_topics(bootstrap: str, name: str) -> TopicNames:
    """Outbox topics (one partition each) no earlier run has touched."""
    topics = TopicNames(f"bench-checker-{name}-{uuid.uuid4().hex[:6]}")
    specs = [
        *plan_topics(topics, 1, 1, (GROUP,)),
        TopicSpec(f"{topics.prefix}.events", 1, 1),
    ]
    ensure_topics(AdminClient(kafka_client_config(bootstrap)), specs)
    return topics


def drop_topics(bootstrap: str, topics: TopicNames) -> None:
    names = [*topics.fixed, topics.check(GROUP), f"{topics.prefix}.events"]
    admin = AdminClient(kafka_client_config(bootstrap))  # kept alive until the futures resolve
    for future in admin.delete_topics(names).values():
        try:
            future.result(30)
        except Exception as exc:  # best effort: leftovers only cost disk
            logging.getLogger(__name__).warning("could not delete a bench topic: %s", exc)


# --------------------------------------------------------------------------- CPU accounting


@dataclass
class CpuWindow:
    """CPU use of this process, the broker and everything else over a stretch of time."""

    broker_pid: int | None
    _began: float = 0.0
    _mine: float | None = None
    _broker: float | None = None
    _host: float | None = None
    pct: dict[str, float | None] = field(default_factory=dict)

    def __enter__(self) -> CpuWindow:
        self._began = time.monotonic()
        self._mine = process_cpu_seconds(None)
        self._broker = process_cpu_seconds(self.broker_pid) if self.broker_pid else None
        self._host = host_cpu_seconds()
        return self

    def __exit__(self, *_: object) -> None:
        wall = max(1e-9, time.monotonic() - self._began)

        def pct(before: float | None, after: float | None) -> float | None:
            if before is None or after is None:
                return None
            return round(100 * (after - before) / wall, 1)

        mine = pct(self._mine, process_cpu_seconds(None))
        broker = pct(
            self._broker, process_cpu_seconds(self.broker_pid) if self.broker_pid else None
        )
        host = pct(self._host, host_cpu_seconds())
        other = (
            None
            if host is None or mine is None
            else round(max(0.0, host - mine - (broker or 0)), 1)
        )
        self.pct = {"bench_process": mine, "broker": broker, "other": other}


# --------------------------------------------------------------------------- (a) scan rate


def scan_phase(
    console: Console, options: Options, bootstrap: str, broker_pid: int | None
) -> ScanResult:
    topics = fresh_topics(bootstrap, "scan")
    console.print(
        f"[bold cyan]==>[/] (a) scan rate: writing {options.halves:,} due halves of "
        f"{options.value_bytes} B to {topics.half}[0]",
        highlight=False,
    )
    write_seconds = write_halves(
        console, bootstrap, topics, options.halves, options.value_bytes, options.write_compression
    )
    written_at = time.monotonic()
    console.print(f"    backlog written in {write_seconds:.1f}s", highlight=False)
    wait_until_due(console, written_at, options.clock_skew_seconds)
    answerer = (
        Answerer(bootstrap, topics.prefix, GROUP, options.check_threads) if options.answer else None
    )
    checker_settings = CheckerSettings(
        bootstrap_servers=bootstrap, topic_prefix=topics.prefix, http_address=""
    )

    def progress(result: WalkResult) -> None:
        console.print(
            f"    round {result.rounds}: checkpoint {result.half_checkpoint:,}, "
            f"{result.checks_sent:,} checks in {result.round_seconds:.1f}s "
            f"(stop: {result.stop_reasons[-1]})",
            highlight=False,
        )

    answered = ops = wait = answers_per_s = None
    try:
        console.print("[bold cyan]==>[/] (a) walking the backlog (rounds back to back)")
        with CpuWindow(broker_pid) as cpu:
            walk = walk_backlog(
                checker_settings,
                target_offset=options.halves,
                clock=skewed_clock(options.clock_skew_seconds),
                progress=progress,
            )
        if answerer is not None:
            # Only now, so that the scan rate is the checker's alone and the answering
            # rate the producer group's alone: the checks wait in their topic meanwhile.
            console.print(
                f"[bold cyan]==>[/] (a) producer group {GROUP} answering the "
                f"{walk.checks_sent:,} checks COMMIT, in a process of its own "
                f"({options.check_threads} check threads)",
                highlight=False,
            )
            answerer.start()
            wait = answerer.wait_for(walk.checks_sent)
            answered = answerer.answered
            answers_per_s = answerer.rate()
            console.print(
                f"    producer answered {answered:,} of {walk.checks_sent:,} checks "
                f"in {wait:.1f}s: {fmt(answers_per_s)} answers/s",
                highlight=False,
            )
    finally:
        if answerer is not None:
            answerer.stop()
    if answerer is not None:
        ops = len(read_topic(kafka_client_config(bootstrap), topics.op, timeout=300))
        console.print(f"    verify: {ops:,} ops on {topics.op}", highlight=False)
    if options.bootstrap_servers is not None:
        drop_topics(bootstrap, topics)
    return ScanResult(
        halves=options.halves,
        value_bytes=options.value_bytes,
        write_seconds=round(write_seconds, 2),
        walk=walk,
        halves_per_s=round(walk.halves_per_s, 1),
        checks_answered=answered,
        ops_written=ops,
        answer_wait_seconds=None if wait is None else round(wait, 1),
        answers_per_s=None if answers_per_s is None else round(answers_per_s, 1),
        cpu_pct=cpu.pct,
    )


# --------------------------------------------------------------------------- (b) peak RSS


def _vm_hwm_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def rss_phase(console: Console, options: Options, bootstrap: str) -> RssResult:
    topics = fresh_topics(bootstrap, "rss")
    console.print(
        f"[bold cyan]==>[/] (b) peak RSS: writing {options.rss_halves:,} due halves of "
        f"{options.rss_value_bytes} B to {topics.half}[0]",
        highlight=False,
    )
    write_seconds = write_halves(
        console,
        bootstrap,
        topics,
        options.rss_halves,
        options.rss_value_bytes,
        options.write_compression,
    )
    console.print(f"    backlog written in {write_seconds:.1f}s", highlight=False)
    wait_until_due(console, time.monotonic(), options.clock_skew_seconds)
    argv = [
        sys.executable,
        "-m",
        "bench.checker_driver",
        "--bootstrap-servers",
        bootstrap,
        "--prefix",
        topics.prefix,
        "--target-offset",
        str(options.rss_halves),
        "--clock-skew-seconds",
        str(options.clock_skew_seconds),
    ]
    if options.profile:
        argv += ["--profile", str(options.profile)]
    console.print(
        "[bold cyan]==>[/] (b) a checker process walks it: python -m bench.checker_driver"
    )
    child = subprocess.Popen(
        argv, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1]
    )
    polled: list[float] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            value = _vm_hwm_mb(child.pid)
            if value is not None:
                polled.append(value)
            done.wait(0.5)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    walk: WalkResult | None = None
    assert child.stdout is not None
    for line in child.stdout:
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            console.print(f"    driver: {line.rstrip()}", highlight=False, markup=False)
            continue
        if "progress" in message:
            console.print(
                f"    checkpoint {message['progress']:,}, {message['checks']:,} checks, "
                f"peak RSS so far {max(polled, default=0):.0f} MiB",
                highlight=False,
            )
        elif "result" in message:
            walk = WalkResult(**message["result"])
    code = child.wait()
    done.set()
    poller.join(2)
    if options.bootstrap_servers is not None:
        drop_topics(bootstrap, topics)
    peak = walk.peak_rss_mb if walk else None
    return RssResult(
        halves=options.rss_halves,
        value_bytes=options.rss_value_bytes,
        write_seconds=round(write_seconds, 2),
        walk=walk,
        peak_rss_mb=None if peak is None else round(peak, 1),
        peak_rss_polled_mb=round(max(polled), 1) if polled else None,
        halves_per_s=round(walk.halves_per_s, 1) if walk else None,
        exit_code=code,
    )


# --------------------------------------------------------------------------- the bench


@dataclass
class Options:
    halves: int
    value_bytes: int
    rss_halves: int
    rss_value_bytes: int
    clock_skew_seconds: float
    answer: bool
    check_threads: int
    skip_rss: bool
    write_compression: str
    profile: Path | None
    bootstrap_servers: str | None
    json_path: Path | None
    """``None``: not written (``bench.all`` keeps the document in its own)."""


@dataclass
class Report:
    """What :func:`measure` found, for the command line and for ``bench.all`` alike."""

    scan: ScanResult
    rss: RssResult | None
    """``None`` with ``--skip-rss``."""
    problems: list[str]
    """Correctness failures (see :func:`_problems`); empty when the walks were right."""
    document: dict[str, Any]
    """Everything, as written to the JSON."""
    other_cpu_pct: float
    """CPU other processes used during the scan walk: the noise in its rate."""

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def rss_mb(self) -> float | None:
        return self.rss.peak_rss_mb if self.rss else None


def run(console: Console, options: Options) -> int:
    return run_on_broker(console, options, _run_against, heap="1g")


def _run_against(console: Console, options: Options, bootstrap: str, broker_pid: int | None) -> int:
    report = measure(console, options, bootstrap, broker_pid)
    print_last_line(
        console,
        f"bench-checker: halves_per_s={report.scan.halves_per_s:.0f} "
        f"rss_mb_at_{count_label(options.rss_halves)}={figure(report.rss_mb, '.0f')}",
    )
    return 0 if report.ok else 1


def measure(console: Console, options: Options, bootstrap: str, broker_pid: int | None) -> Report:
    """The scan rate, then (unless ``--skip-rss``) the peak RSS, on ``bootstrap``; print, save.

    ``broker_pid`` (a local broker's) lets the scan report the broker's CPU.
    """
    began = time.monotonic()
    scan = scan_phase(console, options, bootstrap, broker_pid)
    rss = None if options.skip_rss else rss_phase(console, options, bootstrap)
    other = scan.cpu_pct.get("other") or 0.0
    warn_if_noisy(console, other, "the walk")
    console.print(results_table(scan, rss))
    problems = _problems(scan, rss)
    for problem in problems:
        console.print(f"[red]problem:[/] {problem}", highlight=False)
    document = _document(options, bootstrap, scan, rss, problems, time.monotonic() - began)
    save_results(console, options.json_path, document)
    return Report(scan, rss, problems, document, other_cpu_pct=other)


def _problems(scan: ScanResult, rss: RssResult | None) -> list[str]:
    """Correctness, not speed: the walk must send one check per pending half, no more."""
    problems = []
    if scan.walk.half_checkpoint < scan.halves:
        problems.append(f"scan: checkpoint {scan.walk.half_checkpoint} short of {scan.halves}")
    if scan.walk.checks_sent != scan.halves:
        problems.append(f"scan: {scan.walk.checks_sent} checks sent for {scan.halves} halves")
    if rss is not None:
        if rss.exit_code != 0 or rss.walk is None:
            problems.append(f"rss: the checker process exited {rss.exit_code}")
        elif rss.walk.half_checkpoint < rss.halves:
            problems.append(f"rss: checkpoint {rss.walk.half_checkpoint} short of {rss.halves}")
    return problems


def _document(
    options: Options,
    bootstrap: str,
    scan: ScanResult,
    rss: RssResult | None,
    problems: list[str],
    elapsed: float,
) -> dict[str, Any]:
    return {
        "bench": "checker",
        "created_unix": round(time.time(), 3),
        "elapsed_seconds": round(elapsed, 1),
        "config": {
            **{k: str(v) if isinstance(v, Path) else v for k, v in asdict(options).items()},
            "local_broker": options.bootstrap_servers is None,
            "bootstrap_servers": bootstrap,
            "half_partitions": 1,
            "checker_defaults": "RocketMQ's (CheckerSettings)",
        },
        "environment": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "confluent_kafka": confluent_kafka.version()[0],
            "librdkafka": confluent_kafka.libversion()[0],
            "kafka": KAFKA_VERSION,
        },
        "scan": asdict(scan),
        "rss": None if rss is None else asdict(rss),
        "summary": {
            "halves_per_s": scan.halves_per_s,
            f"rss_mb_at_{count_label(options.rss_halves)}": rss.peak_rss_mb if rss else None,
            "aim_halves_per_s": AIM_HALVES_PER_S,
            "aim_rss_mb": AIM_RSS_MB,
        },
        "problems": problems,
    }


def parse_args(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.checker",
        description="Checker scan rate over a backlog of due halves, and its peak RSS.",
    )
    parser.add_argument("--halves", type=int, default=100_000, help="backlog of the scan rate")
    parser.add_argument("--value-bytes", type=int, default=1024)
    parser.add_argument("--rss-halves", type=int, default=1_000_000, help="backlog of the RSS")
    parser.add_argument("--rss-value-bytes", type=int, default=100)
    parser.add_argument(
        "--clock-skew-seconds",
        type=float,
        default=0.0,
        help="run the checker with its clock this far ahead (see the module docstring)",
    )
    parser.add_argument(
        "--no-answer",
        dest="answer",
        action="store_false",
        help="no producer group answering the checks after the scan",
    )
    parser.add_argument("--check-threads", type=int, default=16, help="the producer's")
    parser.add_argument("--skip-rss", action="store_true", help="only the scan rate")
    parser.add_argument(
        "--write-compression",
        default="none",
        choices=("none", "lz4", "zstd", "snappy", "gzip"),
        help="compression of the backlog's batches (the half writer uses none)",
    )
    parser.add_argument("--profile", type=Path, help="cProfile stats of the RSS walk, to here")
    parser.add_argument(
        "--bootstrap-servers", help="use this broker instead of starting a local one"
    )
    parser.add_argument("--json", dest="json_path", type=Path, default=RESULTS_PATH)
    args = parser.parse_args(argv)
    if min(args.halves, args.value_bytes, args.rss_halves, args.rss_value_bytes) < 1:
        parser.error("counts and sizes must be positive")
    return Options(
        halves=args.halves,
        value_bytes=args.value_bytes,
        rss_halves=args.rss_halves,
        rss_value_bytes=args.rss_value_bytes,
        clock_skew_seconds=args.clock_skew_seconds,
        answer=args.answer,
        check_threads=args.check_threads,
        skip_rss=args.skip_rss,
        write_compression=args.write_compression,
        profile=args.profile,
        bootstrap_servers=args.bootstrap_servers,
        json_path=args.json_path,
    )


def main(argv: Sequence[str] | None = None) -> None:
    bench_main(parse_args(argv), run)


if __name__ == "__main__":
    main()
