"""Values a Schema Registry serializer framed, decoded in Spark.

A producer given confluent-kafka's ``AvroSerializer`` or ``JSONSerializer``
(:mod:`outbox.serialization`) stores its values in the registry's wire format,
and the relay publishes those very bytes: a zero "magic" byte, the schema id in
four big-endian bytes, then the encoded document. Spark's ``from_json`` and
``from_avro`` read the document only, so these columns take the frame apart.
A value that is not so framed (shorter than the frame, or another first byte)
gives NULL rather than a document decoded from its first bytes. Protobuf values
carry message indexes after the schema id, which are not stripped here.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

FRAME_BYTES = 5
"""The magic byte and the schema id before the document."""


def _framed(value: Column) -> Column:
    return (F.length(value) >= FRAME_BYTES) & (F.hex(value.substr(1, 1)) == F.lit("00"))


def confluent_payload(column: str | Column = "value") -> Column:
    """The document of a framed value (binary), NULL for a value not framed."""
    value = F.col(column) if isinstance(column, str) else column
    payload = value.substr(F.lit(FRAME_BYTES + 1), F.length(value) - FRAME_BYTES)
    return F.when(_framed(value), payload)


def confluent_schema_id(column: str | Column = "value") -> Column:
    """The registry's schema id of a framed value (int), NULL for a value not framed."""
    value = F.col(column) if isinstance(column, str) else column
    schema_id = F.conv(F.hex(value.substr(2, 4)), 16, 10).cast("int")
    return F.when(_framed(value), schema_id)


def json_value(schema: StructType | str, column: str | Column = "value") -> Column:
    """A JSON Schema framed value parsed with ``schema`` (``from_json``), NULL if not framed."""
    return F.from_json(confluent_payload(column).cast("string"), schema)
