"""The sink on a real Spark standalone cluster: a worker killed mid-stream loses nothing.

``outbox sink`` is submitted with ``spark-submit --master spark://...`` to a
master and two one-core workers (:class:`~outbox_devtools.spark_cluster.LocalSparkCluster`),
so its tasks run in two executor JVMs apart from the driver, as on any cluster.
While events are being committed, one worker and its executor are killed with
SIGKILL; the driver must rerun the lost tasks on the survivor, and the table
must end up with every committed event exactly once.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

import spark_sink.submit
from outbox import LocalTransactionState, Message, TransactionProducer
from outbox_devtools.processes import spawn, stop_pid, wait_until
from outbox_devtools.spark_cluster import LocalSparkCluster
from spark_sink.jars import delta_jars, spark_kafka_jars
from spark_sink.session import DELTA_CONF, quiet_log4j2_file
from tests.fixtures.relay import running_relay
from tests.spark_sink.conftest import GROUP, CommitOrRollback, SinkTopics

COMMIT = LocalTransactionState.COMMIT_MESSAGE
LAND_TIMEOUT = 300.0
"""Generous: the suite runs on shared machines, and a first batch warms up three JVMs."""
BATCH_LINE = re.compile(r"^batch (\d+): rows_in=\d+ written=(\d+)", re.MULTILINE)
# Short runs: C1 compilation only, as the other Spark tests (about 40% less CPU).
LIGHT_JVM = "-XX:TieredStopAtLevel=1"


def table_ids(spark: SparkSession, path: Path, table_format: str) -> Counter[str]:
    """How often each transaction id is in the table."""
    rows = spark.read.format(table_format).load(str(path)).select("transaction_id").collect()
    return Counter(row.transaction_id for row in rows)


class Sender(threading.Thread):
    """Commits events one after the other (the relay publishing them) until stopped."""

    def __init__(self, topics: SinkTopics) -> None:
        super().__init__(name="cluster-sender", daemon=True)
        self.topics = topics
        self.committed: list[str] = []
        self.stop = threading.Event()
        self.failure: BaseException | None = None

    def run(self) -> None:
        settings = self.topics.producer_settings
        try:
            with (
                running_relay(self.topics.client_config, self.topics.names),
                TransactionProducer(GROUP, CommitOrRollback(), settings) as producer,
            ):
                while not self.stop.is_set():
                    message = Message(self.topics.real_topic, b"event", key=uuid.uuid4().hex)
                    result = producer.send_message_in_transaction(message, arg=COMMIT)
                    self.committed.append(result.transaction_id)
                    time.sleep(0.05)
                # Every commit published before the relay stops.
                deadline = time.monotonic() + 60
                while not set(self.committed) <= self.topics.published():
                    assert time.monotonic() < deadline, "the relay did not publish every commit"
                    time.sleep(0.2)
        except BaseException as exc:  # surfaced by the test
            self.failure = exc


class SinkOutput:
    """What the submitted sink printed: its batch lines (stdout) and Spark's log (stderr)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def text(self) -> str:
        return self.path.read_text(errors="replace") if self.path.exists() else ""

    def batches(self) -> list[tuple[int, int]]:
        """(batch id, rows written) of every batch line so far."""
        return [(int(b), int(w)) for b, w in BATCH_LINE.findall(self.text())]

    def written_since(self, batches_before: int) -> int:
        return sum(written for _, written in self.batches()[batches_before:])

    def tail(self) -> str:
        return self.text()[-3000:]


@pytest.mark.timeout(600)  # three JVMs warm up on a shared machine; a minute or two when quiet
@pytest.mark.parametrize(
    "table_format",
    # Delta's variant takes twice as long (a minute): the suite keeps Parquet's.
    ["parquet", pytest.param("delta", marks=pytest.mark.long_proof)],
)
def test_a_worker_killed_mid_stream_leaves_every_committed_event_once(
    table_format: str,
    spark_cluster: LocalSparkCluster,
    spark: SparkSession,
    sink_topics: SinkTopics,
    tmp_path: Path,
) -> None:
    table = tmp_path / "table"
    jars = spark_kafka_jars() + (delta_jars() if table_format == "delta" else [])
    conf = {
        "spark.ui.enabled": "false",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{quiet_log4j2_file()} "
        f"{LIGHT_JVM}",
        "spark.executor.extraJavaOptions": LIGHT_JVM,
    }
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
    output = SinkOutput(tmp_path / "sink.log")
    sink = spawn(argv, log_path=output.path, env=spark_cluster.submit_env())
    sender = Sender(sink_topics)
    doomed, survivor = spark_cluster.workers
    try:
        sender.start()
        assert wait_until(lambda: output.written_since(0) > 0, LAND_TIMEOUT), (
            f"nothing landed; the sink's output:\n{output.tail()}"
        )
        assert spark_cluster.executors_on(doomed) == 1, "the sink must run on both workers"
        assert spark_cluster.executors_on(survivor) == 1, "the sink must run on both workers"

        batches_at_kill = len(output.batches())
        spark_cluster.kill_worker(doomed)  # mid-stream: the sender keeps committing
        assert wait_until(lambda: output.written_since(batches_at_kill + 1) > 0, LAND_TIMEOUT), (
            f"nothing landed after the kill; the sink's output:\n{output.tail()}"
        )
        sender.stop.set()
        sender.join(90)
        assert sender.failure is None, sender.failure
        committed = list(sender.committed)
        # The batch lines say when to look; the table says what landed.
        assert wait_until(lambda: output.written_since(0) >= len(committed), LAND_TIMEOUT), (
            f"committed events missing; the sink's output:\n{output.tail()}"
        )
        assert wait_until(
            lambda: set(committed) <= set(table_ids(spark, table, table_format)), 60, step=2
        ), f"committed events missing from the table; the sink's output:\n{output.tail()}"
        assert sink.poll() is None, f"the sink exited:\n{output.tail()}"
    finally:
        sender.stop.set()
        stop_pid(sink.pid, grace_seconds=30)

    assert spark_cluster.alive_workers() == 1
    assert table_ids(spark, table, table_format) == Counter(committed)
