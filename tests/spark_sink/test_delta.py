"""``--format delta``: each micro-batch commits once, each transaction lands once, however late."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from outbox import LocalTransactionState
from outbox.errors import ConfigurationError
from outbox_cli.settings_flags import settings_from_flags
from spark_sink import run_sink
from spark_sink.errors import CheckpointError, OutputPathError
from spark_sink.settings import SinkSettings
from tests.spark_sink.conftest import SinkTopics, read_table, sink_settings

COMMIT = LocalTransactionState.COMMIT_MESSAGE
DAY_MS = 86_400_000


def delta_settings(where: SinkTopics, tmp_path: Path, **overrides: object) -> SinkSettings:
    return sink_settings(where, tmp_path, format="delta", **overrides)


def landed(spark: SparkSession, settings: SinkSettings) -> Counter[str]:
    """How often each transaction id (or id-less value) is in the table."""
    return Counter(
        row.transaction_id or row.value.decode()
        for row in read_table(spark, settings.output, "delta")
    )


def test_merge_is_the_default_and_a_copy_days_later_is_recognised(
    spark: SparkSession, sink_topics: SinkTopics, tmp_path: Path
) -> None:
    ids = sink_topics.send(2, COMMIT)
    sink_topics.publish([(sink_topics.sent[ids[0]], sink_topics.real_headers(ids[0]))])
    sink_topics.publish([(b"no-id-1", []), (b"no-id-2", [])])
    # Far beyond any --dedup-window: a transaction first published three days ago...
    three_days_ago = int(time.time() * 1000) - 3 * DAY_MS
    old = sink_topics.real_headers("tx-three-days-old")
    sink_topics.publish([(b"old", old)], timestamp_ms=three_days_ago)
    settings = delta_settings(sink_topics, tmp_path)
    assert settings.dedup_mode == "merge"

    first = run_sink(settings, spark)
    sink_topics.publish([(b"old", old)])  # ...and its copy now, in a later run
    second = run_sink(settings, spark)

    assert landed(spark, settings) == Counter([*ids, "tx-three-days-old", "no-id-1", "no-id-2"])
    assert (first.rows_in, first.rows_written, first.duplicates) == (6, 5, 1)
    assert (second.rows_in, second.rows_written, second.duplicates) == (1, 0, 1)
    dates = spark.read.format("delta").load(settings.output).select("date").distinct().collect()
    assert len(dates) == 2, "the old transaction sits in its own date partition"
    assert [p.name for p in Path(settings.output).glob("topic=*")] == [
        f"topic={sink_topics.real_topic}"
    ]


@pytest.mark.parametrize("dedup", ["window", "off"])
def test_other_dedup_modes_append(
    dedup: str, spark: SparkSession, sink_topics: SinkTopics, tmp_path: Path
) -> None:
    [twice] = sink_topics.send(1, COMMIT)
    sink_topics.publish([(sink_topics.sent[twice], sink_topics.real_headers(twice))])
    settings = delta_settings(sink_topics, tmp_path, dedup=dedup, state_store="memory")

    summary = run_sink(settings, spark)

    copies = 1 if dedup == "window" else 2
    assert landed(spark, settings) == Counter({twice: copies})
    assert (summary.rows_in, summary.rows_written) == (2, copies)


# Both modes redo the batch through the same idempotent append (txnAppId, txnVersion): the
# default's proof is in `make test`, the plain append's (110-130 s more) in `make test-long`.
@pytest.mark.parametrize("dedup", ["merge", pytest.param("off", marks=pytest.mark.long_proof)])
def test_a_driver_killed_between_the_delta_commit_and_the_checkpoint_loses_and_doubles_nothing(
    dedup: str, spark: SparkSession, sink_topics: SinkTopics, tmp_path: Path
) -> None:
    ids = sink_topics.send(4, COMMIT)
    sink_topics.publish([(b"no-id-1", []), (b"no-id-2", [])])
    settings = delta_settings(
        sink_topics,
        tmp_path,
        dedup=dedup,
        master="local[1]",
        spark_conf={
            "spark.ui.enabled": "false",
            "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1",
        },
    )
    crash = subprocess.run(
        [sys.executable, "-m", "tests.spark_sink.crash_sink", settings.model_dump_json()],
        capture_output=True,
        text=True,
        timeout=240,
        start_new_session=True,
        # A killed JVM removes none of its temporary files: keep them in the test's directory.
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2]), "TMPDIR": str(tmp_path)},
    )
    assert crash.returncode == -9, crash.stderr[-2000:]
    checkpoint = Path(settings.checkpoint)
    assert (checkpoint / "offsets" / "0").is_file(), "batch 0 was planned"
    assert not (checkpoint / "commits" / "0").exists(), "killed before the checkpoint's commit"
    assert landed(spark, settings) == Counter([*ids, "no-id-1", "no-id-2"]), "Delta committed"

    summary = run_sink(settings, spark)  # redoes batch 0

    assert (checkpoint / "commits" / "0").is_file()
    assert landed(spark, settings) == Counter([*ids, "no-id-1", "no-id-2"])
    assert summary.batches >= 1
    log = sorted(Path(settings.output, "_delta_log").glob("*.json"))
    commits = [json.loads(line) for path in log for line in path.read_text().splitlines()]
    assert sum(1 for action in commits if "txn" in action) == 1, "the redo committed nothing"


# ----------------------------------------------------------------- bad input


def test_merge_without_delta_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OUTBOX_SINK_TOPICS", "OUTBOX_SINK_PATTERN", "OUTBOX_SINK_FORMAT"):
        monkeypatch.delenv(name, raising=False)
    base = {"bootstrap_servers": "h:1", "output": "/x/t", "checkpoint": "/x/c", "topics": "a"}
    with pytest.raises(ConfigurationError, match="dedup merge needs format delta"):
        settings_from_flags(SinkSettings, {**base, "dedup": "merge"})
    assert settings_from_flags(SinkSettings, base).dedup_mode == "window"
    assert settings_from_flags(SinkSettings, {**base, "format": "Delta"}).dedup_mode == "merge"


def test_a_directory_of_other_files_is_not_a_delta_table(
    spark: SparkSession, sink_topics: SinkTopics, tmp_path: Path
) -> None:
    sink_topics.send(1, COMMIT)
    parquet = sink_settings(sink_topics, tmp_path)
    run_sink(parquet, spark)
    settings = delta_settings(sink_topics, tmp_path, checkpoint=str(tmp_path / "delta-ck"))
    with pytest.raises(OutputPathError, match="holds files but is not a Delta table"):
        run_sink(settings, spark)


def test_a_delta_table_another_job_wrote_is_named(
    spark: SparkSession, sink_topics: SinkTopics, tmp_path: Path
) -> None:
    sink_topics.send(1, COMMIT)
    table = str(tmp_path / "table")
    spark.createDataFrame([(1, "x")], "topic int, other string").write.format("delta").save(table)
    with pytest.raises(
        OutputPathError,
        match=r"another job wrote: its schema does not match the sink's: topic int \(sink "
        r"writes string\); .*other string \(not the sink's\)",
    ):
        run_sink(delta_settings(sink_topics, tmp_path), spark)


def test_an_unwritable_table_path_is_named(sink_topics: SinkTopics, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    output = tmp_path / "a-file" / "table"
    with pytest.raises(OutputPathError, match=rf"cannot write the output path {output}"):
        run_sink(delta_settings(sink_topics, tmp_path, output=str(output)))


def test_a_new_checkpoint_on_a_filled_table_without_merge_is_refused(
    spark: SparkSession, sink_topics: SinkTopics, tmp_path: Path
) -> None:
    sink_topics.send(1, COMMIT)
    run_sink(delta_settings(sink_topics, tmp_path), spark)
    fresh = str(tmp_path / "fresh")
    with pytest.raises(CheckpointError, match="would land those events a second time"):
        run_sink(delta_settings(sink_topics, tmp_path, checkpoint=fresh, dedup="off"), spark)

    again = run_sink(delta_settings(sink_topics, tmp_path, checkpoint=fresh), spark)

    assert (again.rows_in, again.rows_written, again.duplicates) == (1, 0, 1)
