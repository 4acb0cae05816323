"""PySpark Structured Streaming over the real topics: committed events into a table.

* :func:`read_outbox_events`: the committed events as a typed DataFrame, for any
  Spark job (:mod:`spark_sink.reader`);
* :func:`run_sink` / :func:`start_sink`: the ready job, de-duplicating by
  transaction id into a Parquet table (:mod:`spark_sink.job`) or a Delta Lake
  table (:mod:`spark_sink.delta`), also ``outbox sink``;
* :class:`SinkSettings`: its settings, every field an ``OUTBOX_SINK_*`` variable.

Names are imported on first use, so ``import spark_sink`` (and the ``outbox``
command line) does not import pyspark until Spark is actually needed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spark_sink.errors import SinkError
    from spark_sink.job import SinkRun, run_sink, start_sink
    from spark_sink.progress import BatchProgress, SinkSummary
    from spark_sink.reader import EVENT_SCHEMA, read_outbox_events
    from spark_sink.session import create_session
    from spark_sink.settings import SinkSettings

_EXPORTS = {
    "EVENT_SCHEMA": "spark_sink.reader",
    "read_outbox_events": "spark_sink.reader",
    "SinkRun": "spark_sink.job",
    "run_sink": "spark_sink.job",
    "start_sink": "spark_sink.job",
    "BatchProgress": "spark_sink.progress",
    "SinkSummary": "spark_sink.progress",
    "create_session": "spark_sink.session",
    "SinkSettings": "spark_sink.settings",
    "SinkError": "spark_sink.errors",
}

__all__ = [
    "EVENT_SCHEMA",
    "BatchProgress",
    "SinkError",
    "SinkRun",
    "SinkSettings",
    "SinkSummary",
    "create_session",
    "read_outbox_events",
    "run_sink",
    "start_sink",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'spark_sink' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
