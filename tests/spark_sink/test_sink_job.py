"""The sink job on a real broker and real Spark: exactly the committed events, once each."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from pyspark.sql import SparkSession

from outbox import LocalTransactionState
from outbox_devtools.chaos.run import Sink
from spark_sink import BatchProgress, run_sink, start_sink
from spark_sink.job import (
    CHECKPOINT_FILE_MANAGER,
    CONCURRENT_WRITERS,
    LOCAL_CHECKPOINT_FILE_MANAGER,
    PARTITION_WRITERS,
    configure_session,
    source_options,
)
from tests.spark_sink.conftest import SinkTopics, read_table, sink_settings

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
RUN_TIMEOUT = 120.0


def test_only_committed_events_land(
    spark: SparkSession, sink_topics: SinkTopics, tmp_path: Path
) -> None:
    committed = sink_topics.send(12, COMMIT)
    rolled_back = sink_topics.send(4, ROLLBACK)
    sink_topics.publish(
        [(f"aborted-{i}".encode(), sink_topics.real_headers(f"aborted-{i}")) for i in range(5)],
        abort=True,
    )
    settings = sink_settings(sink_topics, tmp_path)

    summary = run_sink(settings, spark)

    rows = read_table(spark, settings.output)
    assert {row.transaction_id: row.value for row in rows} == sink_topics.sent
    assert len(rows) == len(committed) == 12
    assert not set(rolled_back) & {row.transaction_id for row in rows}
    assert (summary.rows_in, summary.rows_written, summary.duplicates) == (12, 12, 0)
    assert summary.without_id == 0 and summary.lag == 0
    # Partitioned by topic and (UTC) date of the Kafka timestamp.
    [topic_dir] = Path(settings.output).glob("topic=*")
    assert topic_dir.name == f"topic={sink_topics.real_topic}"
    assert [d.name[:5] for d in topic_dir.iterdir()] == ["date="]
    assert {str(row.date) for row in rows} == {row.timestamp.strftime("%Y-%m-%d") for row in rows}


def test_a_transaction_published_twice_lands_once_and_id_less_records_all_land(
    spark: SparkSession, sink_topics: SinkTopics, tmp_path: Path
) -> None:
    [twice] = sink_topics.send(1, COMMIT)
    # The second copy, as a duplicated end (a check-back racing a commit) writes it.
    sink_topics.publish([(sink_topics.sent[twice], sink_topics.real_headers(twice))])
    sink_topics.publish([(b"no-id-1", []), (b"no-id-2", [])])
    batches: list[BatchProgress] = []

    summary = run_sink(sink_settings(sink_topics, tmp_path), spark, on_progress=batches.append)

    rows = read_table(spark, tmp_path / "table")
    assert [row.transaction_id for row in rows if row.transaction_id] == [twice]
    assert sorted(row.value for row in rows if row.transaction_id is None) == [
        b"no-id-1",
        b"no-id-2",
    ], "records without an id are never de-duplicated together"
    assert (summary.rows_in, summary.rows_written) == (4, 3)
    assert (summary.duplicates, summary.without_id) == (1, 2)
    assert "duplicates=1 without_id=2" in batches[0].line()


def test_restart_between_batches_neither_duplicates_nor_skips(
    spark: SparkSession, sink_topics: SinkTopics, tmp_path: Path
) -> None:
    settings = sink_settings(sink_topics, tmp_path, once=False, trigger="200ms")
    first = sink_topics.send(6, COMMIT)

    run = start_sink(settings, spark)
    assert run.wait_until(lambda s: s.rows_written >= 6, RUN_TIMEOUT), run.summary
    run.stop()

    second = sink_topics.send(6, COMMIT)
    # A copy of a first-run transaction after the restart: the state must remember it.
    sink_topics.publish([(sink_topics.sent[first[0]], sink_topics.real_headers(first[0]))])
    run = start_sink(settings, spark)
    assert run.wait_until(lambda s: s.rows_in >= 7, RUN_TIMEOUT), run.summary
    summary = run.stop()

    ids = [row.transaction_id for row in read_table(spark, settings.output)]
    assert sorted(ids) == sorted(first + second)
    assert (summary.rows_written, summary.duplicates) == (6, 1)


def test_other_formats_by_option(
    spark: SparkSession, sink_topics: SinkTopics, tmp_path: Path
) -> None:
    [committed] = sink_topics.send(1, COMMIT)
    settings = sink_settings(sink_topics, tmp_path, format="orc", state_store="memory")

    run_sink(settings, spark)

    [row] = read_table(spark, settings.output, "orc")
    assert (row.transaction_id, row.value) == (committed, sink_topics.sent[committed])
    assert list(Path(settings.output).rglob("*.orc"))


def test_no_empty_batch_after_the_data(
    spark: SparkSession, sink_topics: SinkTopics, tmp_path: Path
) -> None:
    """The watermark moves with every batch (ingestion time), and Spark would then run
    a batch without data to evict state: a whole batch's fixed cost in front of the
    next events. Eviction waits for the next batch with data instead."""
    sink_topics.send(3, COMMIT)
    batches: list[BatchProgress] = []

    summary = run_sink(sink_settings(sink_topics, tmp_path), spark, on_progress=batches.append)

    assert [batch.rows_in for batch in batches] == [3]
    assert summary.rows_written == 3


def test_partitioned_writes_keep_a_writer_per_partition_instead_of_sorting(
    spark: SparkSession, sink_topics: SinkTopics, tmp_path: Path
) -> None:
    """Without concurrent writers Spark sorts each batch's full rows by topic and date
    before writing them (spilling to disk when they exceed the task's memory)."""
    configure_session(spark, sink_settings(sink_topics, tmp_path))
    assert spark.conf.get(CONCURRENT_WRITERS) == str(PARTITION_WRITERS) != "0"

    overridden = sink_settings(sink_topics, tmp_path, spark_conf={CONCURRENT_WRITERS: "0"})
    configure_session(spark, overridden)
    assert spark.conf.get(CONCURRENT_WRITERS) == "0"
    configure_session(spark, sink_settings(sink_topics, tmp_path))


def test_local_checkpoints_are_written_through_the_file_system_api(
    spark: SparkSession, sink_topics: SinkTopics, tmp_path: Path
) -> None:
    """Hadoop's FileContext renames each checkpoint file with two forked ``readlink``
    processes (pyspark has no native Hadoop library): about 70 per batch. Local
    checkpoints use the FileSystem API; others keep Spark's choice, and --conf wins."""
    remote = sink_settings(
        sink_topics, tmp_path, checkpoint="hdfs://nn:8020/c", output="hdfs://nn:8020/t"
    )
    configure_session(spark, remote)
    assert spark.conf.get(CHECKPOINT_FILE_MANAGER, "") == ""

    configure_session(spark, sink_settings(sink_topics, tmp_path))
    assert spark.conf.get(CHECKPOINT_FILE_MANAGER, "") == LOCAL_CHECKPOINT_FILE_MANAGER
    configure_session(spark, remote)
    assert spark.conf.get(CHECKPOINT_FILE_MANAGER, "") == ""
    configure_session(
        spark, sink_settings(sink_topics, tmp_path, spark_conf={CHECKPOINT_FILE_MANAGER: "x.Y"})
    )
    assert spark.conf.get(CHECKPOINT_FILE_MANAGER) == "x.Y"
    spark.conf.unset(CHECKPOINT_FILE_MANAGER)

    sink_topics.send(3, COMMIT)
    first = run_sink(sink_settings(sink_topics, tmp_path), spark)
    sink_topics.send(2, COMMIT)
    again = run_sink(sink_settings(sink_topics, tmp_path), spark)

    assert (first.rows_written, again.rows_written) == (3, 2)
    assert len(read_table(spark, tmp_path / "table")) == 5


def test_source_fetches_wait_briefly_at_the_end_of_a_partition(
    sink_topics: SinkTopics, tmp_path: Path
) -> None:
    """A kept consumer's fetch past the batch's end is held by the broker until new
    records come or the wait ends (500 ms by default), and the next batch's task waits
    for it; the sink waits 10 ms, unless --kafka-options says otherwise."""
    assert source_options(sink_settings(sink_topics, tmp_path))["kafka.fetch.max.wait.ms"] == "10"
    mine = sink_settings(sink_topics, tmp_path, kafka_options={"fetch.max.wait.ms": "200"})
    assert source_options(mine)["kafka.fetch.max.wait.ms"] == "200"


def test_the_chaos_runs_table_reads_as_no_rows_before_a_batch_wrote_a_file(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A chaos run whose sink started while Kafka was away committed a first batch with no
    file (``_spark_metadata/0`` holds only its version line): Spark cannot infer the schema
    of such a table, and the run died reading it instead of waiting for the rows."""
    sink = Sink("127.0.0.1:9", tmp_path)
    sink.spark = spark
    metadata = Path(sink.settings.output) / "_spark_metadata"
    metadata.mkdir(parents=True)
    (metadata / "0").write_text("v1")
    assert sink.rows() == Counter()
