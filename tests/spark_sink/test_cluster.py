"""The sink on a real Spark standalone cluster: a worker killed mid-stream loses nothing.

``outbox sink`` is submitted with ``spark-submit --master spark://...`` to a
master and two one-core workers (:class:`~outbox_devtools.spark_cluster.LocalSparkCluster`),
so its tasks run in two executor JVMs apart from the driver, as on any cluster.
While events are being committed, one worker and its executor are killed with
SIGKILL; the driver must rerun the lost tasks on the survivor, and the table
must end up with every committed event exactly once.
"""

from __future__ import annotations

import signal
import threading
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

import spark_sink.submit
from outbox import LocalTransactionState
from outbox_devtools.processes import spawn, stop_pid, wait_until
from outbox_devtools.spark_cluster import LocalSparkCluster
from spark_sink.jars import delta_jars, spark_kafka_jars
from spark_sink.session import DELTA_CONF
from tests.spark_sink.conftest import SinkTopics

COMMIT = LocalTransactionState.COMMIT_MESSAGE
LAND_TIMEOUT = 180.0


def table_ids(spark: SparkSession, path: Path, table_format: str) -> Counter[str]:
    """How often each transaction id is in the table (an unreadable one: empty)."""
    try:
        rows = spark.read.format(table_format).load(str(path)).select("transaction_id").collect()
    except Exception:  # not created yet, or no batch committed yet
        return Counter()
    return Counter(row.transaction_id for row in rows)


class Sender(threading.Thread):
    """Commits events in small waves until stopped; keeps every committed id."""

    def __init__(self, topics: SinkTopics) -> None:
        super().__init__(name="cluster-sender", daemon=True)
        self.topics = topics
        self.committed: list[str] = []
        self.stop = threading.Event()
        self.failure: BaseException | None = None

    def run(self) -> None:
        wave = 0
        try:
            while not self.stop.is_set():
                self.committed += self.topics.send(5, COMMIT, prefix=f"wave{wave}")
                wave += 1
        except BaseException as exc:  # surfaced by the test
            self.failure = exc


@pytest.mark.parametrize("table_format", ["parquet", "delta"])
def test_a_worker_killed_mid_stream_leaves_every_committed_event_once(
    table_format: str,
    spark_cluster: LocalSparkCluster,
    spark: SparkSession,
    sink_topics: SinkTopics,
    tmp_path: Path,
) -> None:
    table = tmp_path / "table"
    jars = spark_kafka_jars() + (delta_jars() if table_format == "delta" else [])
    conf = {"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"}
    if table_format == "delta":
        conf |= DELTA_CONF
    argv = spark_cluster.submit_argv(
        spark_sink.submit.__file__,
        [
            *("--bootstrap", sink_topics.bootstrap, "--topics", sink_topics.real_topic),
            *("--prefix", sink_topics.names.prefix, "--format", table_format),
            *("--output", str(table), "--checkpoint", str(tmp_path / "checkpoint")),
            *("--trigger", "0", "--shuffle-partitions", "2"),
        ],
        conf,
        jars,
    )
    log = tmp_path / "sink.log"
    sink = spawn(argv, log_path=log, env=spark_cluster.submit_env())
    sender = Sender(sink_topics)
    doomed, survivor = spark_cluster.workers
    try:
        sender.start()
        assert wait_until(lambda: len(table_ids(spark, table, table_format)) >= 5, LAND_TIMEOUT), (
            f"nothing landed; the sink's log:\n{log.read_text()[-3000:]}"
        )
        assert spark_cluster.executors_on(doomed) == 1, "the sink must run on both workers"
        assert spark_cluster.executors_on(survivor) == 1, "the sink must run on both workers"

        spark_cluster.kill_worker(doomed)  # mid-stream: the sender keeps committing
        landed_at_kill = sum(table_ids(spark, table, table_format).values())
        assert wait_until(
            lambda: sum(table_ids(spark, table, table_format).values()) >= landed_at_kill + 10,
            LAND_TIMEOUT,
        ), f"nothing landed after the kill; the sink's log:\n{log.read_text()[-3000:]}"
        sender.stop.set()
        sender.join(60)
        assert sender.failure is None, sender.failure
        committed = list(sender.committed)
        assert wait_until(
            lambda: set(committed) <= set(table_ids(spark, table, table_format)), LAND_TIMEOUT
        ), f"committed events missing; the sink's log:\n{log.read_text()[-3000:]}"
        assert sink.poll() is None, f"the sink exited:\n{log.read_text()[-3000:]}"
    finally:
        sender.stop.set()
        sink.send_signal(signal.SIGTERM)
        stop_pid(sink.pid, grace_seconds=30)

    assert spark_cluster.alive_workers() == 1
    assert table_ids(spark, table, table_format) == Counter(committed)
