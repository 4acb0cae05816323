"""A sink run that is killed (SIGKILL) right after a batch's Delta commit.

Run as ``python -m tests.spark_sink.crash_sink SETTINGS_JSON`` in a process
group of its own: the whole group, this Python and its Spark driver JVM, dies
between the Delta commit and the checkpoint's commit of that batch, as a
machine losing power there would.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from pyspark.sql import DataFrame

from spark_sink.delta import DeltaBatchWriter
from spark_sink.job import run_sink
from spark_sink.settings import SinkSettings


def main() -> None:
    settings = SinkSettings(**json.loads(sys.argv[1]))
    write = DeltaBatchWriter.__call__

    def write_then_die(self: DeltaBatchWriter, batch: DataFrame, batch_id: int) -> None:
        write(self, batch, batch_id)
        os.killpg(0, signal.SIGKILL)

    DeltaBatchWriter.__call__ = write_then_die  # type: ignore[method-assign]
    run_sink(settings)


if __name__ == "__main__":
    main()
