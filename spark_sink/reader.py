"""The committed events of the real topics as a typed DataFrame, for any Spark job.

The reader is Spark's own Kafka source with the two settings the outbox depends
on fixed: ``kafka.isolation.level=read_committed`` (a rolled-back or aborted
Kafka transaction is never seen; without it the sink would land events whose
database transaction never committed) and ``includeHeaders=true`` (the
transaction id travels in a header). Headers become a map, and the outbox's
own headers become typed columns, so jobs never parse bytes themselves.

Only committed events come out: a record with an ``outbox-kind`` header is a
protocol record (half, op, check, discard) that a too-wide ``pattern`` picked
up, and is dropped here; real records never carry that header.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from outbox.errors import ConfigurationError
from outbox.protocol import Header
from outbox.protocol.records import MAX_TRANSACTION_ID_LENGTH

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

EVENT_SCHEMA = StructType(
    [
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("headers", MapType(StringType(), BinaryType())),
        StructField("transaction_id", StringType()),
        StructField("producer_group", StringType()),
    ]
)
"""The columns of :func:`read_outbox_events`, in order (nullability aside)."""

# validate_transaction_id's rule, as a Java regex: anything else is no id at all.
TRANSACTION_ID_REGEX = rf"^[A-Za-z0-9_.:-]{{1,{MAX_TRANSACTION_ID_LENGTH}}}$"

_FIXED_OPTIONS = {
    "kafka.isolation.level": "read_committed",
    "includeheaders": "true",
}
_SOURCE_OPTIONS = {"subscribe", "subscribepattern", "assign", "kafka.bootstrap.servers"}


def _option_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def kafka_source_options(
    bootstrap_servers: str,
    topics: str | Sequence[str] | None = None,
    pattern: str | None = None,
    **options: Any,
) -> dict[str, str]:
    """The Kafka source options :func:`read_outbox_events` uses (also for checks and tests).

    ``options`` are Spark Kafka source options (``startingOffsets``,
    ``failOnDataLoss``, ``maxOffsetsPerTrigger``, ``kafka.<client property>``,
    ...). Trying to turn off ``read_committed`` or the headers, or to name the
    topics a second way, is a :class:`~outbox.errors.ConfigurationError` (a
    ``ValueError``): the outbox's guarantees rest on them.
    """
    if isinstance(topics, str):
        topics = [t.strip() for t in topics.split(",") if t.strip()]
    if bool(topics) == bool(pattern):
        raise ConfigurationError("give exactly one of topics and pattern")
    result: dict[str, str] = {"startingOffsets": "earliest"}
    for name, value in options.items():
        text = _option_text(value)
        lowered = name.lower()
        if lowered in _SOURCE_OPTIONS:
            raise ConfigurationError(
                f"option {name!r} is set by read_outbox_events; pass bootstrap_servers, "
                "topics or pattern instead"
            )
        fixed = _FIXED_OPTIONS.get(lowered)
        if fixed is not None and text.lower() != fixed:
            raise ConfigurationError(
                f"option {name}={text!r} would break the outbox's guarantees; it is always {fixed}"
            )
        result[name] = text
    result["kafka.bootstrap.servers"] = bootstrap_servers
    result["kafka.isolation.level"] = "read_committed"
    result["includeHeaders"] = "true"
    if topics:
        result["subscribe"] = ",".join(topics)
    else:
        assert pattern is not None
        result["subscribePattern"] = pattern
    return result


def _header_entries() -> Column:
    """The raw header array; Spark gives null (not empty) for records without headers."""
    empty = F.array().cast("array<struct<key:string,value:binary>>")
    return F.coalesce(F.col("headers"), empty)


# Header names and values as two arrays: plain array expressions Spark compiles into the
# query's generated code. Lambda functions (filter, transform) are interpreted row by
# row instead, and cost more than the whole Kafka read of a 1 KiB record.


def _last_header(entries: Column, name: str) -> Column:
    """Value of the last header called ``name`` (Kafka's ``lastHeader``), or null."""
    from_end = F.array_position(F.reverse(entries["key"]), F.lit(name)).cast("int")
    return F.when(from_end > 0, F.element_at(entries["value"], F.size(entries) - from_end + 1))


def _headers_map(entries: Column) -> Column:
    """Headers as a map; a repeated name keeps its last value, like ``lastHeader``.

    ``map_from_arrays`` would fail the whole batch on a repeated header name
    (``spark.sql.mapKeyDedupPolicy``), and Kafka allows repeats: those rare
    records take the (slower) lambda path.
    """
    names, values = entries["key"], entries["value"]
    distinct = F.array_distinct(names)
    last_values = F.transform(
        distinct,
        lambda name: F.try_element_at(F.filter(entries, lambda h: h["key"] == name), F.lit(-1))[
            "value"
        ],
    )
    return F.when(F.size(distinct) == F.size(names), F.map_from_arrays(names, values)).otherwise(
        F.map_from_arrays(distinct, last_values)
    )


def outbox_columns(frame: DataFrame) -> DataFrame:
    """Kafka source rows (as Spark loads them) to the typed event columns, events only."""
    entries = _header_entries()
    transaction_text = _last_header(entries, Header.TRANSACTION_ID.value).cast("string")
    group_text = _last_header(entries, Header.PRODUCER_GROUP.value).cast("string")
    is_protocol_record = F.array_contains(entries["key"], F.lit(Header.KIND.value))
    return frame.where(~is_protocol_record).select(
        F.col("topic").cast(StringType()).alias("topic"),
        F.col("partition").cast(IntegerType()).alias("partition"),
        F.col("offset").cast(LongType()).alias("offset"),
        F.col("timestamp").cast(TimestampType()).alias("timestamp"),
        F.col("key").cast(BinaryType()).alias("key"),
        F.col("value").cast(BinaryType()).alias("value"),
        _headers_map(entries).alias("headers"),
        F.when(transaction_text.rlike(TRANSACTION_ID_REGEX), transaction_text).alias(
            "transaction_id"
        ),
        F.when(F.length(group_text) > 0, group_text).alias("producer_group"),
    )


def read_outbox_events(
    spark: SparkSession,
    bootstrap_servers: str,
    topics: str | Sequence[str] | None = None,
    pattern: str | None = None,
    *,
    streaming: bool = True,
    **options: Any,
) -> DataFrame:
    """The committed events of ``topics`` (or the topics matching ``pattern``).

    Columns (:data:`EVENT_SCHEMA`): ``topic`` string, ``partition`` int,
    ``offset`` long, ``timestamp`` timestamp (the Kafka record's), ``key`` and
    ``value`` binary, ``headers`` map<string, binary> (every header, the
    outbox's included), ``transaction_id`` and ``producer_group`` strings, null
    when the header is absent (or, for the id, not a valid transaction id).

    ``streaming=True`` gives a streaming DataFrame (``readStream``), else a
    batch one over what the topics hold now. Reading starts at the earliest
    offsets unless ``startingOffsets`` says otherwise; other ``options`` go to
    Spark's Kafka source unchanged (see :func:`kafka_source_options`). The
    session needs Spark's Kafka source on its classpath: ``spark_sink.session``
    adds it, or use ``spark-submit --packages`` with
    :func:`spark_sink.jars.connector_coordinates`.

    Duplicates are *not* removed here; see :mod:`spark_sink.job` for that.
    """
    source_options = kafka_source_options(bootstrap_servers, topics, pattern, **options)
    reader = spark.readStream if streaming else spark.read
    return outbox_columns(reader.format("kafka").options(**source_options).load())
