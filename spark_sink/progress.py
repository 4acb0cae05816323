"""Per-batch figures of the sink query, read from Spark's own progress reports.

Spark already measures each micro-batch; the sink adds two observed metrics
(rows entering the de-duplication, and rows leaving it) and reads the rest
from the progress JSON: duplicates dropped by the state operator, and lag as
the records between the batch's end offsets and the latest (last stable)
offsets of every partition.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

IN_METRICS = "outbox_sink_in"
OUT_METRICS = "outbox_sink_out"


def progress_dict(progress: Any) -> dict[str, Any]:
    """A StreamingQueryProgress (a dict subclass holding Rows in pyspark 4) as plain JSON data."""
    text = getattr(progress, "json", None)
    if isinstance(text, str):
        return dict(json.loads(text))
    return dict(progress)


def _offsets(raw: Any) -> dict[str, dict[str, int]]:
    if raw is None:
        return {}
    loaded = json.loads(raw) if isinstance(raw, str) else raw
    return loaded if isinstance(loaded, dict) else {}


def offsets_behind(source: dict[str, Any]) -> int | None:
    """Records between a Kafka source's end offsets and its latest offsets, all partitions."""
    latest = _offsets(source.get("latestOffset"))
    end = _offsets(source.get("endOffset"))
    if not latest:
        return None
    behind = 0
    for topic, partitions in latest.items():
        if not isinstance(partitions, dict):
            continue
        for partition, offset in partitions.items():
            done = end.get(topic, {}).get(partition, 0) if isinstance(end.get(topic), dict) else 0
            behind += max(0, int(offset) - int(done))
    return behind


@dataclass(frozen=True)
class WriterCounts:
    """One batch as the writer that de-duplicated it counted it."""

    rows_in: int
    rows_written: int
    without_id: int


@dataclass(frozen=True)
class BatchProgress:
    """What one micro-batch did."""

    batch_id: int
    rows_in: int
    rows_written: int
    duplicates: int
    without_id: int
    late: int
    lag: int | None
    duration_ms: int

    @classmethod
    def from_progress(cls, progress: Any) -> BatchProgress:
        data = progress_dict(progress)
        observed = data.get("observedMetrics") or {}
        seen = observed.get(IN_METRICS) or {}
        written = observed.get(OUT_METRICS) or {}
        rows_in = int(seen.get("rows_in") or 0)
        rows_written = int(written.get("rows_written") or 0)
        operators = data.get("stateOperators") or []
        late = sum(int(op.get("numRowsDroppedByWatermark") or 0) for op in operators)
        reported = [
            int(op["customMetrics"]["numDroppedDuplicateRows"])
            for op in operators
            if "numDroppedDuplicateRows" in (op.get("customMetrics") or {})
        ]
        duplicates = sum(reported) if reported else max(0, rows_in - rows_written - late)
        lags = [offsets_behind(source) for source in data.get("sources") or []]
        known = [lag for lag in lags if lag is not None]
        return cls(
            batch_id=int(data.get("batchId", -1)),
            rows_in=rows_in,
            rows_written=rows_written,
            duplicates=duplicates,
            without_id=int(seen.get("without_id") or 0),
            late=late,
            lag=sum(known) if known else None,
            duration_ms=int(data.get("batchDuration") or 0),
        )

    def counted_by_writer(self, counts: WriterCounts) -> BatchProgress:
        """The batch as its writer counted it: rows it did not write were copies.

        A writer that reads the batch more than once (the Delta de-duplication)
        counts for itself: Spark's observed metrics add up every read.
        """
        duplicates = max(0, counts.rows_in - counts.rows_written - self.late)
        return replace(
            self,
            rows_in=counts.rows_in,
            rows_written=counts.rows_written,
            without_id=counts.without_id,
            duplicates=duplicates,
        )

    def line(self) -> str:
        lag = "?" if self.lag is None else str(self.lag)
        late = f" late={self.late}" if self.late else ""
        return (
            f"batch {self.batch_id}: rows_in={self.rows_in} written={self.rows_written} "
            f"duplicates={self.duplicates} without_id={self.without_id}{late} lag={lag} "
            f"({self.duration_ms / 1000:.1f}s)"
        )


@dataclass
class SinkSummary:
    """Totals over the batches one run of the sink processed."""

    batches: int = 0
    rows_in: int = 0
    rows_written: int = 0
    duplicates: int = 0
    without_id: int = 0
    late: int = 0
    lag: int | None = None

    def add(self, batch: BatchProgress) -> None:
        self.batches += 1
        self.rows_in += batch.rows_in
        self.rows_written += batch.rows_written
        self.duplicates += batch.duplicates
        self.without_id += batch.without_id
        self.late += batch.late
        self.lag = batch.lag

    def line(self) -> str:
        lag = "?" if self.lag is None else str(self.lag)
        return (
            f"sink: batches={self.batches} rows_in={self.rows_in} written={self.rows_written} "
            f"duplicates={self.duplicates} without_id={self.without_id} lag={lag}"
        )
