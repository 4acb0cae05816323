"""The connector jars: resolved once, pyspark's own jars left out, a fallback without Maven."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from spark_sink.jars import (
    CONNECTOR_ARTIFACT,
    artifact_name,
    connector_coordinates,
    ensure_spark_kafka_jars,
    spark_jars_dir,
    spark_kafka_home,
    spark_kafka_jars,
)
from spark_sink.session import launch_conf


@pytest.mark.parametrize(
    ("jar", "artifact"),
    [
        ("kafka-clients-3.9.2.jar", "kafka-clients"),
        ("spark-sql-kafka-0-10_2.13-4.2.0.jar", "spark-sql-kafka-0-10_2.13"),
        ("zstd-jni-1.5.7-7.jar", "zstd-jni"),
        ("hive-exec-2.3.10-core.jar", "hive-exec"),
        ("commons-pool2-2.13.1.jar", "commons-pool2"),
        ("unversioned.jar", "unversioned"),
    ],
)
def test_artifact_names(jar: str, artifact: str) -> None:
    assert artifact_name(jar) == artifact


def test_only_jars_pyspark_lacks_go_on_the_classpath() -> None:
    libs = ensure_spark_kafka_jars()
    jars = {p.name for p in spark_kafka_jars(libs)}
    shipped_dir = spark_jars_dir()
    assert shipped_dir is not None
    shipped = {artifact_name(p.name) for p in shipped_dir.glob("*.jar")}
    assert any(name.startswith(CONNECTOR_ARTIFACT) for name in jars)
    assert any(name.startswith("kafka-clients-") for name in jars)
    assert not {artifact_name(name) for name in jars} & shipped
    resolved = {p.name for p in libs.glob("*.jar")}
    assert any(name.startswith("scala-library-") for name in resolved - jars), "left out"


def test_a_resolved_cache_is_reused_without_maven(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    libs = ensure_spark_kafka_jars()
    monkeypatch.setenv("OUTBOX_CACHE_DIR", str(tmp_path))
    copy = spark_kafka_home()
    shutil.copytree(libs, copy / "libs")
    shutil.copy(libs.parent / "resolved.txt", copy / "resolved.txt")
    monkeypatch.setenv("PATH", str(tmp_path))  # no mvn: must not be needed
    assert ensure_spark_kafka_jars() == copy / "libs"


def test_without_maven_spark_fetches_the_connector_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOX_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("OUTBOX_DEBUG", raising=False)
    conf = launch_conf("local[1]", {"spark.jars.packages": "org.example:extra:1.0"})
    assert conf["spark.jars.packages"] == f"{connector_coordinates()},org.example:extra:1.0"
    assert conf["spark.jars.ivy"] == str(tmp_path / "ivy")
    assert "spark.jars" not in conf
    assert conf["spark.master"] == "local[1]"
    assert "log4j2.configurationFile" in conf["spark.driver.extraJavaOptions"]
