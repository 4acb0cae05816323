"""The driver's temporary files stay where ``TMPDIR`` points, as every other part's do.

A JVM takes /tmp whatever ``TMPDIR`` says; Spark's block managers and scratch directories
and the native libraries it unpacks (snappy, lz4, RocksDB) would outlive every run there.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_sink.session import launch_conf


def test_a_new_driver_is_told_python_s_temporary_directory_before_the_callers_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    options = launch_conf(
        "local[1]", {"spark.driver.extraJavaOptions": "-Djava.io.tmpdir=/elsewhere"}
    )["spark.driver.extraJavaOptions"].split()
    assert options[0] == f"-Djava.io.tmpdir={tmp_path}"
    assert options[-1] == "-Djava.io.tmpdir=/elsewhere"  # the JVM takes the last one


def test_the_drivers_scratch_files_land_in_tmpdir(spark: SparkSession, tmp_path: Path) -> None:
    """Under ``make test`` TMPDIR is the run's own directory, which the leftovers check
    empties and inspects; outside it this is /tmp and proves less."""
    rows = spark.range(2000).groupBy((F.col("id") % 7).alias("key")).count()
    rows.write.parquet(str(tmp_path / "table"))  # a shuffle, and Parquet's snappy codec
    here = Path(tempfile.gettempdir())
    assert list(here.glob("blockmgr-*")), f"no block manager directory in {here}"
    assert list(here.glob("spark-*")), f"no Spark scratch directory in {here}"
    assert list(here.glob("snappy-*.so")), f"snappy's native library was not unpacked in {here}"
