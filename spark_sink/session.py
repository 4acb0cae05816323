"""A SparkSession that can read Kafka: the cached connector jars, quiet logs, UTC.

Two ways a session comes about, and they differ in what can still be set:

* a plain ``python``/``outbox sink`` process: pyspark launches the driver JVM
  here, so the connector jars (``spark.jars``) and the driver's log4j
  configuration are passed at launch; the master is ``--master`` (any Spark
  master in client mode) or ``local[*]``. Where Maven is missing (a slim
  container), ``spark.jars.packages`` lets Spark fetch the connector itself;
* under ``spark-submit`` (or any already running SparkContext): the JVM exists,
  its classpath is whatever ``--packages``/``--jars`` gave it, and only runtime
  settings apply.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from outbox import maven
from spark_sink.errors import SparkJarsError
from spark_sink.jars import connector_coordinates, delta_coordinates, delta_jars, spark_kafka_jars

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEBUG_ENV = "OUTBOX_DEBUG"

# Spark's defaults log every WARN (and every failed query with its stack trace)
# to stderr; the sink reports problems itself, in one line. OUTBOX_DEBUG=1 keeps
# Spark's own logging.
_QUIET_LOG4J2 = """\
# written by spark_sink.session: the sink reports its own errors, in one line
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n
appender.console.layout.alwaysWriteExceptions = false
# pyspark's gateway sets the root level to its own logger's (WARN when unset) at start.
logger.repl.name = org.apache.spark.api.python.PythonGatewayServer
logger.repl.level = error
# A failed query is logged with its whole stack trace; the sink prints the cause.
logger.microbatch.name = org.apache.spark.sql.execution.streaming
logger.microbatch.level = off
logger.streamrt.name = org.apache.spark.sql.execution.streaming.runtime
logger.streamrt.level = off
logger.executor.name = org.apache.spark.executor.Executor
logger.executor.level = off
logger.tasks.name = org.apache.spark.scheduler.TaskSetManager
logger.tasks.level = off
logger.kafka.name = org.apache.kafka
logger.kafka.level = off
# A query stopped mid-batch (SIGTERM, Ctrl-C) aborts that batch's write and
# broadcast; the batch is redone from the checkpoint, nothing is wrong.
logger.writer.name = org.apache.spark.sql.execution.datasources.FileFormatWriter
logger.writer.level = off
logger.broadcast.name = org.apache.spark.broadcast.TorrentBroadcast
logger.broadcast.level = off
logger.utils.name = org.apache.spark.util.Utils
logger.utils.level = off
"""

# Static settings Delta Lake needs (MERGE, the DeltaTable API); fixed when the JVM starts.
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}

# Runtime SQL settings every sink session gets, new or joined.
SQL_DEFAULTS = {
    # Date partitions must not depend on the time zone of whichever machine runs it.
    "spark.sql.session.timeZone": "UTC",
}


def quiet_log4j2_file() -> Path:
    """The driver's quiet log4j2 configuration, written into the cache on first use."""
    path = maven.cache_dir() / "spark-log4j2-quiet.properties"
    if not path.is_file() or path.read_text() != _QUIET_LOG4J2:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_QUIET_LOG4J2)
    return path


def java_temp_dir_option() -> str:
    """``-Djava.io.tmpdir`` naming Python's temporary directory (``TMPDIR``, else /tmp).

    A JVM takes /tmp whatever ``TMPDIR`` says, and Spark's driver puts its block manager
    and scratch directories there, and the native libraries it unpacks (snappy, lz4,
    RocksDB): a sink told to keep its temporary files elsewhere must keep all of them there.
    """
    return f"-Djava.io.tmpdir={tempfile.gettempdir()}"


def spark_context_running() -> bool:
    """Whether a JVM is already there (spark-submit, a notebook, a test's session)."""
    from pyspark import SparkContext

    return SparkContext._active_spark_context is not None or "PYSPARK_GATEWAY_PORT" in os.environ


def launch_conf(
    master: str | None = None, conf: dict[str, str] | None = None, *, delta: bool = False
) -> dict[str, str]:
    """The configuration a new driver JVM is launched with (see the module docstring).

    ``delta`` adds Delta Lake's jars and session extension (``--format delta``).
    """
    user = dict(conf or {})
    configured_master = user.pop("spark.master", None)
    settings = {
        "spark.master": master or configured_master or "local[*]",
        # Progress bars would garble the per-batch progress lines.
        "spark.ui.showConsoleProgress": "false",
        **SQL_DEFAULTS,
    }
    extra_jars = [jar for jar in user.pop("spark.jars", "").split(",") if jar]
    try:
        jars = [str(p) for p in spark_kafka_jars()]
        if delta:
            jars += [str(p) for p in delta_jars()]
    except SparkJarsError:
        if shutil.which("mvn") is not None:
            raise
        # No Maven here (a slim container image): Spark's own resolver (Ivy)
        # fetches the connector from Maven Central when the driver starts.
        jars = []
        packages = [p for p in user.pop("spark.jars.packages", "").split(",") if p]
        ours = [connector_coordinates(), *([delta_coordinates()] if delta else [])]
        settings["spark.jars.packages"] = ",".join([*ours, *packages])
        settings["spark.jars.ivy"] = str(maven.cache_dir() / "ivy")
    if jars or extra_jars:
        settings["spark.jars"] = ",".join([*jars, *extra_jars])
    if delta:
        settings.update(DELTA_CONF)
    # The caller's own options come last: a -D given twice, the JVM takes the last one.
    java_options = [java_temp_dir_option()]
    if not os.environ.get(DEBUG_ENV):
        java_options.append(f"-Dlog4j2.configurationFile=file:{quiet_log4j2_file()}")
    java_options.append(user.pop("spark.driver.extraJavaOptions", ""))
    settings["spark.driver.extraJavaOptions"] = " ".join(java_options).strip()
    settings.update(user)
    return settings


def create_session(
    master: str | None = None,
    app_name: str = "outbox-sink",
    conf: dict[str, str] | None = None,
    *,
    delta: bool = False,
) -> SparkSession:
    """A session with Spark's Kafka source, new or the running one (spark-submit).

    ``delta`` launches a new JVM with Delta Lake too; a running one must have it already.
    """
    from pyspark.sql import SparkSession

    if spark_context_running():
        builder = SparkSession.builder.appName(app_name)
        for key, value in (conf or {}).items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        if not os.environ.get(DEBUG_ENV):
            session.sparkContext.setLogLevel("ERROR")
    else:
        builder = SparkSession.builder.appName(app_name)
        for key, value in launch_conf(master, conf, delta=delta).items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
    for key, value in SQL_DEFAULTS.items():
        session.conf.set(key, value)
    return session
