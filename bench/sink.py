"""``make bench-sink``: how fast the Spark sink lands events, and how late they land.

Two measurements, on a local Kafka broker (or ``--bootstrap-servers``) and a
local Spark driver (``--master``, default ``local[*]``), with the sink's
default settings (RocksDB state, Parquet, 8 state partitions):

* **throughput** (``--once``): ``--events`` real records of ``--value-bytes``
  (default 1 000 000 of 1 KiB) are put on a fresh topic first, then
  available-now runs over them, each into a new table: the sink with its
  defaults in a fresh driver (cold), a **plain Spark job** (Spark's Kafka source
  → Parquet, no header parsing, no de-duplication, no partitioning: what
  ingestion costs without the sink), and the sink in each ``--modes`` entry
  (format/dedup) in the warmed-up driver. Rows per second is the event count
  over a run's wall time (query start to finish, planning and the no-data batch
  included, driver start-up not); ``ratio`` is the sink's default mode over the
  plain job. The records are written
  the way a commit writes them (real topic, ``outbox-transaction-id`` and
  ``outbox-producer-group`` headers, inside Kafka transactions) but straight
  from a transactional producer, because the sink only ever sees the real
  records and the producer's own speed is ``make bench-producer``'s subject.
* **delay** (continuous): with the sink running (``--trigger``, default 0s:
  one micro-batch after the other), :class:`~outbox.producer.TransactionProducer`
  commits events at ``--rate`` per second for ``--live-seconds``. An event's
  delay runs from ``send_message_in_transaction`` returning COMMITTED to the
  moment the file sink commits the batch that holds it (the new entry in the
  table's ``_spark_metadata`` log, which is when a Spark reader first sees the
  row). Median and p99 over every event of the run.

Both runs check the table afterwards: every event exactly once.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from rich.console import Console

from bench.common import (
    bench_main,
    host_cpu_seconds,
    percentile_ms,
    print_last_line,
    process_cpu_seconds,
    run_on_broker,
    save_results,
    warn_if_noisy,
)
from bench.sink_table import (
    MERGE_MODE,
    WARMUP_EVENTS,
    Delay,
    OnceRun,
    Options,
    Throughput,
    fmt,
    results_table,
)
from outbox.acked_writer import produce_when_room
from outbox.admin import TopicSpec, ensure_topics, plan_topics
from outbox.config import kafka_client_config
from outbox.message import EndStatus, LocalTransactionState, Message
from outbox.producer import TransactionProducer
from outbox.protocol import Header, TopicNames
from outbox.settings import ProducerSettings
from outbox_checker.relay import Relay
from outbox_devtools.kafka import KAFKA_VERSION

PREFIX = "bench-sink"
GROUP = "bench-sink"
RESULTS_PATH = Path(__file__).resolve().parent / "results" / "sink.json"
LOAD_TRANSACTION_SIZE = 2000


DEFAULT_MODES = ("parquet/window", "parquet/off", MERGE_MODE, "delta/off")
"""The sink's format/dedup pairs timed against the plain job; the first is the default."""


@dataclass
class Report:
    """What :func:`measure` found, for the command line and for ``bench.all`` alike."""

    throughput: Throughput
    delay: Delay
    document: dict[str, Any]
    """Everything, as written to the JSON."""
    ok: bool
    """Both tables hold every event exactly once, and no live send failed."""
    other_cpu_pct: float
    """The most CPU other processes used during a run: the noise in these numbers."""


# --------------------------------------------------------------------------- CPU


@contextmanager
def cpu_usage(pids: dict[str, int | None]) -> Iterator[dict[str, float | None]]:
    """% of one core used by this process, each named pid and everything else meanwhile.

    "other" is noise: other tenants of a shared machine, which slow every number here.
    """
    result: dict[str, float | None] = {}
    began = time.monotonic()
    host = host_cpu_seconds()
    before = {"bench": process_cpu_seconds(None)} | {
        name: process_cpu_seconds(pid) for name, pid in pids.items() if pid
    }
    yield result
    wall = max(1e-6, time.monotonic() - began)
    host_after = host_cpu_seconds()
    after = {"bench": process_cpu_seconds(None)} | {
        name: process_cpu_seconds(pid) for name, pid in pids.items() if pid
    }
    for name, start in before.items():
        end = after.get(name)
        result[name] = None if start is None or end is None else round(100 * (end - start) / wall)
    if host is not None and host_after is not None:
        ours = sum(v for v in result.values() if v is not None)
        result["other"] = max(0.0, round(100 * (host_after - host) / wall - ours))


# --------------------------------------------------------------------------- helpers


def _local(path: str) -> str:
    """A file URI or path, as a plain absolute path, so two spellings compare equal."""
    return os.path.normpath(
        urlparse(path).path if "://" in path or path.startswith("file:") else path
    )


def _jvm_pid(spark: Any) -> int | None:
    gateway = getattr(spark.sparkContext, "_gateway", None)
    proc = getattr(gateway, "proc", None)
    return getattr(proc, "pid", None)


def load_events(bootstrap: str, topic: str, count: int, value_bytes: int) -> float:
    """``count`` committed real records on ``topic``, as commits write them; seconds taken."""
    producer = Producer(
        kafka_client_config(
            bootstrap,
            {
                "transactional.id": f"bench-sink-load-{uuid.uuid4().hex}",
                "linger.ms": 20,
                "batch.size": 1_000_000,
                "compression.type": "none",
            },
        )
    )
    value = os.urandom(value_bytes)
    began = time.monotonic()
    producer.init_transactions(60)
    for start in range(0, count, LOAD_TRANSACTION_SIZE):
        producer.begin_transaction()
        for i in range(start, min(count, start + LOAD_TRANSACTION_SIZE)):
            headers = [
                (Header.TRANSACTION_ID.value, uuid.uuid4().hex.encode()),
                (Header.PRODUCER_GROUP.value, GROUP.encode()),
            ]
            produce_when_room(
                producer, topic=topic, value=value, key=str(i).encode(), headers=headers
            )
        producer.commit_transaction(120)
    return time.monotonic() - began


def table_ids(
    spark: Any, path: str, fmt: str = "parquet", column: str = "transaction_id"
) -> list[Any]:
    return [row[0] for row in spark.read.format(fmt).load(path).select(column).collect()]


# --------------------------------------------------------------------------- throughput


def new_topic(bootstrap: str, suffix: str, partitions: int) -> str:
    """A fresh topic of the bench's own."""
    topic = f"{PREFIX}-{uuid.uuid4().hex[:6]}.{suffix}"
    ensure_topics(AdminClient(kafka_client_config(bootstrap)), [TopicSpec(topic, partitions, 1)])
    return topic


def measure_throughput(
    console: Console,
    spark: Any,
    options: Options,
    bootstrap: str,
    work: Path,
    broker_pid: int | None,
) -> Throughput:
    topic = new_topic(bootstrap, "events", options.partitions)
    console.print(
        f"[bold cyan]==>[/] loading {options.events:,} events of {options.value_bytes} B "
        f"onto {topic} ({options.partitions} partitions)",
        highlight=False,
    )
    load_seconds = load_events(bootstrap, topic, options.events, options.value_bytes)
    console.print(f"    loaded in {load_seconds:.1f}s", highlight=False)

    cold = once_run(console, spark, options, bootstrap, topic, work / "cold", broker_pid, "cold")
    plain = plain_run(console, spark, bootstrap, topic, work / "plain", broker_pid)
    warm_up_delta(console, spark, options, bootstrap, work, broker_pid)
    modes = [
        once_run(console, spark, options, bootstrap, topic, work / mode, broker_pid, "warm", mode)
        for mode in options.modes
    ]
    return Throughput(
        events=options.events,
        load_seconds=round(load_seconds, 2),
        cold=cold,
        warm=modes[0],
        plain=plain,
        modes=modes,
    )


def warm_up_delta(
    console: Console,
    spark: Any,
    options: Options,
    bootstrap: str,
    work: Path,
    broker_pid: int | None,
) -> None:
    """The Delta modes once over a few events first, untimed: "warm" means warm for them too.

    Without it the first Delta mode pays for loading and compiling Delta Lake's
    code (its snapshot and commit jobs took some 30 s of a 90 s run here).
    """
    delta_modes = [mode for mode in options.modes if mode.startswith("delta/")]
    if not delta_modes:
        return
    topic = new_topic(bootstrap, "warmup", options.partitions)
    load_events(bootstrap, topic, WARMUP_EVENTS, options.value_bytes)
    for mode in delta_modes:
        once_run(
            console,
            spark,
            options,
            bootstrap,
            topic,
            work / f"warmup-{mode}",
            broker_pid,
            "warm-up",
            mode,
        )


def plain_run(
    console: Console, spark: Any, bootstrap: str, topic: str, work: Path, broker_pid: int | None
) -> OnceRun:
    """Plain Spark ingestion of ``topic``: what the sink is measured against.

    Spark's Kafka source (read_committed, as the topic is transactional; headers
    kept as they come) straight into Parquet, with an available-now trigger like
    the sink's ``--once``: no header map, no de-duplication, no partitioning.
    """
    from spark_sink.progress import progress_dict

    table = work / "table"
    console.print("[bold cyan]==>[/] plain Spark job: Kafka → Parquet (warm JVM)", highlight=False)
    with cpu_usage({"spark": _jvm_pid(spark), "broker": broker_pid}) as cpu:
        began = time.monotonic()
        query = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("kafka.isolation.level", "read_committed")
            .option("includeHeaders", "true")
            .load()
            .writeStream.format("parquet")
            .option("path", str(table))
            .option("checkpointLocation", str(work / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        run_seconds = time.monotonic() - began
    batches = [progress_dict(p) for p in query.recentProgress]
    rows = sum(int(b.get("numInputRows") or 0) for b in batches)
    offsets = table_ids(spark, str(table), column="offset")
    console.print(f"    {rows:,} rows in {run_seconds:.1f}s", highlight=False)
    return OnceRun(
        jvm="plain",
        run_seconds=round(run_seconds, 2),
        rows_per_s=round(rows / run_seconds, 1),
        batches=len(batches),
        rows_written=rows,
        batch_seconds=[round(int(b.get("batchDuration") or 0) / 1000, 2) for b in batches],
        table_rows=len(offsets),
        table_distinct_ids=len(offsets),
        cpu=cpu,
    )


def once_run(
    console: Console,
    spark: Any,
    options: Options,
    bootstrap: str,
    topic: str,
    work: Path,
    broker_pid: int | None,
    jvm: str,
    mode: str = DEFAULT_MODES[0],
) -> OnceRun:
    """``outbox sink --once`` over ``topic`` into a new table, timed from start to finish.

    The first run in a driver pays for class loading, JIT compilation and code
    generation (what a cron-started ``--once`` pays every time); the second
    shows the steady state a continuously running sink works at.
    """
    from spark_sink import BatchProgress, run_sink
    from spark_sink.settings import SinkSettings

    table_format, dedup = mode.split("/")
    settings = SinkSettings(
        bootstrap_servers=bootstrap,
        topics=(topic,),
        output=str(work / "table"),
        checkpoint=str(work / "checkpoint"),
        once=True,
        shuffle_partitions=options.shuffle_partitions,
        topic_prefix=PREFIX,
        format=table_format,
        dedup=dedup,
    )
    batches: list[BatchProgress] = []

    def report(batch: BatchProgress) -> None:
        batches.append(batch)
        console.print(f"    {batch.line()}", highlight=False)

    console.print(f"[bold cyan]==>[/] sink --once, {mode} ({jvm} JVM)", highlight=False)
    with cpu_usage({"spark": _jvm_pid(spark), "broker": broker_pid}) as cpu:
        began = time.monotonic()
        summary = run_sink(settings, spark, on_progress=report)
        run_seconds = time.monotonic() - began
    ids = table_ids(spark, settings.output, table_format)
    return OnceRun(
        jvm=f"{jvm} {mode}",
        run_seconds=round(run_seconds, 2),
        rows_per_s=round(summary.rows_written / run_seconds, 1),
        batches=summary.batches,
        rows_written=summary.rows_written,
        batch_seconds=[round(b.duration_ms / 1000, 2) for b in batches],
        table_rows=len(ids),
        table_distinct_ids=len(set(ids)),
        cpu=cpu,
    )


# --------------------------------------------------------------------------- delay


class CommitWatcher(threading.Thread):
    """Notes when each batch of the file sink's ``_spark_metadata`` log appears.

    Spark writes each log entry atomically (write, then rename), so the moment
    the file is there is the moment a reader of the table can see the batch.
    """

    def __init__(self, table: Path) -> None:
        super().__init__(name="bench-sink-watcher", daemon=True)
        self.log_dir = table / "_spark_metadata"
        self.seen: dict[str, float] = {}
        self.stop = threading.Event()
        self.started_at = 0.0

    def run(self) -> None:
        self.poll()  # batches committed before the measured run: not timed
        self.started_at = time.time()
        while not self.stop.is_set():
            self.poll()
            time.sleep(0.01)
        self.poll()

    def poll(self) -> None:
        try:
            names = os.listdir(self.log_dir)
        except FileNotFoundError:
            return
        now = time.time()
        for name in names:
            if re.fullmatch(r"\d+(\.compact)?", name) and name not in self.seen:
                self.seen[name] = now

    def file_visible_at(self) -> dict[str, float]:
        """Each data file of the table → when the batch that added it became visible."""
        visible: dict[str, float] = {}
        for name, at in sorted(self.seen.items(), key=lambda item: int(item[0].split(".")[0])):
            lines = (self.log_dir / name).read_text().splitlines()[1:]
            for line in lines:
                entry = json.loads(line)
                path = _local(entry["path"])
                if entry.get("action", "add") == "add" and path not in visible:
                    visible[path] = at
        return visible


def measure_delay(
    console: Console,
    spark: Any,
    options: Options,
    bootstrap: str,
    work: Path,
    broker_pid: int | None,
) -> Delay:
    from pyspark.sql import functions as F

    from spark_sink import start_sink
    from spark_sink.settings import SinkSettings

    names = TopicNames(f"{PREFIX}-{uuid.uuid4().hex[:6]}")
    topic = f"{names.prefix}.live"
    ensure_topics(
        AdminClient(kafka_client_config(bootstrap)),
        [
            *plan_topics(names, options.partitions, 1, (GROUP,)),
            TopicSpec(topic, options.partitions, 1),
        ],
    )
    table = work / "live" / "table"
    settings = SinkSettings(
        bootstrap_servers=bootstrap,
        topics=(topic,),
        output=str(table),
        checkpoint=str(work / "live" / "checkpoint"),
        once=False,
        trigger=options.trigger,
        shuffle_partitions=options.shuffle_partitions,
        topic_prefix=names.prefix,
    )
    producer_settings = ProducerSettings(bootstrap_servers=bootstrap, topic_prefix=names.prefix)
    listener = _CommitAtOnce()
    committed_at: dict[str, float] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()
    value = os.urandom(options.value_bytes)

    console.print(
        f"[bold cyan]==>[/] continuous sink (trigger {options.trigger}) on {topic}", highlight=False
    )
    run = start_sink(settings, spark)
    watcher = CommitWatcher(table)
    # The checker's relay publishes the commits, as the sidecar does in a deployment:
    # the delay measured is commit -> relay -> real topic -> sink -> row.
    relay = Relay(
        kafka_client_config(bootstrap),
        names,
        group_id=f"{names.prefix}.checker.relay",
        transactional_id=f"{names.prefix}.relay.bench-sink",
    )
    relay.start()
    sending = TransactionProducer(GROUP, listener, producer_settings)
    with contextlib.closing(relay), sending as producer:
        for i in range(WARMUP_EVENTS):
            producer.send_message_in_transaction(Message(topic, value, key=f"warm-{i}"))
        if not run.wait_until(lambda s: s.rows_written >= WARMUP_EVENTS, 180):
            raise RuntimeError(f"the warm-up events did not land within 180s: {run.summary}")
        console.print(
            f"    warmed up; committing {options.rate:g} events/s for {options.live_seconds:g}s "
            f"from {options.live_senders} threads",
            highlight=False,
        )
        watcher.start()
        batches_before = run.summary.batches

        def sender(index: int) -> None:
            interval = options.live_senders / options.rate
            began = time.monotonic()
            seq = 0
            while True:
                due = began + seq * interval + index * interval / options.live_senders
                if due - began >= options.live_seconds:
                    return
                time.sleep(max(0.0, due - time.monotonic()))
                seq += 1
                try:
                    result = producer.send_message_in_transaction(
                        Message(topic, value, key=f"{index}:{seq}")
                    )
                except Exception as exc:
                    with lock:
                        errors.append(exc)
                    continue
                done = time.time()
                if result.end_status is EndStatus.COMMITTED:
                    with lock:
                        committed_at[result.transaction_id] = done

        threads = [
            threading.Thread(target=sender, args=(i,), name=f"bench-sink-sender-{i}", daemon=True)
            for i in range(options.live_senders)
        ]
        with cpu_usage({"spark": _jvm_pid(spark), "broker": broker_pid}) as cpu:
            for thread in threads:
                thread.start()
            while any(thread.is_alive() for thread in threads):
                run.wait(timeout=0.5)
            expected = WARMUP_EVENTS + len(committed_at)
            landed = run.wait_until(lambda s: s.rows_written >= expected, 120)
        time.sleep(0.2)
        watcher.stop.set()
        watcher.join(5)
        phases = batch_phases(run.query.recentProgress, batches_before)
        summary = run.stop()
    if not landed:
        console.print(f"[red]not every event landed:[/] {summary}", highlight=False)

    visible = watcher.file_visible_at()
    rows = (
        spark.read.parquet(str(table))
        .select("transaction_id", F.input_file_name().alias("file"))
        .collect()
    )
    delays = []
    for row in rows:
        at = visible.get(_local(row.file))
        if row.transaction_id in committed_at and at is not None:
            delays.append(at - committed_at[row.transaction_id])
    ids = [row.transaction_id for row in rows]
    batch_times = sorted(at for at in watcher.seen.values() if at > watcher.started_at)
    gaps = [later - earlier for earlier, later in itertools.pairwise(batch_times)]
    return Delay(
        trigger=options.trigger,
        rate=options.rate,
        seconds=options.live_seconds,
        events=len(committed_at) + len(errors),
        committed=len(committed_at),
        landed=len(delays),
        batches=summary.batches - batches_before,
        delay_p50_ms=percentile_ms(delays, 50, digits=1),
        delay_p99_ms=percentile_ms(delays, 99, digits=1),
        delay_max_ms=percentile_ms(delays, 100, digits=1),
        batch_p50_ms=percentile_ms(gaps, 50, digits=1),
        table_rows=len(ids),
        table_distinct_ids=len(set(ids)),
        send_errors=len(errors),
        cpu=cpu,
        phases_p50_ms=phases,
    )


def batch_phases(progress: Sequence[Any], after_batch: int) -> dict[str, float]:
    """Median ms of each ``durationMs`` phase over the batches with data past ``after_batch``.

    ``triggerExecution`` is the whole batch; ``addBatch`` the job that reads,
    de-duplicates and writes; the rest is the driver's fixed cost per batch
    (offsets, planning, the offsets and commits logs).
    """
    from spark_sink.progress import progress_dict

    phases: dict[str, list[float]] = {}
    for raw in progress:
        data = progress_dict(raw)
        if int(data.get("batchId", -1)) < after_batch or not data.get("numInputRows"):
            continue
        for name, ms in (data.get("durationMs") or {}).items():
            phases.setdefault(name, []).append(float(ms) / 1000)
    return {name: percentile_ms(values, 50, digits=0) or 0.0 for name, values in phases.items()}


class _CommitAtOnce:
    """A local transaction with no work: commits."""

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE


# --------------------------------------------------------------------------- the bench


def run(console: Console, options: Options) -> int:
    return run_on_broker(console, options, _run_against, heap="1g")


def _run_against(console: Console, options: Options, bootstrap: str, broker_pid: int | None) -> int:
    report = measure(console, options, bootstrap, broker_pid)
    delay = report.delay
    print_last_line(
        console,
        f"bench-sink: rows_per_s={report.throughput.rows_per_s:.0f} "
        f"plain_rows_per_s={report.throughput.plain.rows_per_s:.0f} "
        f"ratio={report.throughput.ratio:.2f} delay_p99_ms={fmt(delay.delay_p99_ms)} "
        f"merge_rows_per_s={fmt(report.throughput.merge_rows_per_s)}",
    )
    return 0 if report.ok else 1


def measure(console: Console, options: Options, bootstrap: str, broker_pid: int | None) -> Report:
    """Start Spark, time the ``--once`` runs and the live delay on ``bootstrap``; print, save.

    ``broker_pid`` (a local broker's) lets each run report the broker's CPU.
    """
    from spark_sink.jars import connector_coordinates, ensure_spark_kafka_jars
    from spark_sink.session import create_session

    began = time.monotonic()
    ensure_spark_kafka_jars()
    console.print(f"[bold cyan]==>[/] starting Spark ({options.master})", highlight=False)
    started = time.monotonic()
    spark = create_session(options.master, "bench-sink", {"spark.ui.enabled": "false"}, delta=True)
    session_seconds = time.monotonic() - started
    console.print(f"    Spark {spark.version} up in {session_seconds:.1f}s", highlight=False)
    work = Path(tempfile.mkdtemp(prefix="bench-sink-"))
    try:
        throughput = measure_throughput(console, spark, options, bootstrap, work, broker_pid)
        delay = measure_delay(console, spark, options, bootstrap, work, broker_pid)
        spark_version = spark.version
    finally:
        spark.stop()
        if not options.keep_dir:
            shutil.rmtree(work, ignore_errors=True)

    busiest = max(
        throughput.cold.cpu.get("other") or 0.0,
        throughput.warm.cpu.get("other") or 0.0,
        delay.cpu.get("other") or 0.0,
    )
    warn_if_noisy(console, busiest, "the runs")
    console.print(results_table(throughput, delay, options))
    exact_once = all(
        run.exactly_once and run.rows_written == options.events
        for run in (throughput.cold, throughput.plain, *throughput.modes)
    )
    exact_live = delay.exactly_once
    document = {
        "bench": "sink",
        "created_unix": round(time.time(), 3),
        "elapsed_seconds": round(time.monotonic() - began, 1),
        "config": {
            "events": options.events,
            "value_bytes": options.value_bytes,
            "partitions": options.partitions,
            "rate": options.rate,
            "live_seconds": options.live_seconds,
            "live_senders": options.live_senders,
            "trigger": options.trigger,
            "master": options.master,
            "shuffle_partitions": options.shuffle_partitions,
            "modes": list(options.modes),
            "local_broker": options.bootstrap_servers is None,
        },
        "environment": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "spark": spark_version,
            "spark_kafka_connector": connector_coordinates(),
            "kafka": KAFKA_VERSION,
            "spark_session_start_seconds": round(session_seconds, 1),
        },
        "throughput": asdict(throughput)
        | {"rows_per_s": throughput.rows_per_s, "ratio": throughput.ratio},
        "delay": asdict(delay),
        "verification": {"once_exactly_once": exact_once, "live_exactly_once": exact_live},
        "summary": {
            "rows_per_s": throughput.rows_per_s,
            "plain_rows_per_s": throughput.plain.rows_per_s,
            "ratio": round(throughput.ratio, 3),
            "merge_rows_per_s": throughput.merge_rows_per_s,
            "rows_per_s_by_mode": {run.jvm: run.rows_per_s for run in throughput.modes},
            "rows_per_s_cold_jvm": throughput.cold.rows_per_s,
            "delay_p50_ms": delay.delay_p50_ms,
            "delay_p99_ms": delay.delay_p99_ms,
        },
    }
    save_results(console, options.json_path, document)
    ok = exact_once and exact_live and not delay.send_errors
    return Report(throughput, delay, document, ok=ok, other_cpu_pct=busiest)


def parse_args(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.sink",
        description="Spark sink: rows/s into Parquet (--once), commit-to-row delay (continuous).",
    )
    parser.add_argument("--events", type=int, default=1_000_000, help="events, --once runs")
    parser.add_argument(
        "--modes",
        default=",".join(DEFAULT_MODES),
        help="format/dedup pairs of the sink to time, comma-separated; the first is the ratio's",
    )
    parser.add_argument("--value-bytes", type=int, default=1024)
    parser.add_argument("--partitions", type=int, default=8, help="partitions of the topics")
    parser.add_argument("--rate", type=float, default=100.0, help="events/s in the delay run")
    parser.add_argument("--live-seconds", type=float, default=30.0, help="length of the delay run")
    parser.add_argument("--live-senders", type=int, default=4, help="sender threads, delay run")
    parser.add_argument("--trigger", default="0s", help="sink trigger in the delay run")
    parser.add_argument("--master", default="local[*]", help="Spark master")
    parser.add_argument("--shuffle-partitions", type=int, default=8, help="state partitions")
    parser.add_argument(
        "--bootstrap-servers", help="use this broker instead of starting a local one"
    )
    parser.add_argument("--json", dest="json_path", type=Path, default=RESULTS_PATH)
    parser.add_argument("--keep-dir", action="store_true", help="keep the tables and checkpoints")
    args = parser.parse_args(argv)
    if min(args.events, args.value_bytes, args.partitions, args.live_senders) < 1:
        parser.error("--events, --value-bytes, --partitions and --live-senders must be positive")
    if args.rate <= 0 or args.live_seconds <= 0:
        parser.error("--rate and --live-seconds must be positive")
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    known = {"parquet/window", "parquet/off", "delta/window", "delta/merge", "delta/off"}
    if not modes or set(modes) - known:
        parser.error(f"--modes takes format/dedup pairs among {', '.join(sorted(known))}")
    return Options(
        events=args.events,
        value_bytes=args.value_bytes,
        partitions=args.partitions,
        rate=args.rate,
        live_seconds=args.live_seconds,
        live_senders=args.live_senders,
        trigger=args.trigger,
        master=args.master,
        shuffle_partitions=args.shuffle_partitions,
        bootstrap_servers=args.bootstrap_servers,
        json_path=args.json_path,
        keep_dir=args.keep_dir,
        modes=modes,
    )


def main(argv: Sequence[str] | None = None) -> None:
    bench_main(parse_args(argv), run)


if __name__ == "__main__":
    main()
