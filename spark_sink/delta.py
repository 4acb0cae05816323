"""The Delta Lake table (``--format delta``): idempotent micro-batches, de-duplicated against it.

Exactly once, in two layers
---------------------------
* **Each micro-batch commits once.** Batches are written by ``foreachBatch``
  with Delta's idempotent writes: the Delta commit carries the query's id
  (``txnAppId``, stable for a checkpoint) and the batch id (``txnVersion``), and
  Delta skips a write whose version it already committed for that id. A driver
  killed after the Delta commit but before the checkpoint's commit redoes the
  batch on restart; the redo is a no-op. A new checkpoint is a new query id, so
  it can never be mistaken for the old one's batches.
* **Each transaction lands once** (``--dedup merge``): a row is left out when
  its transaction id is already in the table, however long ago it landed, or
  is at a later Kafka position than another row of the same id in the batch.
  The search is bounded to the date partitions from the batch's earliest date
  minus ``--dedup-lookback`` (7 days by default). Rows without a transaction id
  never match and are all written.

How: what Delta's insert-only ``MERGE`` does (an anti-join of the batch
against the table), but only the narrow columns (id, Kafka position) are
joined: the ids of the batch against the ids of the recent partitions, which
finds the positions to leave out (usually none). The full rows then go to an
ordinary idempotent append, through a broadcast anti-join only when there are
positions to leave out (``MERGE`` joined and shuffled the full rows). The batch
is read from Kafka twice, for the ids and for the append: Spark's observed
metrics then count its rows twice, so the writer counts them itself
(:class:`~spark_sink.progress.WriterCounts`). Unlike ``MERGE``, the append does
not detect a concurrent writer inserting the same id: the sink must be the
table's only writer (as it is: one query per checkpoint and table).

The table is created (partitioned by ``topic`` and ``date``) before the query
starts; an existing one must have the sink's columns and partitioning, which
names a table some other job wrote.
"""

from __future__ import annotations

import datetime as dt
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from spark_sink.errors import CheckpointError, OutputPathError, SparkJarsError
from spark_sink.jars import delta_coordinates
from spark_sink.preflight import has_entries, local_path
from spark_sink.progress import WriterCounts
from spark_sink.table_layout import PARTITION_COLUMNS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from spark_sink.settings import SinkSettings

APP_ID_WAIT_SECONDS = 60.0
POSITION = ("topic", "partition", "offset")
BROADCAST_COPIES = 1_000_000
"""Up to this many copies in a batch, the positions to leave out are broadcast."""


def _delta_tables() -> type:
    try:
        from delta.tables import DeltaTable
    except ImportError:
        raise SparkJarsError(
            "format delta needs the delta-spark package: pip install 'kafka-outbox[delta]'"
        ) from None
    return DeltaTable


def _columns(schema: StructType) -> dict[str, str]:
    return {f.name: f.dataType.simpleString() for f in schema.fields}


def prepare_table(spark: SparkSession, settings: SinkSettings, schema: StructType) -> None:
    """Create the table, or check that an existing one is the sink's kind of table."""
    from pyspark.sql.types import StructField, StructType

    delta_table = _delta_tables()
    if "DeltaSparkSessionExtension" not in (spark.conf.get("spark.sql.extensions", "") or ""):
        raise SparkJarsError(
            "this Spark session has no Delta Lake extension; pass --packages "
            f"{delta_coordinates()} and --conf spark.sql.extensions="
            "io.delta.sql.DeltaSparkSessionExtension to spark-submit"
        )
    partitions = list(PARTITION_COLUMNS)
    if not delta_table.isDeltaTable(spark, settings.output):
        output = local_path(settings.output)
        if output is not None and has_entries(output):
            raise OutputPathError(
                f"output {settings.output} holds files but is not a Delta table (no _delta_log); "
                "point --output at an empty directory or a Delta table the sink wrote"
            )
        nullable = StructType([StructField(f.name, f.dataType, True) for f in schema.fields])
        (
            delta_table.createIfNotExists(spark)
            .location(settings.output)
            .addColumns(nullable)
            .partitionedBy(*partitions)
            .execute()
        )
        return
    table = delta_table.forPath(spark, settings.output)
    have, want = _columns(table.toDF().schema), _columns(schema)
    differences = [
        f"{name} {have.get(name, 'missing')} (sink writes {kind})"
        for name, kind in want.items()
        if have.get(name) != kind
    ]
    differences += [
        f"{name} {have[name]} (not the sink's)" for name in sorted(have.keys() - want.keys())
    ]
    if differences:
        raise OutputPathError(
            f"output {settings.output} is a Delta table another job wrote: its schema does not "
            f"match the sink's: {'; '.join(differences)}. Use a new --output path"
        )
    detail = table.detail().select("partitionColumns", "numFiles").first()
    if detail is not None and list(detail.partitionColumns) != partitions:
        raise OutputPathError(
            f"output {settings.output} is a Delta table another job wrote: partitioned by "
            f"{list(detail.partitionColumns)}, the sink partitions by {partitions}. "
            "Use a new --output path"
        )
    checkpoint = local_path(settings.checkpoint)
    is_new = checkpoint is not None and not (checkpoint / "metadata").is_file()
    if is_new and detail is not None and detail.numFiles and settings.dedup_mode != "merge":
        raise CheckpointError(
            f"output {settings.output} already holds rows and checkpoint {settings.checkpoint} "
            f"is new: it reads from --starting-offsets again and, with dedup "
            f"{settings.dedup_mode}, would land those events a second time. Use the checkpoint "
            "that wrote the table, or --dedup merge"
        )


@dataclass
class DeltaBatchWriter:
    """``foreachBatch`` function: one idempotent Delta commit per micro-batch.

    The query's id is only known once the query started; batches wait for it
    (:meth:`started`), which happens before the first batch in practice.
    """

    settings: SinkSettings
    app_id: str | None = None
    counted: dict[int, WriterCounts] = field(default_factory=dict)
    """What each de-duplicated batch held and wrote, by batch id, until reported."""
    _ready: threading.Event = field(default_factory=threading.Event)

    def started(self, query_id: str) -> None:
        self.app_id = query_id
        self._ready.set()

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        if not self._ready.wait(APP_ID_WAIT_SECONDS) or self.app_id is None:
            raise RuntimeError("the sink query's id never became known; no batch was written")
        if self.settings.dedup_mode == "merge":
            self.merge(batch, batch_id)
        else:
            self.append(batch, batch_id)

    def append(self, batch: DataFrame, batch_id: int) -> None:
        (
            batch.write.format("delta")
            .mode("append")
            .option("txnAppId", self.app_id)
            .option("txnVersion", batch_id)
            .save(self.settings.output)
        )

    def merge(self, batch: DataFrame, batch_id: int) -> None:
        """Append the batch without the copies of transactions already in it or in the table.

        Only the narrow columns (id, position, date) are joined; the full rows go
        straight from Kafka to the table, and through a join only when this batch
        has copies to leave out (rare: the relay publishes each commit once).
        """
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        # Kafka is read twice: for the narrow columns (kept, small), then for the append.
        # Reading it again costs less than keeping the full rows (1 KiB each) on disk.
        keys = batch.select("transaction_id", *POSITION, "date").persist(
            StorageLevel.MEMORY_AND_DISK
        )
        copies: DataFrame | None = None
        rows = batch
        try:
            totals = keys.agg(
                F.min("date").alias("earliest"),
                F.count(F.lit(1)).alias("n"),
                F.count_if(F.col("transaction_id").isNull()).alias("without_id"),
            ).first()
            if totals is None or totals.earliest is None:
                self.counted[batch_id] = WriterCounts(0, 0, 0)
                return
            since: dt.date = totals.earliest - dt.timedelta(seconds=self.settings.dedup_lookback)
            copies = self._copies(keys, since).persist(StorageLevel.MEMORY_AND_DISK)
            left_out = copies.count()
            if left_out:
                small = left_out <= BROADCAST_COPIES
                kept = rows.join(
                    F.broadcast(copies) if small else copies, list(POSITION), "left_anti"
                )
                rows = kept.select(*batch.columns)
            self.append(rows, batch_id)
            n = int(totals.n)
            self.counted[batch_id] = WriterCounts(n, n - left_out, int(totals.without_id))
        finally:
            keys.unpersist()
            if copies is not None:
                copies.unpersist()

    def _copies(self, rows: DataFrame, since: dt.date) -> DataFrame:
        """Positions of the rows to leave out: a transaction id already in the table
        (date partitions from ``since``), or not the first position of its id in the batch."""
        from pyspark.sql import functions as F

        first = F.struct(*POSITION)
        ids = rows.where(F.col("transaction_id").isNotNull()).select(
            "transaction_id", first.alias("at")
        )
        per_id = ids.groupBy("transaction_id").agg(
            F.count(F.lit(1)).alias("copies"), F.min("at").alias("first")
        )
        stored = (
            _delta_tables()
            .forPath(rows.sparkSession, self.settings.output)
            .toDF()
            .where(F.col("date") >= F.lit(since))
            .select("transaction_id")
        )
        known = per_id.join(stored, "transaction_id", "left_semi").select(
            "transaction_id", F.lit(True).alias("stored")
        )
        flagged = per_id.join(known, "transaction_id", "left").where(
            F.col("stored").isNotNull() | (F.col("copies") > 1)
        )
        return (
            ids.join(flagged, "transaction_id")
            .where(F.col("stored").isNotNull() | (F.col("at") != F.col("first")))
            .select("at.*")
        )
