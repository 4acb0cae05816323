"""The reader: typed columns from a real broker, read_committed, protocol records left out."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    TimestampType,
)

from outbox import LocalTransactionState
from outbox.protocol import Header
from spark_sink import EVENT_SCHEMA, read_outbox_events
from spark_sink.reader import kafka_source_options
from tests.spark_sink.conftest import GROUP, SinkTopics

EXPECTED_TYPES = {
    "topic": StringType(),
    "partition": IntegerType(),
    "offset": LongType(),
    "timestamp": TimestampType(),
    "key": BinaryType(),
    "value": BinaryType(),
    "headers": MapType(StringType(), BinaryType()),
    "transaction_id": StringType(),
    "producer_group": StringType(),
}


def test_schema_and_values_of_committed_events(
    spark: SparkSession, sink_topics: SinkTopics
) -> None:
    [committed] = sink_topics.send(1, LocalTransactionState.COMMIT_MESSAGE)
    sink_topics.publish(
        [
            (b"no-headers", []),
            (b"bad-id", [(Header.TRANSACTION_ID.value, b"not valid!")]),
            (b"repeated", [("h", b"first"), ("h", b"last")]),
            (
                b"two-ids",
                [(Header.TRANSACTION_ID.value, b"id-1"), (Header.TRANSACTION_ID.value, b"id-2")],
            ),
            (b"a-half", [(Header.KIND.value, b"half"), (Header.TRANSACTION_ID.value, b"x")]),
        ]
    )
    sink_topics.publish([(b"aborted", sink_topics.real_headers("aborted-1"))], abort=True)

    frame = read_outbox_events(
        spark, sink_topics.bootstrap, [sink_topics.real_topic], streaming=False
    )

    assert [f.name for f in frame.schema.fields] == list(EXPECTED_TYPES)
    assert {f.name: f.dataType for f in frame.schema.fields} == EXPECTED_TYPES
    assert [f.name for f in EVENT_SCHEMA.fields] == list(EXPECTED_TYPES)
    rows = {row.value: row for row in frame.collect()}
    assert set(rows) == {
        sink_topics.sent[committed],
        b"no-headers",
        b"bad-id",
        b"repeated",
        b"two-ids",
    }

    real = rows[sink_topics.sent[committed]]
    assert real.transaction_id == committed
    assert real.producer_group == GROUP
    assert real.topic == sink_topics.real_topic
    assert real.key == b"k0"
    assert 0 <= real.partition < 2 and real.offset >= 0 and real.timestamp is not None
    assert real.headers[Header.TRANSACTION_ID.value] == committed.encode()

    bare = rows[b"no-headers"]
    assert bare.transaction_id is None and bare.producer_group is None
    assert bare.headers == {}
    assert rows[b"bad-id"].transaction_id is None, "an invalid id is no id"
    assert rows[b"repeated"].headers == {"h": b"last"}, "like Kafka's lastHeader"
    assert rows[b"two-ids"].transaction_id == "id-2", "like Kafka's lastHeader"
    assert rows[b"two-ids"].headers == {Header.TRANSACTION_ID.value: b"id-2"}


def test_streaming_frame_has_the_same_columns(spark: SparkSession, sink_topics: SinkTopics) -> None:
    frame = read_outbox_events(spark, sink_topics.bootstrap, sink_topics.real_topic)
    assert frame.isStreaming
    assert {f.name: f.dataType for f in frame.schema.fields} == EXPECTED_TYPES


def test_pattern_reads_every_matching_topic(spark: SparkSession, sink_topics: SinkTopics) -> None:
    [committed] = sink_topics.send(1, LocalTransactionState.COMMIT_MESSAGE)
    pattern = f"{sink_topics.names.prefix}.*"  # also matches the half and op topics
    frame = read_outbox_events(spark, sink_topics.bootstrap, pattern=pattern, streaming=False)
    rows = frame.collect()
    assert [row.transaction_id for row in rows] == [committed], "halves and ops are not events"


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        ({"kafka.isolation.level": "read_uncommitted"}, "read_committed"),
        ({"includeHeaders": False}, "always true"),
        ({"subscribe": "other"}, "set by read_outbox_events"),
    ],
)
def test_options_that_break_the_guarantees_are_refused(
    options: dict[str, object], complaint: str
) -> None:
    with pytest.raises(ValueError, match=complaint):
        kafka_source_options("h:1", ["t"], **options)


def test_exactly_one_of_topics_and_pattern() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        kafka_source_options("h:1", ["t"], "t.*")
    with pytest.raises(ValueError, match="exactly one"):
        kafka_source_options("h:1")
    options = kafka_source_options("h:1", "a,b", failOnDataLoss=False, startingOffsets="latest")
    assert options["subscribe"] == "a,b"
    assert options["failOnDataLoss"] == "false"
    assert options["startingOffsets"] == "latest"
    assert options["kafka.isolation.level"] == "read_committed"
