"""What the sink's table looks like, whichever format writes it: partitions and the dedup key.

Shared by the file sink (:mod:`spark_sink.job`) and the Delta writer
(:mod:`spark_sink.delta`), which must agree on both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column

PARTITION_COLUMNS = ("topic", "date")
DEDUP_KEY = "_outbox_dedup_key"


def dedup_key() -> Column:
    """The transaction id, or for a record without one its Kafka position (unique)."""
    from pyspark.sql import functions as F

    position = F.concat_ws(
        "/",
        F.lit("~"),
        F.col("topic"),
        F.col("partition").cast("string"),
        F.col("offset").cast("string"),
    )
    # A valid transaction id never contains "/", so the two kinds of key never meet.
    return F.coalesce(F.col("transaction_id"), position)
