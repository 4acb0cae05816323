"""Schema Registry framed values decoded in Spark, as the sink's users read typed events."""

from __future__ import annotations

import json

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.json_schema import JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyspark.sql import SparkSession
from pyspark.sql.types import BinaryType, DoubleType, LongType, StructField, StructType

from spark_sink.schema_registry import confluent_payload, confluent_schema_id, json_value

ORDER_SCHEMA = json.dumps(
    {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "total": {"type": "number"}},
        "required": ["id", "total"],
    }
)
ORDER = StructType([StructField("id", LongType()), StructField("total", DoubleType())])


def test_framed_json_values_decode_with_their_schema_id_and_unframed_ones_are_null(
    spark: SparkSession,
) -> None:
    """The bytes a producer's ``JSONSerializer`` wrote (the relay publishes them as they are):
    a zero byte, the schema id, the document. A value not so framed decodes to NULL, not to
    a document made of its first bytes."""
    registry = SchemaRegistryClient.new_client({"url": "mock://outbox-spark-tests"})
    serialize = JSONSerializer(ORDER_SCHEMA, registry)
    context = SerializationContext("orders", MessageField.VALUE)
    framed = [serialize({"id": n, "total": n * 1.5}, context) for n in (1, 2)]
    (schema_id,) = {registry.get_latest_version("orders-value").schema_id}
    values = [*framed, b'{"id": 3, "total": 4.5}', b"", None]
    frame = spark.createDataFrame(
        [(v,) for v in values], StructType([StructField("value", BinaryType())])
    )
    rows = frame.select(
        confluent_schema_id().alias("schema_id"),
        json_value(ORDER).alias("order"),
        confluent_payload().alias("payload"),
    ).collect()
    assert [r.schema_id for r in rows] == [schema_id, schema_id, None, None, None]
    assert [r.order and (r.order.id, r.order.total) for r in rows] == [
        (1, 1.5),
        (2, 3.0),
        None,
        None,
        None,
    ]
    assert bytes(rows[0].payload) == framed[0][5:]
