"""Bad input: each problem is a typed error whose message names it, never a hang."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from outbox import LocalTransactionState
from outbox.errors import ConfigurationError
from outbox_cli.settings_flags import settings_from_flags
from outbox_devtools.processes import free_port
from spark_sink import run_sink, start_sink
from spark_sink.errors import CheckpointError, KafkaSourceError, OutputPathError
from spark_sink.settings import SinkSettings
from tests.spark_sink.conftest import SinkTopics, read_table, sink_settings


def test_unreachable_brokers_are_named_within_the_timeout(
    spark: SparkSession, sink_topics: SinkTopics, tmp_path: Path
) -> None:
    address = f"127.0.0.1:{free_port()}"
    settings = sink_settings(
        sink_topics, tmp_path, bootstrap_servers=address, kafka_timeout_seconds=2
    )
    began = time.monotonic()
    with pytest.raises(KafkaSourceError, match=rf"Kafka at {address} did not answer within 2s"):
        start_sink(settings, spark)
    assert time.monotonic() - began < 180  # its 2 s, not Spark's own minutes


def test_a_missing_topic_is_named(
    spark: SparkSession, sink_topics: SinkTopics, tmp_path: Path
) -> None:
    missing = f"{sink_topics.names.prefix}-nowhere"
    settings = sink_settings(sink_topics, tmp_path, topics=(sink_topics.real_topic, missing))
    with pytest.raises(KafkaSourceError, match=rf"topic '{missing}' does not exist"):
        start_sink(settings, spark)


def test_an_unwritable_output_path_is_named(sink_topics: SinkTopics, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    output = tmp_path / "a-file" / "table"  # even root cannot make a directory in a file
    settings = sink_settings(sink_topics, tmp_path, output=str(output))
    with pytest.raises(OutputPathError, match=rf"cannot write the output path {output}"):
        run_sink(settings)  # fails before a Spark driver is started


def test_an_unwritable_checkpoint_is_named(sink_topics: SinkTopics, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    checkpoint = tmp_path / "a-file" / "checkpoint"
    settings = sink_settings(sink_topics, tmp_path, checkpoint=str(checkpoint))
    with pytest.raises(CheckpointError, match=rf"cannot write the checkpoint path {checkpoint}"):
        run_sink(settings)


def test_a_checkpoint_without_metadata_is_refused(sink_topics: SinkTopics, tmp_path: Path) -> None:
    (tmp_path / "checkpoint" / "offsets").mkdir(parents=True)
    (tmp_path / "checkpoint" / "offsets" / "0").write_text("garbage")
    with pytest.raises(CheckpointError, match="has no metadata file"):
        run_sink(sink_settings(sink_topics, tmp_path))


@pytest.fixture
def used_checkpoint(spark: SparkSession, sink_topics: SinkTopics, tmp_path: Path) -> Path:
    """A checkpoint (and table) after one successful run over one event."""
    sink_topics.send(1, LocalTransactionState.COMMIT_MESSAGE)
    run_sink(sink_settings(sink_topics, tmp_path), spark)
    assert len(read_table(spark, tmp_path / "table")) == 1
    return tmp_path / "checkpoint"


def test_a_corrupt_offsets_log_is_named(
    spark: SparkSession, sink_topics: SinkTopics, tmp_path: Path, used_checkpoint: Path
) -> None:
    offsets = used_checkpoint / "offsets" / "0"
    version, *_ = offsets.read_text().splitlines()
    offsets.write_text(f"{version}\n{{not json\n")  # passes the quick check; Spark finds it
    sink_topics.send(1, LocalTransactionState.COMMIT_MESSAGE)
    with pytest.raises(CheckpointError, match=r"corrupt or unreadable \(its offsets log: "):
        run_sink(sink_settings(sink_topics, tmp_path), spark)


def test_corrupt_state_is_named(
    spark: SparkSession, sink_topics: SinkTopics, tmp_path: Path, used_checkpoint: Path
) -> None:
    state_files = [p for p in (used_checkpoint / "state").rglob("*") if p.is_file()]
    data = [p for p in state_files if p.suffix in {".changelog", ".zip", ".delta"}]
    assert data, state_files
    for path in data:
        path.write_bytes(b"\x00garbage" * 8)
    sink_topics.send(1, LocalTransactionState.COMMIT_MESSAGE)
    with pytest.raises(CheckpointError, match=rf"checkpoint {used_checkpoint} is corrupt"):
        run_sink(sink_settings(sink_topics, tmp_path), spark)


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"topics": "a", "pattern": "b.*"}, "exactly one of topics"),
        ({}, "exactly one of topics"),
        ({"topics": "outbox.half"}, "outbox protocol topics"),
        ({"topics": "a", "trigger": "soon"}, "OUTBOX_SINK_TRIGGER"),
        ({"topics": "a", "checkpoint": "/x/table"}, "different paths"),
        ({"topics": "a", "bootstrap_servers": "nohost"}, "host:port"),
    ],
)
def test_settings_are_checked(
    values: dict[str, str], complaint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("OUTBOX_SINK_TOPICS", "OUTBOX_SINK_PATTERN"):
        monkeypatch.delenv(name, raising=False)
    base = {"bootstrap_servers": "h:1", "output": "/x/table", "checkpoint": "/x/ck"}
    with pytest.raises(ConfigurationError, match=complaint):
        settings_from_flags(SinkSettings, {**base, **values})


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOX_BOOTSTRAP_SERVERS", "shared:9092")
    monkeypatch.setenv("OUTBOX_SINK_TOPICS", "a, b")
    monkeypatch.setenv("OUTBOX_SINK_OUTPUT", "/t")
    monkeypatch.setenv("OUTBOX_SINK_CHECKPOINT", "/c")
    monkeypatch.setenv("OUTBOX_SINK_DEDUP_WINDOW", "7d")
    monkeypatch.setenv("OUTBOX_SINK_KAFKA_OPTIONS", '{"security.protocol": "SSL"}')
    settings = settings_from_flags(SinkSettings, {})
    assert settings.bootstrap_servers == "shared:9092"
    assert settings.topics == ("a", "b")
    assert settings.dedup_window == 7 * 86400
    assert settings.kafka_options == {"security.protocol": "SSL"}
    assert "SSL" not in repr(settings)
    monkeypatch.setenv("OUTBOX_SINK_BOOTSTRAP_SERVERS", "own:9092")
    assert settings_from_flags(SinkSettings, {}).bootstrap_servers == "own:9092"


def test_a_new_checkpoint_for_an_existing_table_is_refused(
    spark: SparkSession, sink_topics: SinkTopics, tmp_path: Path, used_checkpoint: Path
) -> None:
    """The file sink would skip the new query's first batches: events silently lost."""
    settings = sink_settings(sink_topics, tmp_path, checkpoint=str(tmp_path / "fresh"))
    with pytest.raises(CheckpointError, match="already holds a table written with another"):
        run_sink(settings, spark)
