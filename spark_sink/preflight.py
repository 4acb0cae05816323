"""Checks before the query starts, so a mistake is one clear line, not a hung job.

Spark's Kafka source waits forever for a topic that does not exist and retries
unreachable brokers for minutes; a path it cannot write fails only inside the
first batch, as a stack trace. These checks ask first:

* Kafka: the JVM's own Kafka admin client (the one the source uses, with the
  same ``kafka.*`` properties, SASL included) lists the topics within a timeout;
* paths: a local output or checkpoint directory must be creatable and writable
  (remote URIs such as ``s3a://`` are left to Spark);
* checkpoint: a local checkpoint's ``metadata`` and logs must be readable.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from outbox.access import authentication_failed, untrusted_certificate
from outbox.errors import NotAuthorizedError
from spark_sink.errors import CheckpointError, KafkaSourceError, OutputPathError, SparkJarsError
from spark_sink.jars import connector_coordinates

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from spark_sink.settings import SinkSettings


def local_path(location: str) -> Path | None:
    """The filesystem path of a local location (``/x``, ``x``, ``file:/x``), else None."""
    if location.startswith("file:"):
        return Path(re.sub(r"^file:(//)?", "", location))
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", location):
        return None
    return Path(location)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def check_writable_dir(location: str, what: str, error: type[Exception]) -> None:
    """Create ``location`` if needed and prove a file can be written in it."""
    path = local_path(location)
    if path is None:
        return
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".outbox-sink-probe-{uuid.uuid4().hex}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        reason = exc.strerror or _first_line(exc)
        raise error(f"cannot write the {what} path {location}: {reason}") from None


_CHECKPOINT_LOGS = ("offsets", "commits")


def check_checkpoint(location: str) -> None:
    """A local checkpoint must be empty or look like one Spark wrote.

    Spark finds a damaged checkpoint only when it reads it, and then reports it
    from deep inside the query thread; these checks name the bad file.
    """
    path = local_path(location)
    if path is None or not path.exists():
        return
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {location} is not a directory")
    metadata = path / "metadata"
    entries = [p for p in path.iterdir() if not p.name.startswith(".outbox-sink-probe-")]
    if not entries:
        return
    if not metadata.is_file():
        raise CheckpointError(
            f"checkpoint {location} is not empty but has no metadata file: not a checkpoint of "
            "this query, or a corrupt one; point --checkpoint at an empty directory"
        )
    try:
        loaded = json.loads(metadata.read_text().splitlines()[0])
        if not isinstance(loaded, dict) or "id" not in loaded:
            raise ValueError("no query id")
    except (OSError, ValueError, IndexError, UnicodeDecodeError) as exc:
        raise CheckpointError(
            f"checkpoint {location} is corrupt: {metadata} is unreadable ({_first_line(exc)}); "
            "restore it, or start over with an empty checkpoint and a new output path"
        ) from None
    for log in _CHECKPOINT_LOGS:
        directory = path / log
        if not directory.is_dir():
            continue
        for entry in directory.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                head = entry.read_bytes()[:64].split(b"\n", 1)[0]
            except OSError as exc:
                raise CheckpointError(
                    f"checkpoint {location} is unreadable: {entry}: {_first_line(exc)}"
                ) from None
            if not re.fullmatch(rb"v\d+", head):
                raise CheckpointError(
                    f"checkpoint {location} is corrupt: {entry} does not start with a "
                    "version line; restore it, or start over with an empty checkpoint and a "
                    "new output path"
                )


def has_entries(path: Path) -> bool:
    """Whether a directory holds anything but the sink's own write probes."""
    return path.is_dir() and any(
        not p.name.startswith(".outbox-sink-probe-") for p in path.iterdir()
    )


def check_table_belongs_to_checkpoint(output: str, checkpoint: str) -> None:
    """A fresh checkpoint must not write into a table another checkpoint wrote.

    The file sink's ``_spark_metadata`` log numbers the table's batches; a new
    query starts again at batch 0 and the sink *skips* every batch number the
    log already holds, so the first events would silently never land.
    """
    table, state = local_path(output), local_path(checkpoint)
    if table is None or state is None:
        return
    if has_entries(table / "_spark_metadata") and not (state / "metadata").is_file():
        raise CheckpointError(
            f"output {output} already holds a table written with another checkpoint, and "
            f"checkpoint {checkpoint} is new: the file sink would skip the new query's first "
            "batches. Use the checkpoint that wrote the table, or a new output path"
        )


def _java_admin_properties(settings: SinkSettings) -> dict[str, str]:
    timeout_ms = str(int(settings.kafka_timeout_seconds * 1000))
    return {
        **settings.java_kafka_properties(),
        "bootstrap.servers": settings.bootstrap_servers,
        "request.timeout.ms": timeout_ms,
        "default.api.timeout.ms": timeout_ms,
        "client.id": "outbox-sink-preflight",
    }


def _unwrapped(exception: Any) -> Any:
    """A Java future's failure without its ``ExecutionException`` wrapper."""
    if exception is not None and exception.getClass().getSimpleName() == "ExecutionException":
        return exception.getCause() or exception
    return exception


def _java_admin(jvm: Any, settings: SinkSettings) -> Any:
    """The Java client's Admin, as the Spark source will connect."""
    props = jvm.java.util.Properties()
    for key, value in _java_admin_properties(settings).items():
        props.setProperty(key, value)
    return jvm.org.apache.kafka.clients.admin.Admin.create(props)


def list_topics_with_jvm(spark: SparkSession, settings: SinkSettings) -> set[str] | None:
    """Topic names as the JVM's Kafka client sees them; None when there is no JVM (Connect)."""
    jvm: Any = getattr(spark, "_jvm", None) or getattr(spark.sparkContext, "_jvm", None)
    if jvm is None:
        return None
    from py4j.java_gateway import JavaClass
    from py4j.protocol import Py4JError, Py4JJavaError

    no_connector = SparkJarsError(
        "Spark's Kafka source is not on the classpath of the running Spark; pass "
        f"--packages {connector_coordinates()} to spark-submit"
    )
    try:
        admin_class = jvm.org.apache.kafka.clients.admin.Admin
        if not isinstance(admin_class, JavaClass):  # py4j's stand-in for an unknown class
            raise no_connector
        admin = _java_admin(jvm, settings)
    except Py4JJavaError as exc:
        message = _first_line(exc.java_exception) if exc.java_exception else _first_line(exc)
        raise KafkaSourceError(
            f"cannot reach Kafka at {settings.bootstrap_servers}: {message}"
        ) from None
    except Py4JError:
        raise no_connector from None
    try:
        unit = jvm.java.util.concurrent.TimeUnit.MILLISECONDS
        future = admin.listTopics().names()
        names = future.get(int(settings.kafka_timeout_seconds * 1000), unit)
        return {str(name) for name in names}
    except Py4JJavaError as exc:
        cause = _unwrapped(exc.java_exception)
        name = cause.getClass().getSimpleName() if cause is not None else ""
        if name == "SaslAuthenticationException":
            raise KafkaSourceError(
                authentication_failed(settings, settings.bootstrap_servers)
            ) from None
        if name == "SslAuthenticationException":
            raise KafkaSourceError(
                untrusted_certificate(settings, settings.bootstrap_servers)
            ) from None
        if name == "TimeoutException" or "Timed out" in str(cause):
            raise KafkaSourceError(
                f"Kafka at {settings.bootstrap_servers} did not answer within "
                f"{settings.kafka_timeout_seconds:g}s (are the brokers up and the address right?)"
            ) from None
        raise KafkaSourceError(
            f"cannot list the topics of Kafka at {settings.bootstrap_servers}: "
            f"{_first_line(cause) if cause is not None else _first_line(exc)}"
        ) from None
    finally:
        with contextlib.suppress(Exception):
            admin.close(jvm.java.time.Duration.ofMillis(500))


def _check_described(spark: SparkSession, settings: SinkSettings, topics: list[str]) -> None:
    """A listing leaves out the topics the user may not DESCRIBE: ask for them by name, so
    a missing ACL is not reported as a missing topic."""
    if not topics:
        return
    jvm: Any = getattr(spark, "_jvm", None) or spark.sparkContext._jvm
    from py4j.protocol import Py4JJavaError

    admin = _java_admin(jvm, settings)
    try:
        for topic in topics:
            names = jvm.java.util.Collections.singletonList(topic)
            try:
                admin.describeTopics(names).allTopicNames().get()
            except Py4JJavaError as exc:
                cause = _unwrapped(exc.java_exception)
                if cause.getClass().getSimpleName() == "TopicAuthorizationException":
                    raise KafkaSourceError(
                        str(NotAuthorizedError("DESCRIBE", f"topic {topic!r}", settings.principal))
                    ) from None
    finally:
        with contextlib.suppress(Exception):
            admin.close(jvm.java.time.Duration.ofMillis(500))


def check_kafka(spark: SparkSession, settings: SinkSettings) -> None:
    """Brokers answer and every ``--topics`` topic exists; warn when no topic matches a pattern."""
    names = list_topics_with_jvm(spark, settings)
    if names is None:
        return
    if settings.topics:
        missing = [t for t in settings.topics if t not in names]
        _check_described(spark, settings, missing)
        if missing:
            listed = ", ".join(repr(t) for t in missing)
            raise KafkaSourceError(
                f"topic {listed} does not exist on Kafka at {settings.bootstrap_servers} "
                "(create it, or use --pattern to pick up topics as they appear)"
                if len(missing) == 1
                else f"topics {listed} do not exist on Kafka at {settings.bootstrap_servers} "
                "(create them, or use --pattern to pick up topics as they appear)"
            )
    elif settings.pattern is not None:
        try:
            matcher = re.compile(settings.pattern)
        except re.error:
            return  # Java regex syntax Python lacks; Spark will judge it
        if not any(matcher.fullmatch(name) for name in names):
            print(
                f"outbox sink: warning: no topic on {settings.bootstrap_servers} matches "
                f"{settings.pattern!r} yet; topics that appear later are picked up",
                file=sys.stderr,
                flush=True,
            )


def check_paths(settings: SinkSettings) -> None:
    """Output and checkpoint writable (local ones), checkpoint intact."""
    check_writable_dir(settings.output, "output", OutputPathError)
    check_checkpoint(settings.checkpoint)
    if not settings.is_delta:  # a Delta table is checked against its own log when it starts
        check_table_belongs_to_checkpoint(settings.output, settings.checkpoint)
    check_writable_dir(settings.checkpoint, "checkpoint", CheckpointError)
    output, checkpoint = local_path(settings.output), local_path(settings.checkpoint)
    if output is not None and checkpoint is not None:
        out, ck = output.resolve(), checkpoint.resolve()
        if ck == out or out in ck.parents:
            raise CheckpointError(
                f"checkpoint {settings.checkpoint} is inside the output {settings.output}; "
                "readers of the table would see it as data: put it elsewhere"
            )
