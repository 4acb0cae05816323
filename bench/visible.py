"""``python -m bench.visible``: commit-to-visible latency, with the relay running as deployed.

Producers only decide; the checker's relay publishes. So what a downstream
reader waits for is the time from the local transaction's COMMIT to the real
record being readable by a ``read_committed`` consumer. Here ``senders``
threads send through one :class:`TransactionProducer`, whose listener notes
(``time.monotonic()``) when each local transaction answered COMMIT, keyed by
transaction id; a consumer thread reads the real topic and notes when each
transaction id first appears. The checker runs as its own process
(``python -m outbox checker``), as a deployment runs the sidecar, and timing
starts only once it relays.

Three modes: ``sync`` (``send_message_in_transaction`` waits for its decision
to be acknowledged) and ``oneway`` (``end_oneway=True``: it returns after the
local transaction), each as fast as ``senders`` threads go, and ``steady``:
sync sends at a fixed offered load (``--rate``, 1 000 tx/s), spread over
``STEADY_SENDERS`` threads on a fixed schedule, which is what a service sees
when it is not saturating the outbox. A producer without ``end_oneway`` (the setting is
rejected) reports the oneway mode as unavailable rather than failing.

And the yardstick, ``plain``: what Kafka itself allows on this machine. As many
threads send plain idempotent ``acks=all`` records to a topic that
:mod:`bench.eos_copy`, Kafka's own consume → produce → commit loop in a process
of its own, copies to another; each record is timed from its send until its
copy is visible. The relay's path is that loop plus the op write before it and
the half lookup inside it, so its ``sync`` latency over ``plain``'s at the same
senders is what the outbox adds to a Kafka exactly-once hop.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError
from rich.console import Console

from bench.common import bench_main, percentile_ms, run_on_broker
from bench.producer import SEND_TIMEOUT_SECONDS, CellRun, run_cell
from outbox import LocalTransactionState, Message, TransactionProducer
from outbox.acked_writer import AckedWriter
from outbox.admin import TopicSpec, ensure_topics, plan_topics
from outbox.config import kafka_client_config
from outbox.errors import HalfWriteError
from outbox.message import EndStatus
from outbox.protocol import Header, OutgoingRecord, TopicNames
from outbox.settings import ProducerSettings
from outbox_checker import metrics
from outbox_devtools.processes import free_port

GROUP = "bench-visible"
_TXN_HEADER = Header.TRANSACTION_ID.value
MODES = ("sync", "oneway", "steady", "plain", "plain-steady")
PACED = ("steady", "plain-steady")
"""Modes at the fixed offered load (``--rate``) rather than as fast as the senders go."""
STEADY_SENDERS = 16
"""Threads sharing the steady schedule: enough for sends of ~10 ms at 1 000 tx/s."""


class StampCommits:
    """Commits at once, noting when each local transaction answered, by transaction id."""

    def __init__(self) -> None:
        self.answered: dict[str, float] = {}

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        # The id is set: the producer hands the listener the message stamped with it.
        self.answered[message.transaction_id or ""] = time.monotonic()
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE


class Watcher:
    """A ``read_committed`` reader of the real topic: when each transaction id became visible."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._consumer = Consumer(
            {
                **kafka_client_config(bootstrap),
                "group.id": f"bench-visible-{uuid.uuid4().hex[:6]}",
                "isolation.level": "read_committed",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 5,
            }
        )
        self._consumer.subscribe([topic])
        self._thread = threading.Thread(target=self._run, name="bench-visible", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            # poll() returns at the first record; consume(n, timeout) would wait for n or the
            # whole timeout, and that wait would be counted as the relay's.
            first = self._consumer.poll(0.05)
            if first is None:
                continue
            for message in [first, *self._consumer.consume(1000, timeout=0)]:
                if message.error() is not None:
                    continue
                now = time.monotonic()
                for key, value in message.headers() or ():
                    if key == _TXN_HEADER and value is not None:
                        self.seen.setdefault(value.decode(), now)
                        break

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()


@dataclass
class ModeResult:
    mode: str
    senders: int
    available: bool
    unavailable_reason: str | None = None
    msgs_per_s: float | None = None
    committed: int = 0
    visible: int = 0
    """Committed sends inside the window whose real record was seen (before the grace ran out)."""
    visible_p50_ms: float | None = None
    visible_p99_ms: float | None = None
    visible_max_ms: float | None = None
    errors: int = 0
    other_cpu_pct: float | None = None
    stages: dict[str, dict[str, float | None]] = field(default_factory=dict)
    """The relay's stages in the window (:class:`StageScrape`): batches, mean and p99 ms."""


@dataclass
class Options:
    senders: int = 64
    rate: float = 1000.0
    """The steady mode's offered load, transactions per second."""
    seconds: float = 10.0
    warmup: float = 2.0
    value_bytes: int = 1024
    partitions: int = 8
    modes: list[str] = field(default_factory=lambda: list(MODES))
    bootstrap_servers: str | None = None
    json_path: Path | None = None


@dataclass
class Report:
    results: list[ModeResult]

    def of(self, mode: str) -> ModeResult | None:
        return next((r for r in self.results if r.mode == mode), None)

    @property
    def ok(self) -> bool:
        """Every send of an available mode committed, and every commit became visible."""
        return all(r.errors == 0 and r.visible == r.committed for r in self.results if r.available)

    @property
    def other_cpu_pct(self) -> float:
        return max((r.other_cpu_pct or 0.0 for r in self.results), default=0.0)

    @property
    def document(self) -> dict[str, Any]:
        return {"results": [asdict(r) for r in self.results], "ok": self.ok}


class StageScrape:
    """The relay's per-stage histograms (``outbox_checker_relay_stage_seconds``), scraped
    from the checker's ``/metrics`` before and after a mode: where a commit's time went."""

    def __init__(self, port: int) -> None:
        self._url = f"http://127.0.0.1:{port}/metrics"

    def sample(self) -> dict[str, dict[str, float]]:
        """Per stage, its ``sum``, ``count`` and cumulative buckets (``le`` as text)."""
        try:
            with urllib.request.urlopen(self._url, timeout=5) as answer:
                text = answer.read().decode()
        except OSError:
            return {}
        stages: dict[str, dict[str, float]] = {}
        for family in text_string_to_metric_families(text):
            if family.name != "outbox_checker_relay_stage_seconds":
                continue
            for sample in family.samples:
                stage = stages.setdefault(sample.labels["stage"], {})
                if sample.name.endswith("_bucket"):
                    stage[sample.labels["le"]] = sample.value
                elif sample.name.endswith(("_sum", "_count")):
                    stage[sample.name.rsplit("_", 1)[1]] = sample.value
        return stages

    @staticmethod
    def stage_ms(
        before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]
    ) -> dict[str, dict[str, float | None]]:
        """Per stage between two samples: batches, mean ms, and p99 ms as a bucket's bound."""
        figures: dict[str, dict[str, float | None]] = {}
        for stage, now in after.items():
            then = before.get(stage, {})
            count = now.get("count", 0.0) - then.get("count", 0.0)
            if count <= 0:
                continue
            mean = (now.get("sum", 0.0) - then.get("sum", 0.0)) / count * 1000
            bounds = sorted(
                (float(le), now[le] - then.get(le, 0.0)) for le in now if le not in ("sum", "count")
            )
            p99 = next((le * 1000 for le, n in bounds if n >= 0.99 * count), None)
            figures[stage] = {"batches": count, "mean_ms": round(mean, 2), "p99_ms": p99}
        return figures


def start_checker(
    bootstrap: str, prefix: str, log: IO[bytes], port: int
) -> subprocess.Popen[bytes]:
    """The checker sidecar (and its relay) as its own process, rounds effectively off.

    Its log goes to a file, not a pipe: a pipe nobody reads would stop it once full.
    """
    env = {
        **os.environ,
        "OUTBOX_BOOTSTRAP_SERVERS": bootstrap,
        "OUTBOX_TOPIC_PREFIX": prefix,
        "OUTBOX_HTTP_ADDRESS": f"127.0.0.1:{port}",
        "OUTBOX_CHECK_INTERVAL_SECONDS": "3600",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "outbox", "checker"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log,
    )


def _settings(bootstrap: str, prefix: str, mode: str) -> ProducerSettings | str:
    """The producer's settings for ``mode``, or why this producer cannot run it."""
    extra: dict[str, Any] = {"end_oneway": True} if mode == "oneway" else {}
    try:
        return ProducerSettings(bootstrap_servers=bootstrap, topic_prefix=prefix, **extra)
    except ValidationError as exc:
        return f"ProducerSettings rejects {sorted(extra)}: {exc.errors()[0]['msg']}"


def _wait_until_seen(watcher: Watcher, key: str, who: str) -> None:
    """Wait for the primer ``key`` to be visible: ``who`` has joined and publishes."""
    deadline = time.monotonic() + 90
    while key not in watcher.seen:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{who} published nothing within 90s")
        time.sleep(0.05)


def run_mode(
    options: Options,
    bootstrap: str,
    prefix: str,
    mode: str,
    broker_pid: int | None,
    stages: StageScrape,
) -> ModeResult:
    if mode.startswith("plain"):
        return run_plain(options, bootstrap, prefix, mode, broker_pid)
    settings = _settings(bootstrap, prefix, mode)
    senders = senders_of(mode, options)
    if isinstance(settings, str):
        return ModeResult(mode, senders, available=False, unavailable_reason=settings)
    real = f"{prefix}.events"
    value = os.urandom(options.value_bytes)
    listener = StampCommits()
    watcher = Watcher(bootstrap, real)
    producer = TransactionProducer(GROUP, listener, settings).start()
    committed: list[list[str]] = [[] for _ in range(senders)]
    pace = Pace(senders, options.rate if mode in PACED else None)
    try:
        primer = producer.send_message_in_transaction(Message(topic=real, value=b"primer"))
        _wait_until_seen(watcher, primer.transaction_id, "the checker's relay")

        def send(index: int, seq: int) -> float | None:
            pace.wait(index, seq)
            result = producer.send_message_in_transaction(Message(topic=real, value=value))
            if mode == "oneway" or result.end_status is EndStatus.COMMITTED:
                committed[index].append(result.transaction_id)
            return None

        stages_before = stages.sample()
        run = run_cell(send, senders, options.warmup, options.seconds, broker_pid)
        result = _result(mode, senders, options, run, committed, listener.answered, watcher)
        result.stages = StageScrape.stage_ms(stages_before, stages.sample())
    finally:
        producer.shutdown()
        watcher.close()
    return result


def yardstick_of(mode: str) -> str:
    """The ``plain`` mode measured like ``mode`` (the same senders, the same pace)."""
    return "plain-steady" if mode in PACED else "plain"


def senders_of(mode: str, options: Options) -> int:
    return STEADY_SENDERS if mode in PACED else options.senders


class Pace:
    """Holds ``senders`` threads to a fixed schedule of ``rate`` sends a second in all
    (``None``: no schedule, each sends as fast as it goes)."""

    def __init__(self, senders: int, rate: float | None) -> None:
        self._senders = senders
        self._rate = rate
        self._start: float | None = None

    def wait(self, index: int, seq: int) -> None:
        """Until send ``seq`` (from 1) of thread ``index`` is due."""
        if self._rate is None:
            return
        if self._start is None:
            self._start = time.monotonic()
        # Send k of thread i is due at (k * senders + i) / rate: a fixed offered load.
        due = self._start + ((seq - 1) * self._senders + index) / self._rate
        time.sleep(max(0.0, due - time.monotonic()))


def run_plain(
    options: Options, bootstrap: str, prefix: str, mode: str, broker_pid: int | None
) -> ModeResult:
    """The yardstick: plain sends, copied by Kafka's exactly-once loop (:mod:`bench.eos_copy`)."""
    source, copies = plain_topics(prefix)
    value = os.urandom(options.value_bytes)
    answered: dict[str, float] = {}
    senders = senders_of(mode, options)
    sent: list[list[str]] = [[] for _ in range(senders)]
    pace = Pace(senders, options.rate if mode in PACED else None)
    watcher = Watcher(bootstrap, copies)
    writer = AckedWriter(kafka_client_config(bootstrap))
    copier_command = [sys.executable, "-m", "bench.eos_copy", "--bootstrap-servers", bootstrap]
    copier_command += ["--source", source, "--sink", copies, "--group", f"{prefix}-copier"]
    with tempfile.TemporaryFile() as log:
        copier = subprocess.Popen(
            copier_command,
            cwd=Path(__file__).resolve().parent.parent,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )

        def send(index: int, seq: int) -> float | None:
            pace.wait(index, seq)
            key = uuid.uuid4().hex
            answered[key] = time.monotonic()
            record = OutgoingRecord(source, key.encode(), value, [(_TXN_HEADER, key.encode())])
            writer.write(record, SEND_TIMEOUT_SECONDS, HalfWriteError)
            sent[index].append(key)
            return None

        try:
            primer = OutgoingRecord(source, b"primer", b"", [(_TXN_HEADER, b"primer")])
            writer.write(primer, SEND_TIMEOUT_SECONDS, HalfWriteError)
            _wait_until_seen(watcher, "primer", "Kafka's exactly-once copy loop")
            run = run_cell(send, senders, options.warmup, options.seconds, broker_pid)
            return _result(mode, senders, options, run, sent, answered, watcher)
        except RuntimeError as exc:
            log.seek(0)
            tail = log.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"{exc}; the copy loop's log ends: {tail}") from None
        finally:
            stop_process(copier)
            writer.close(10)
            watcher.close()


def plain_topics(prefix: str) -> tuple[str, str]:
    """The ``plain`` mode's source topic and the topic its copies go to."""
    return f"{prefix}.plain", f"{prefix}.plain-copies"


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 30 s."""
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _result(
    mode: str,
    senders: int,
    options: Options,
    run: CellRun,
    committed: list[list[str]],
    answered: dict[str, float],
    watcher: Watcher,
) -> ModeResult:
    """The mode's figures: the keys ``committed`` and answered in ``run``'s window, each
    timed from ``answered`` until ``watcher`` saw it (waiting up to 30 s for the last)."""
    # run_cell's window is on the perf_counter clock, the stamps on the monotonic one.
    shift = time.monotonic() - time.perf_counter()
    start, end = run.window_start + shift, run.window_end + shift
    inside = [key for mine in committed for key in mine if start <= answered.get(key, -1.0) < end]
    deadline = time.monotonic() + 30
    while any(key not in watcher.seen for key in inside) and time.monotonic() < deadline:
        time.sleep(0.1)
    delays = [watcher.seen[key] - answered[key] for key in inside if key in watcher.seen]
    return ModeResult(
        mode,
        senders,
        available=True,
        msgs_per_s=round(len(inside) / options.seconds, 1),
        committed=len(inside),
        visible=len(delays),
        visible_p50_ms=percentile_ms(delays, 50),
        visible_p99_ms=percentile_ms(delays, 99),
        visible_max_ms=percentile_ms(delays, 100),
        errors=len(run.errors),
        other_cpu_pct=run.other_cpu_pct,
    )


def measure(console: Console, options: Options, bootstrap: str, broker_pid: int | None) -> Report:
    prefix = f"bench-visible-{uuid.uuid4().hex[:6]}"
    topics = TopicNames(prefix)
    ensure_topics(
        AdminClient(kafka_client_config(bootstrap)),
        [
            *plan_topics(topics, options.partitions, 1, (GROUP,)),
            TopicSpec(f"{prefix}.events", options.partitions, 1),
            *(TopicSpec(topic, options.partitions, 1) for topic in plain_topics(prefix)),
        ],
    )
    port = free_port()
    with tempfile.TemporaryFile() as log:
        checker = start_checker(bootstrap, prefix, log, port)
        try:
            results = [
                _mode_with_progress(
                    console,
                    options,
                    bootstrap,
                    prefix,
                    mode,
                    broker_pid,
                    checker,
                    log,
                    StageScrape(port),
                )
                for mode in options.modes
            ]
        finally:
            stop_process(checker)
    return Report(results)


def _mode_with_progress(
    console: Console,
    options: Options,
    bootstrap: str,
    prefix: str,
    mode: str,
    broker_pid: int | None,
    checker: subprocess.Popen[bytes],
    log: IO[bytes],
    stages: StageScrape,
) -> ModeResult:
    console.print(
        f"[bold cyan]==>[/] {mode} senders="
        f"{senders_of(mode, options)}"
        f"{f' at {options.rate:g} tx/s' if mode in PACED else ''}, "
        f"{'Kafka copy loop copying' if mode.startswith('plain') else 'checker relaying'}: "
        f"warm-up {options.warmup:g}s, measuring {options.seconds:g}s",
        highlight=False,
    )
    if checker.poll() is not None:
        log.seek(0)
        tail = log.read().decode(errors="replace")[-2000:]
        raise RuntimeError(f"the checker exited {checker.returncode}: {tail}")
    result = run_mode(options, bootstrap, prefix, mode, broker_pid, stages)
    if not result.available:
        console.print(f"    unavailable: {result.unavailable_reason}", highlight=False)
    else:
        console.print(
            f"    {result.msgs_per_s:,.0f} msg/s; visible p50/p99/max "
            f"{result.visible_p50_ms} / {result.visible_p99_ms} / {result.visible_max_ms} ms; "
            f"{result.visible:,} of {result.committed:,} commits seen, "
            f"{result.errors} errors, other cpu {result.other_cpu_pct}%",
            highlight=False,
        )
        if not mode.startswith("plain"):
            console.print(f"    relay stages: {stage_line(result.stages)}", highlight=False)
    return result


def stage_line(stages: dict[str, dict[str, float | None]]) -> str:
    """``op_wait 3.1 / 9.8 ms, ...``: each stage's mean / p99 per batch, in stage order."""
    parts = [
        f"{name} {stages[name]['mean_ms']:g} / {stages[name]['p99_ms']:g} ms"
        for name in metrics.RELAY_STAGES
        if name in stages and stages[name]["p99_ms"] is not None
    ]
    return ", ".join(parts) + " (mean / p99 per batch)" if parts else "not scraped"


def parse_args(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.visible",
        description="Commit-to-visible latency through the checker's relay.",
    )
    parser.add_argument("--senders", type=int, default=Options.senders)
    parser.add_argument("--seconds", type=float, default=Options.seconds)
    parser.add_argument("--warmup", type=float, default=Options.warmup)
    parser.add_argument("--value-bytes", type=int, default=Options.value_bytes)
    parser.add_argument("--partitions", type=int, default=Options.partitions)
    parser.add_argument("--rate", type=float, default=Options.rate, help="steady tx/s")
    parser.add_argument("--modes", default=",".join(MODES), help=f"of {', '.join(MODES)}")
    parser.add_argument("--bootstrap-servers")
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes are of {', '.join(MODES)}, got {args.modes!r}")
    if args.rate <= 0:
        parser.error("--rate must be positive")
    if args.senders < 1 or args.seconds <= 0 or args.warmup < 0 or args.value_bytes < 1:
        parser.error("--senders, --seconds and --value-bytes must be positive")
    if args.partitions < 1:
        parser.error("--partitions must be at least 1")
    return Options(
        senders=args.senders,
        rate=args.rate,
        seconds=args.seconds,
        warmup=args.warmup,
        value_bytes=args.value_bytes,
        partitions=args.partitions,
        modes=modes,
        bootstrap_servers=args.bootstrap_servers,
    )


def run(console: Console, options: Options) -> int:
    return run_on_broker(console, options, _run_against)


def _run_against(console: Console, options: Options, bootstrap: str, broker_pid: int | None) -> int:
    return 0 if measure(console, options, bootstrap, broker_pid).ok else 1


def main(argv: Sequence[str] | None = None) -> None:
    bench_main(parse_args(argv), run)


if __name__ == "__main__":
    main()
