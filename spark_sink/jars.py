"""Spark's own Kafka source (``spark-sql-kafka-0-10``), resolved once, used offline.

pyspark's wheel ships Spark without its Kafka connector. Spark could fetch it
itself (``spark.jars.packages``), but that downloads through Ivy at every cold
start and needs the network then; instead Maven resolves it once into the
git-ignored cache (as the development tooling does for the local Kafka broker's jars), and
sessions get the jars through ``spark.jars`` with no network at all.

Jars that pyspark already ships (Scala, Hadoop client, snappy, lz4, slf4j, ...)
are left out of ``spark.jars``: two copies of a class on one classpath is how
``NoSuchMethodError`` at runtime happens.

On a cluster, ``spark-submit --packages`` with :func:`connector_coordinates`
does the same job; see the README.

Version: the connector must match Spark, so it is the installed pyspark's
version. pyspark is pinned to 4.2.0 because that is the newest Spark release
whose ``org.apache.spark`` artifacts Maven Central serves (PyPI already has
pyspark 4.3.0, Maven Central no 4.3.0 connector); ``OUTBOX_SPARK_KAFKA_VERSION``
overrides it, e.g. for a cluster running another Spark.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
from pathlib import Path

from outbox import maven
from spark_sink.errors import SparkJarsError

SCALA_VERSION = "2.13"
CONNECTOR_ARTIFACT = f"spark-sql-kafka-0-10_{SCALA_VERSION}"
CONNECTOR_VERSION_ENV = "OUTBOX_SPARK_KAFKA_VERSION"

# name-1.2.3.jar, name-1.2.3-7.jar, name_2.13-4.2.0.jar: the version is the last
# "-<digits>.<digits>..." suffix (greedy name), the rest is the artifact name.
_JAR_NAME = re.compile(r"^(?P<artifact>.+)-(?P<version>\d+\.\d+[^-]*(?:-[A-Za-z0-9.]+)?)\.jar$")


def connector_version() -> str:
    """The ``spark-sql-kafka-0-10`` version to use (see the module docstring)."""
    return os.environ.get(CONNECTOR_VERSION_ENV) or importlib.metadata.version("pyspark")


def connector_coordinates() -> str:
    """``group:artifact:version`` of the connector, for ``spark-submit --packages``."""
    return f"org.apache.spark:{CONNECTOR_ARTIFACT}:{connector_version()}"


def spark_kafka_home() -> Path:
    """Per-version cache directory holding the generated pom and the jars."""
    return maven.cache_dir() / f"spark-kafka-{connector_version()}"


def ensure_spark_kafka_jars() -> Path:
    """Directory with the connector's runtime classpath; runs Maven only the first time."""
    version = connector_version()
    pom = maven.pom_xml(
        "spark-kafka-runtime",
        version,
        [("org.apache.spark", CONNECTOR_ARTIFACT, version)],
    )
    return maven.ensure_resolved(
        spark_kafka_home(),
        pom,
        what=f"Spark Kafka source {version}",
        coordinates=connector_coordinates(),
        required_glob=f"{CONNECTOR_ARTIFACT}-*.jar",
        error=SparkJarsError,
    )


def artifact_name(jar: str) -> str:
    """``kafka-clients-3.9.2.jar`` → ``kafka-clients``; unversioned names stay whole."""
    match = _JAR_NAME.match(jar)
    return match["artifact"] if match else jar.removesuffix(".jar")


def spark_jars_dir() -> Path | None:
    """The jars of the Spark that pyspark runs (``$SPARK_HOME/jars`` or the wheel's)."""
    try:
        from pyspark.find_spark_home import _find_spark_home
    except ImportError:
        return None
    try:
        jars = Path(_find_spark_home()) / "jars"
    except Exception:  # it exits or raises when no Spark is installed
        return None
    return jars if jars.is_dir() else None


def beyond_spark(libs: Path) -> list[Path]:
    """The jars in ``libs`` whose artifact the local Spark does not already ship."""
    shipped_dir = spark_jars_dir()
    shipped = {artifact_name(p.name) for p in shipped_dir.glob("*.jar")} if shipped_dir else set()
    return sorted(p for p in libs.glob("*.jar") if artifact_name(p.name) not in shipped)


def spark_kafka_jars(libs: Path | None = None) -> list[Path]:
    """The connector's jars minus every artifact the local Spark already ships."""
    return _resolved(libs or ensure_spark_kafka_jars(), CONNECTOR_ARTIFACT, "")


def _resolved(libs: Path, artifact: str, fetch_flag: str) -> list[Path]:
    """The jars of ``libs`` beyond Spark's own, which must include ``artifact`` itself."""
    jars = beyond_spark(libs)
    if not any(p.name.startswith(artifact) for p in jars):
        raise SparkJarsError(
            f"no {artifact} jar in {libs}; run `outbox dev spark fetch{fetch_flag}` "
            f"(or delete {libs.parent} to resolve it again)"
        )
    return jars


# ------------------------------------------------------------------ Delta Lake

DELTA_ARTIFACT = f"delta-spark_4.2_{SCALA_VERSION}"
DELTA_VERSION_ENV = "OUTBOX_SPARK_DELTA_VERSION"
DELTA_DEFAULT_VERSION = "4.4.0"
"""The Delta Lake release built for Spark 4.2 (its artifact names the Spark line)."""


def delta_version() -> str:
    """Delta's jar version: the installed ``delta-spark`` Python package's, so the two agree."""
    if os.environ.get(DELTA_VERSION_ENV):
        return os.environ[DELTA_VERSION_ENV]
    try:
        return importlib.metadata.version("delta-spark")
    except importlib.metadata.PackageNotFoundError:
        return DELTA_DEFAULT_VERSION


def delta_coordinates() -> str:
    """``group:artifact:version`` of Delta Lake, for ``spark-submit --packages``."""
    return f"io.delta:{DELTA_ARTIFACT}:{delta_version()}"


def ensure_delta_jars() -> Path:
    """Directory with Delta Lake's runtime classpath; runs Maven only the first time."""
    version = delta_version()
    return maven.ensure_resolved(
        maven.cache_dir() / f"spark-delta-{version}",
        maven.pom_xml("spark-delta-runtime", version, [("io.delta", DELTA_ARTIFACT, version)]),
        what=f"Delta Lake {version}",
        coordinates=delta_coordinates(),
        required_glob=f"{DELTA_ARTIFACT}-*.jar",
        error=SparkJarsError,
    )


def delta_jars(libs: Path | None = None) -> list[Path]:
    """Delta's jars minus every artifact the local Spark already ships."""
    return _resolved(libs or ensure_delta_jars(), DELTA_ARTIFACT, " --delta")
