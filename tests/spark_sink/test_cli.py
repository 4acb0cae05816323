"""``outbox sink`` as a user runs it: a process of its own, progress lines, one-line errors.

Each run here starts its own Spark driver (about ten seconds), so only what the
in-process tests cannot show is run this way: the printed progress, and that a
failure inside Spark reaches the terminal as one ``outbox: error:`` line with
exit code 1, without a Java stack trace.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from outbox import LocalTransactionState
from outbox_devtools.processes import free_port
from spark_sink import run_sink
from spark_sink.jars import ensure_spark_kafka_jars
from tests.spark_sink.conftest import SinkTopics, read_table, sink_settings

# C1-only JIT: a run this short finishes before C2 would pay off (about 40% faster).
SPARK_FLAGS = (
    "--master",
    "local[1]",
    "--conf",
    "spark.ui.enabled=false",
    "--conf",
    "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1",
)


def outbox(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from outbox_cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=240,
        env=env or dict(os.environ),
    )


def sink_args(topics: SinkTopics, tmp_path: Path, *extra: str) -> list[str]:
    return [
        "sink",
        "--bootstrap",
        topics.bootstrap,
        "--output",
        str(tmp_path / "table"),
        "--checkpoint",
        str(tmp_path / "checkpoint"),
        "--prefix",
        topics.names.prefix,
        "--shuffle-partitions",
        "2",
        *SPARK_FLAGS,
        *extra,
    ]


def assert_one_line_error(result: subprocess.CompletedProcess[str], *mentions: str) -> None:
    assert result.returncode == 1, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("outbox: error: ")]
    assert len(errors) == 1, result.stderr
    for text in mentions:
        assert text in errors[0], errors[0]
    assert "\tat " not in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) <= 4, result.stderr


def test_once_prints_each_batch_and_counts_records_without_id(
    spark: SparkSession, sink_topics: SinkTopics, tmp_path: Path
) -> None:
    [committed] = sink_topics.send(1, LocalTransactionState.COMMIT_MESSAGE)
    sink_topics.publish([(b"no-id", [])])

    result = outbox(*sink_args(sink_topics, tmp_path, "--topics", sink_topics.real_topic, "--once"))

    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("batch 0: rows_in=2 written=2 duplicates=0 without_id=1 lag=0")
    assert lines[-1].startswith("sink: batches=")
    assert "rows_in=2 written=2 duplicates=0 without_id=1 lag=0" in lines[-1]
    assert "\tat " not in result.stderr
    rows = read_table(spark, tmp_path / "table")
    assert sorted((row.transaction_id or "", row.value) for row in rows) == [
        ("", b"no-id"),
        (committed, sink_topics.sent[committed]),
    ]


def test_unreachable_brokers_are_one_line(sink_topics: SinkTopics, tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    args = sink_args(sink_topics, tmp_path, "--pattern", "x.*", "--kafka-timeout", "2")
    args[args.index("--bootstrap") + 1] = address
    result = outbox(*args)
    assert_one_line_error(result, f"Kafka at {address} did not answer within 2s")


def test_a_corrupt_checkpoint_is_one_line(
    spark: SparkSession, sink_topics: SinkTopics, tmp_path: Path
) -> None:
    sink_topics.send(1, LocalTransactionState.COMMIT_MESSAGE)
    run_sink(sink_settings(sink_topics, tmp_path), spark)  # a real checkpoint, in-process
    offsets = tmp_path / "checkpoint" / "offsets" / "0"
    offsets.write_text("v1\n{not json\n")

    result = outbox(*sink_args(sink_topics, tmp_path, "--topics", sink_topics.real_topic, "--once"))
    assert_one_line_error(result, f"checkpoint {tmp_path / 'checkpoint'} is corrupt", "offsets")


def test_an_unwritable_output_is_one_line_before_any_spark(
    sink_topics: SinkTopics, tmp_path: Path
) -> None:
    (tmp_path / "a-file").write_text("")
    args = sink_args(sink_topics, tmp_path, "--topics", sink_topics.real_topic, "--once")
    args[args.index("--output") + 1] = str(tmp_path / "a-file" / "table")
    result = outbox(*args)
    assert_one_line_error(result, "cannot write the output path", "Not a directory")
    assert "WARNING: Using incubator modules" not in result.stderr, "no JVM was started"


def test_fetch_prints_the_connector_dir() -> None:
    result = outbox("dev", "spark", "fetch")
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == ensure_spark_kafka_jars()
    assert "spark-sql-kafka-0-10_2.13" in result.stderr
