"""The sink job: committed events, de-duplicated by transaction id, into a table.

Pipeline: :func:`~spark_sink.reader.read_outbox_events` (``read_committed``)
→ count rows in and rows without a transaction id → de-duplicate → count rows
out → a file sink (Parquet by default) partitioned by ``topic`` and ``date``
(UTC date of the Kafka timestamp), with its own checkpoint. The file sink and
the checkpoint make each micro-batch land exactly once, across crashes and
restarts; the de-duplication removes the second copy of a transaction that was
*published* twice (the relay publishes each commit once, so a copy comes from
another writer of the topic, or a replay of it).

``--format delta`` writes through ``foreachBatch`` instead, one idempotent
Delta commit per micro-batch; see :mod:`spark_sink.delta`.

De-duplication modes (``--dedup``)
----------------------------------
* ``window`` (the default for file formats): the state below, bounded in time;
* ``merge`` (the default for Delta): a ``MERGE`` against the table, no time
  bound (:mod:`spark_sink.delta`);
* ``off``: every record lands; for topics only the relay writes.

The window, and its bound
-------------------------
``dropDuplicatesWithinWatermark`` on the transaction id, with the watermark on
the **ingestion time** (the micro-batch's timestamp, kept as ``ingested_at``),
not on the Kafka timestamp. A transaction id stays in the state for at least
``dedup_window`` (default 1 h) after its first copy was ingested, and is then
evicted, so the state is bounded by the ingest rate times the window (RocksDB
keeps it on local disk and in the checkpoint, not in the JVM heap).

Why ingestion time: Spark drops rows older than the watermark as "late". On
the Kafka timestamp, a record with an old timestamp (a producer's clock, a
topic that newly matches ``--pattern`` with history, partitions read unevenly
after a long stop) would be dropped silently: a committed event lost. On
ingestion time no row is ever late, and copies published within minutes of
each other (the check-back window) are ingested within minutes of each other
too, even after the sink was stopped for longer than the window: the state is
evicted only by batches that run, and the first batch after a restart still
holds it. Copies ingested more than the window apart are both kept.

Records without a transaction id are kept, never de-duplicated together: their
de-duplication key is their Kafka position, which is unique.
"""

from __future__ import annotations

import contextlib
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Any

from spark_sink.errors import (
    CheckpointError,
    KafkaSourceError,
    OutputPathError,
    SinkError,
    SparkJarsError,
)
from spark_sink.jars import connector_coordinates
from spark_sink.preflight import check_kafka, check_paths, local_path
from spark_sink.progress import (
    IN_METRICS,
    OUT_METRICS,
    BatchProgress,
    SinkSummary,
    progress_dict,
)
from spark_sink.settings import SinkSettings
from spark_sink.table_layout import DEDUP_KEY, PARTITION_COLUMNS, dedup_key

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from spark_sink.delta import DeltaBatchWriter

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
MEMORY_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
DELTA_SNAPSHOT_PARTITIONS = "spark.databricks.delta.snapshotPartitions"
NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"
CONCURRENT_WRITERS = "spark.sql.maxConcurrentOutputFileWriters"
PARTITION_WRITERS = 8
"""Output files a write task keeps open at once, one per ``topic``/``date`` it meets."""
FETCH_MAX_WAIT = "fetch.max.wait.ms"
FETCH_MAX_WAIT_MS = "10"
"""How long a source consumer's fetch waits at the end of its partition before returning empty.

Kafka's default is 500 ms. Spark keeps each partition's consumer between batches,
and the consumer sends its next fetch as soon as one returns: a fetch past the end
of the batch, which the broker holds until new records arrive or the wait ends.
The next batch's task seeks and polls, but the consumer sends no new fetch to that
broker while the old one is held, so the task waited for the partition's next
commit (~80 ms a partition at 100 events/s over 8; up to 500 ms on a quiet topic).
"""
CHECKPOINT_FILE_MANAGER = "spark.sql.streaming.checkpointFileManagerClass"
LOCAL_CHECKPOINT_FILE_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)
"""Checkpoint files written through Hadoop's ``FileSystem``, not its ``FileContext``.

Without Hadoop's native library (pyspark ships none), ``FileContext``'s rename on
the local file system runs ``readlink`` twice per file: each log entry and each
state partition's changelog: some 70 processes forked per batch at 8 state
partitions (profiled with the JVM's flight recorder). ``FileSystem``
renames with one ``rename(2)``; the file appears whole or not at all, and an
existing entry is still refused (the check before the rename, as ``FileContext``
does on the local file system). Used only when checkpoint and output are local;
HDFS and object stores keep Spark's choice.
"""
POLL_SECONDS = 0.25
RESTART_ADVICE = (
    "restore it, or start over with an empty checkpoint and a new output path "
    "(the new checkpoint reads again from --starting-offsets)"
)

ProgressCallback = Callable[[BatchProgress], None]


# ------------------------------------------------------------------ pipeline


def source_options(settings: SinkSettings) -> dict[str, Any]:
    """Spark Kafka source options from the settings (read_committed is the reader's)."""
    options: dict[str, Any] = {
        "startingOffsets": settings.starting_offsets,
        "failOnDataLoss": settings.fail_on_data_loss,
        "groupIdPrefix": settings.group_id_prefix,
    }
    if settings.max_offsets_per_trigger is not None:
        options["maxOffsetsPerTrigger"] = settings.max_offsets_per_trigger
    kafka = {FETCH_MAX_WAIT: FETCH_MAX_WAIT_MS, **settings.java_kafka_properties()}
    for key, value in kafka.items():
        options[f"kafka.{key}"] = value
    return options


def local_files(settings: SinkSettings) -> bool:
    """Whether the checkpoint (and, for a file sink, its output's log) is on the local disk."""
    return local_path(settings.checkpoint) is not None and (
        settings.is_delta or local_path(settings.output) is not None
    )


def deduplicate(events: DataFrame, dedup_window: str) -> DataFrame:
    """Drop later copies of a transaction id seen within ``dedup_window`` of ingestion.

    The watermark is on ``ingested_at`` (the micro-batch timestamp); see the
    module docstring for why not on the Kafka timestamp.
    """
    return (
        events.withColumn(DEDUP_KEY, dedup_key())
        .withWatermark("ingested_at", dedup_window)
        .dropDuplicatesWithinWatermark([DEDUP_KEY])
        .drop(DEDUP_KEY)
    )


def sink_frame(spark: SparkSession, settings: SinkSettings) -> DataFrame:
    """The streaming DataFrame the job writes: observed, de-duplicated, with ``date``."""
    from pyspark.sql import functions as F

    from spark_sink.reader import read_outbox_events

    events = read_outbox_events(
        spark,
        settings.bootstrap_servers,
        topics=list(settings.topics) or None,
        pattern=settings.pattern,
        streaming=True,
        **source_options(settings),
    )
    seen = events.observe(
        IN_METRICS,
        F.count(F.lit(1)).alias("rows_in"),
        F.sum(F.when(F.col("transaction_id").isNull(), 1).otherwise(0)).alias("without_id"),
    )
    stamped = seen.withColumn("ingested_at", F.current_timestamp())
    if settings.dedup_mode == "window":
        stamped = deduplicate(stamped, settings.dedup_delay)
    unique = stamped.withColumn("date", F.to_date("timestamp"))
    return unique.observe(OUT_METRICS, F.count(F.lit(1)).alias("rows_written"))


def configure_session(spark: SparkSession, settings: SinkSettings) -> None:
    """Runtime SQL settings the job relies on (set on the session it is given)."""
    provider = ROCKSDB_PROVIDER if settings.state_store == "rocksdb" else MEMORY_PROVIDER
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", provider)
    spark.conf.set("spark.sql.shuffle.partitions", str(settings.shuffle_partitions))
    # The watermark is on ingestion time, so it moves with every batch, and Spark would
    # follow each batch with one without data, only to evict expired ids: a whole
    # batch's fixed cost in front of the next events (the delay's p50 and p99).
    # Expired ids are evicted by the next batch with data instead; nothing else waits.
    spark.conf.set(NO_DATA_BATCHES, "false")
    # A partitioned write (topic, date) sorts each task's full rows by partition first,
    # unless it may keep a writer open per partition; a task meets few (its topics'
    # dates in one batch), and past PARTITION_WRITERS it falls back to sorting the rest.
    spark.conf.set(CONCURRENT_WRITERS, str(PARTITION_WRITERS))
    if settings.state_store == "rocksdb":
        # Commits upload a small changelog instead of a full snapshot each batch.
        spark.conf.set(
            "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true"
        )
    if local_files(settings):
        spark.conf.set(CHECKPOINT_FILE_MANAGER, LOCAL_CHECKPOINT_FILE_MANAGER)
    elif spark.conf.get(CHECKPOINT_FILE_MANAGER, "") == LOCAL_CHECKPOINT_FILE_MANAGER:
        spark.conf.unset(CHECKPOINT_FILE_MANAGER)  # set by an earlier local run of this session
    if settings.is_delta:
        # Delta rebuilds the table's snapshot (its log replayed) in 50 tasks by default,
        # several times per batch; on a young table each is a fraction of a second of
        # work and scheduling 50 tasks cost most of a batch (profiled: ~70 of 125 s).
        spark.conf.set(DELTA_SNAPSHOT_PARTITIONS, str(settings.shuffle_partitions))
    for key, value in settings.spark_conf.items():
        if key.startswith(("spark.sql.", "spark.databricks.delta.")):
            spark.conf.set(key, value)


def start_query(
    spark: SparkSession, settings: SinkSettings
) -> tuple[StreamingQuery, DeltaBatchWriter | None]:
    """Start the query: a file sink, or for Delta ``foreachBatch`` (see :mod:`spark_sink.delta`)."""
    from spark_sink.delta import DeltaBatchWriter, prepare_table

    frame = sink_frame(spark, settings)
    batches = None
    if settings.is_delta:
        prepare_table(spark, settings, frame.schema)
        batches = DeltaBatchWriter(settings)
        writer = frame.writeStream.foreachBatch(batches)
    else:
        writer = (
            frame.writeStream.format(settings.format)
            .outputMode("append")
            .partitionBy(*PARTITION_COLUMNS)
            .option("path", settings.output)
        )
    writer = writer.option("checkpointLocation", settings.checkpoint).queryName(
        settings.app_name.replace("-", "_")
    )
    if settings.once:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=settings.trigger_interval)
    query = writer.start()
    if batches is not None:
        batches.started(str(query.id))
    return query, batches


# ------------------------------------------------------------ error messages


def java_trace(exc: BaseException) -> str:
    """The Java side of an error as text: messages, ``Caused by`` sections and frames."""
    parts = [str(exc)]
    trace = getattr(exc, "_stackTrace", None)
    if trace:
        parts.append(str(trace))
    java = getattr(exc, "java_exception", None)
    if java is not None and not trace:
        with contextlib.suppress(Exception):
            cause, depth = java, 0
            while cause is not None and depth < 10:
                parts.append(f"Caused by: {cause.toString()}")
                parts.extend(f"\tat {frame.toString()}" for frame in cause.getStackTrace()[:40])
                cause, depth = cause.getCause(), depth + 1
    return "\n".join(parts)


@dataclass(frozen=True)
class _Section:
    """One exception of a Java trace: its message and its frames."""

    message: str
    frames: tuple[str, ...]

    def touches(self, markers: tuple[str, ...]) -> bool:
        return any(marker in frame for frame in self.frames for marker in markers)


def _sections(trace: str) -> list[_Section]:
    sections = []
    for block in re.split(r"\n(?=Caused by: )", trace):
        lines = [line.strip() for line in block.splitlines() if line.strip()]
        frames = tuple(line[3:] for line in lines if line.startswith("at "))
        texts = [line for line in lines if not line.startswith(("at ", "... "))]
        message = texts[0].removeprefix("Caused by: ") if texts else ""
        sections.append(_Section(message[:400], frames))
    return sections


_KAFKA_FRAMES = ("org.apache.kafka.", "org.apache.spark.sql.kafka010.")
_OUTPUT_FRAMES = (
    "FileStreamSink",
    "ManifestFileCommitProtocol",
    "FileFormatWriter",
    "org.apache.spark.sql.delta.",
)
_CHECKPOINT_FRAMES = (
    ".streaming.checkpointing.",
    ".streaming.state.",
    "OffsetSeqLog",
    "CommitLog",
    "StreamMetadata",
)
_CHECKPOINT_PARTS = {
    "OffsetSeq": "its offsets log",
    "CommitLog": "its commits log",
    "StreamMetadata": "its metadata file",
    ".streaming.state.": "its de-duplication state",
}


def explain(exc: BaseException, settings: SinkSettings) -> SinkError:
    """A Spark/Py4J failure as the one-line error the CLI prints.

    The deepest exception of the Java trace carries the reason; the frames
    under it say whose problem it is (Kafka, the checkpoint, the output).
    """
    if isinstance(exc, SinkError):
        return exc
    trace = java_trace(exc)
    lowered = trace.lower()
    if "failed to find data source: kafka" in lowered or (
        "data_source_not_found" in lowered and "kafka" in lowered
    ):
        return SparkJarsError(
            "Spark's Kafka source is not on the classpath; run `outbox dev spark fetch`, "
            f"or pass --packages {connector_coordinates()} to spark-submit"
        )
    sections = _sections(trace)
    reason = next((s.message for s in reversed(sections) if s.message), type(exc).__name__)
    reason = reason.split(" SQLSTATE:")[0]
    for section in reversed(sections):
        if section.touches(_KAFKA_FRAMES):
            return KafkaSourceError(
                f"reading Kafka at {settings.bootstrap_servers} failed: {reason}"
            )
        if section.touches(_CHECKPOINT_FRAMES):
            part = next(
                (what for key, what in _CHECKPOINT_PARTS.items() if section.touches((key,))),
                "it",
            )
            return CheckpointError(
                f"checkpoint {settings.checkpoint} is corrupt or unreadable ({part}: {reason}); "
                f"{RESTART_ADVICE}"
            )
        if section.touches(_OUTPUT_FRAMES):
            return OutputPathError(f"cannot write the output {settings.output}: {reason}")
    if settings.checkpoint in trace:
        if "checksumexception" in lowered or "checksum error" in lowered:
            # Hadoop's .crc beside a checkpoint file disagrees with it: the file was changed.
            return CheckpointError(
                f"checkpoint {settings.checkpoint} is corrupt ({reason}); {RESTART_ADVICE}"
            )
        return CheckpointError(f"checkpoint {settings.checkpoint} cannot be used: {reason}")
    if settings.output in trace:
        return OutputPathError(f"cannot write the output {settings.output}: {reason}")
    return SinkError(f"the sink query failed: {reason}")


@contextlib.contextmanager
def explained_errors(settings: SinkSettings) -> Iterator[None]:
    """Turn pyspark/Py4J exceptions inside the block into :class:`SinkError`."""
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    try:
        yield
    except SinkError:
        raise
    except (PySparkException, Py4JError) as exc:
        raise explain(exc, settings) from exc


# ----------------------------------------------------------------- running


@dataclass
class SinkRun:
    """A started sink query; :meth:`wait` reports its batches as they finish."""

    query: StreamingQuery
    settings: SinkSettings
    on_progress: ProgressCallback | None = None
    batches: DeltaBatchWriter | None = None
    """The Delta writer, which counts what each de-duplicated batch held and wrote."""
    summary: SinkSummary = field(default_factory=SinkSummary)
    _reported: dict[str, int] = field(default_factory=dict)
    """The last batch id reported, per run of the query (a restart is a new run)."""

    @staticmethod
    def _position(raw: Any) -> tuple[str, int]:
        data = progress_dict(raw)
        return str(data.get("runId")), int(data.get("batchId", -1))

    def _is_new(self, position: tuple[str, int]) -> bool:
        run_id, batch_id = position
        return batch_id > self._reported.get(run_id, -1)

    def _report(self) -> None:
        # lastProgress is one object over Py4J; recentProgress is up to a hundred,
        # so it is fetched only when batches finished between two polls.
        last = self.query.lastProgress
        if last is None or not self._is_new(self._position(last)):
            return
        run_id, batch_id = self._position(last)
        if self._reported.get(run_id, -1) == batch_id - 1:
            pending = [last]
        else:
            pending = [
                raw for raw in self.query.recentProgress if self._is_new(self._position(raw))
            ]
        for raw in pending:
            batch = BatchProgress.from_progress(raw)
            position = self._position(raw)
            if self.batches is not None and batch.batch_id in self.batches.counted:
                batch = batch.counted_by_writer(self.batches.counted.pop(batch.batch_id))
            if not self._is_new(position):
                continue
            self._reported[position[0]] = position[1]
            self.summary.add(batch)
            if self.on_progress is not None:
                self.on_progress(batch)

    def wait(self, timeout: float | None = None, stop: threading.Event | None = None) -> bool:
        """Report progress until the query ends, ``stop`` is set or ``timeout`` passes.

        Returns whether the query is still running. A failed query raises a
        :class:`SinkError` naming the cause.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with explained_errors(self.settings):
            while self.query.isActive:
                if stop is not None and stop.is_set():
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    break
                self.query.awaitTermination(POLL_SECONDS)
                self._report()
            self._report()
            if not self.query.isActive:
                failure = self.query.exception()
                if failure is not None:
                    raise explain(failure, self.settings)
        return bool(self.query.isActive)

    def stop(self) -> SinkSummary:
        """Stop the query (an unfinished batch is redone from the checkpoint next time)."""
        with explained_errors(self.settings):
            if self.query.isActive:
                self.query.stop()
            self._report()
        return self.summary

    def wait_until(self, condition: Callable[[SinkSummary], bool], timeout: float) -> bool:
        """Report progress until ``condition(summary)`` holds, the query ends or time is up."""
        deadline = time.monotonic() + timeout
        while not condition(self.summary) and time.monotonic() < deadline:
            if not self.wait(timeout=min(1.0, max(0.0, deadline - time.monotonic()))):
                break
        return condition(self.summary)


def start_sink(
    settings: SinkSettings,
    spark: SparkSession | None = None,
    on_progress: ProgressCallback | None = None,
) -> SinkRun:
    """Check the inputs, then start the sink query on ``spark`` (or a new session)."""
    check_paths(settings)
    with explained_errors(settings):
        if spark is None:
            spark = new_session(settings)
        configure_session(spark, settings)
        check_kafka(spark, settings)
        query, batches = start_query(spark, settings)
    return SinkRun(query, settings, on_progress, batches=batches)


def new_session(settings: SinkSettings) -> SparkSession:
    """The session a stand-alone run uses (or spark-submit's, which it joins)."""
    from spark_sink.session import create_session

    with explained_errors(settings):
        return create_session(
            settings.master, settings.app_name, settings.spark_conf, delta=settings.is_delta
        )


@contextlib.contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGTERM/SIGINT stop the query between polls instead of killing Py4J mid-call."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            raise KeyboardInterrupt  # a second Ctrl-C: stop waiting
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def run_sink(
    settings: SinkSettings,
    spark: SparkSession | None = None,
    on_progress: ProgressCallback | None = None,
    stop: threading.Event | None = None,
) -> SinkSummary:
    """Run the sink: until the data present at start is written (``once``), else until stopped.

    ``stop`` (or SIGTERM/SIGINT, in the main thread) ends a continuous run
    cleanly; the next run continues from the checkpoint.
    """
    stop = stop or threading.Event()
    own_session = spark is None
    if spark is None:
        check_paths(settings)  # before paying for a JVM
        spark = new_session(settings)
    try:
        run = start_sink(settings, spark, on_progress)
        with _stop_on_signals(stop):
            try:
                run.wait(stop=stop)
            finally:
                run.stop()
        return run.summary
    finally:
        if own_session:
            with contextlib.suppress(Exception):
                spark.stop()
