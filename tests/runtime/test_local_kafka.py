"""The local Kafka runtime against a real broker: clients, transactions, crashes, CLI."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from outbox.config import kafka_client_config
from outbox_devtools import processes
from outbox_devtools.kafka import (
    KAFKA_VERSION,
    QUICK_JIT_VARIABLE,
    TEMPLATE_CLUSTER_ID,
    KafkaRuntimeError,
    LocalKafka,
    ensure_kafka_jars,
    kafka_home,
    stop_recorded,
)

pytestmark = pytest.mark.kafka


def create_topic(bootstrap: str, name: str, partitions: int = 1) -> None:
    admin = AdminClient(kafka_client_config(bootstrap))
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)


def produce(bootstrap: str, topic: str, *values: bytes) -> None:
    producer = Producer(kafka_client_config(bootstrap, {"acks": "all"}))
    for value in values:
        producer.produce(topic, value)
    assert producer.flush(30) == 0


def consume(
    bootstrap: str, topic: str, until: bytes, isolation: str = "read_committed"
) -> list[bytes]:
    """Every value from the start of ``topic`` up to and including ``until``."""
    consumer = Consumer(
        kafka_client_config(
            bootstrap,
            {
                "group.id": f"g{uuid.uuid4().hex[:8]}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "isolation.level": isolation,
            },
        )
    )
    consumer.subscribe([topic])
    seen: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        while until not in seen and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            seen.append(message.value())
    finally:
        consumer.close()
    assert until in seen, f"{until!r} not read from {topic} within 60s; got {seen}"
    return seen


# ------------------------------------------------------------ shared broker


def test_produce_and_consume(kafka_bootstrap: str, unique_prefix: str) -> None:
    topic = f"{unique_prefix}.plain"
    create_topic(kafka_bootstrap, topic)
    produce(kafka_bootstrap, topic, b"hello")
    assert consume(kafka_bootstrap, topic, until=b"hello") == [b"hello"]


def test_transactions_commit_and_abort_on_a_single_node(
    kafka_bootstrap: str, unique_prefix: str
) -> None:
    """Needs the transaction-state topic at replication 1 / min ISR 1 to work at all."""
    topic = f"{unique_prefix}.tx"
    create_topic(kafka_bootstrap, topic)
    producer = Producer(
        kafka_client_config(kafka_bootstrap, {"transactional.id": f"{unique_prefix}-tx"})
    )
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce(topic, b"aborted")
    assert producer.flush(30) == 0  # else abort just drops it from the client queue
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, b"committed")
    producer.commit_transaction(30)
    del producer

    assert consume(kafka_bootstrap, topic, until=b"committed") == [b"committed"]
    everything = consume(kafka_bootstrap, topic, until=b"committed", isolation="read_uncommitted")
    assert everything == [b"aborted", b"committed"]


def test_kafka_admin_and_unique_prefix_fixtures(
    kafka_admin: AdminClient, unique_prefix: str
) -> None:
    assert kafka_admin.list_topics(timeout=10).brokers
    assert unique_prefix.startswith("t") and len(unique_prefix) == 9


# ------------------------------------------------------------- own brokers


def test_restart_keeps_address_and_data(own_kafka_broker: LocalKafka) -> None:
    broker = own_kafka_broker
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, "kept")
    produce(bootstrap, "kept", b"before restart")
    first_pid = broker.pid

    broker.restart()

    assert broker.bootstrap_servers == bootstrap
    assert broker.pid != first_pid
    assert not processes.pid_alive(first_pid or 0)
    produce(bootstrap, "kept", b"after restart")
    assert consume(bootstrap, "kept", until=b"after restart") == [
        b"before restart",
        b"after restart",
    ]


def test_the_suites_brokers_compile_with_the_quick_jit_only(own_kafka_broker: LocalKafka) -> None:
    """tests/conftest.py asks for it; a broker started without the variable has both JITs."""
    argv = Path(f"/proc/{own_kafka_broker.pid}/cmdline").read_bytes().split(b"\0")
    assert b"-XX:TieredStopAtLevel=1" in argv


def test_a_quick_jit_value_other_than_0_or_1_is_refused_naming_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(QUICK_JIT_VARIABLE, "yes")
    broker = LocalKafka(tmp_path / "kafka")
    with pytest.raises(KafkaRuntimeError, match=rf"{QUICK_JIT_VARIABLE}='yes': use 1"):
        broker.start()
    assert not broker.is_running()


def test_kill_then_start_recovers(own_kafka_broker: LocalKafka) -> None:
    broker = own_kafka_broker
    bootstrap = broker.bootstrap_servers
    create_topic(bootstrap, "crash")
    produce(bootstrap, "crash", b"before crash")
    pid = broker.pid
    assert pid is not None

    broker.kill()

    assert not broker.is_running()
    assert not processes.pid_alive(pid)
    broker.start()
    produce(bootstrap, "crash", b"after crash")
    assert consume(bootstrap, "crash", until=b"after crash") == [b"before crash", b"after crash"]


def test_a_clean_stop_leaves_a_class_archive_the_next_broker_maps(tmp_path: Path) -> None:
    """The first broker writes the archive as it stops; a killed one leaves nothing behind.

    Over jars of their own (links to the cached ones), so that the archive is this test's."""
    libs = tmp_path / "libs"
    libs.mkdir()
    for jar in ensure_kafka_jars().iterdir():
        (libs / jar.name).symlink_to(jar)

    killed = LocalKafka(tmp_path / "killed", libs_dir=libs).start()
    killed.kill()
    assert list(tmp_path.glob("*.jsa*")) == [], "a killed broker left an archive"

    first = LocalKafka(tmp_path / "first", libs_dir=libs).start()
    first.stop()
    (archive,) = tmp_path.glob("*.jsa*")  # the archive alone, no launch's own part
    assert archive.name.startswith("classes-") and archive.suffix == ".jsa"

    second = LocalKafka(tmp_path / "second", libs_dir=libs).start()
    try:
        assert second.pid is not None
        assert str(archive) in Path(f"/proc/{second.pid}/maps").read_text()
    finally:
        second.stop()


def test_single_node_settings_are_written(tmp_path: Path) -> None:
    props = LocalKafka(tmp_path).server_properties()
    assert props["process.roles"] == "broker,controller"
    assert props["transaction.state.log.min.isr"] == "1"
    assert props["transaction.state.log.replication.factor"] == "1"
    assert props["offsets.topic.replication.factor"] == "1"
    assert props["auto.create.topics.enable"] == "false"
    assert props["log.dirs"].startswith(str(tmp_path))


def test_plain_nodes_copy_their_formatted_storage_from_one_template(tmp_path: Path) -> None:
    """Formatting is a JVM run of its own (1-2 s a node); a plain node copies it instead."""
    first, second = LocalKafka(tmp_path / "a"), LocalKafka(tmp_path / "b")
    first.prepare()
    second.prepare()
    meta = (first.data_dir / "meta.properties").read_text()
    assert meta == (second.data_dir / "meta.properties").read_text()
    assert f"cluster.id={TEMPLATE_CLUSTER_ID}" in meta.splitlines()
    assert first.server_properties()["controller.quorum.voters"] == (
        f"1@127.0.0.1:{first.controller_port}"
    )


# --------------------------------------------------------- failing starts


def test_empty_libs_dir_is_named(tmp_path: Path) -> None:
    empty = tmp_path / "empty-libs"
    empty.mkdir()
    with pytest.raises(KafkaRuntimeError, match="no Kafka broker jars") as info:
        LocalKafka(tmp_path / "work", libs_dir=empty).start()
    assert str(empty) in str(info.value)


def test_taken_port_is_named(tmp_path: Path) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        with pytest.raises(KafkaRuntimeError, match=f"port {port} .*already in use"):
            LocalKafka(tmp_path, port=port).start()


def test_jvm_that_exits_fails_fast_with_its_log(tmp_path: Path) -> None:
    """Its exit and its log, not the start timeout waited out (600 s here: a wait that
    long fails the test by its own timeout)."""
    broker = LocalKafka(tmp_path, heap="lots", start_timeout=600)
    with pytest.raises(KafkaRuntimeError, match="exited with code") as info:
        broker.start()
    assert "Invalid maximum heap size" in str(info.value)
    assert not broker.is_running()


def test_missing_maven_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUTBOX_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no mvn on it
    with pytest.raises(KafkaRuntimeError, match=r"Maven \('mvn'\) is not on PATH"):
        ensure_kafka_jars()


# ------------------------------------------------------------------- jars


def test_jars_are_cached_and_an_incomplete_cache_is_resolved_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    libs = ensure_kafka_jars()
    assert (libs / f"kafka_2.13-{KAFKA_VERSION}.jar").is_file()
    assert list(libs.glob("log4j-slf4j-impl-*.jar")), "the broker would log nothing"

    monkeypatch.setenv("OUTBOX_CACHE_DIR", str(tmp_path))
    copy = kafka_home()
    copy.mkdir(parents=True)
    shutil.copytree(libs, copy / "libs")
    shutil.copy(libs.parent / "resolved.txt", copy / "resolved.txt")
    assert ensure_kafka_jars() == copy / "libs"  # complete: used as is

    (copy / "libs" / f"kafka-clients-{KAFKA_VERSION}.jar").unlink()
    assert ensure_kafka_jars() == copy / "libs"
    assert (copy / "libs" / f"kafka-clients-{KAFKA_VERSION}.jar").is_file()


# -------------------------------------------------------------------- CLI


def outbox(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from outbox_cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )


@pytest.fixture
def dev_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Environment with a private OUTBOX_DEV_HOME; stops any broker left recorded there."""
    env = dict(os.environ, OUTBOX_DEV_HOME=str(tmp_path / "dev"))
    yield env
    state = tmp_path / "dev" / "kafka.json"
    if state.is_file():
        stop_recorded(json.loads(state.read_text()), 10)


def test_cli_start_status_stop(dev_env: dict[str, str]) -> None:
    assert outbox("dev", "kafka", "status", env=dev_env).returncode == 1

    started = outbox("dev", "kafka", "start", env=dev_env)
    assert started.returncode == 0, started.stderr
    last_line = started.stdout.strip().splitlines()[-1]
    assert last_line.startswith("bootstrap: 127.0.0.1:")
    bootstrap = last_line.removeprefix("bootstrap: ")
    state = json.loads((Path(dev_env["OUTBOX_DEV_HOME"]) / "kafka.json").read_text())
    pid = int(state["pid"])
    assert AdminClient(kafka_client_config(bootstrap)).list_topics(timeout=10).brokers

    status = outbox("dev", "kafka", "status", env=dev_env)
    assert status.returncode == 0
    assert f"bootstrap: {bootstrap}" in status.stdout

    # The library's commands find the tooling's broker (kafka_outbox.bootstrap).
    no_bootstrap = {k: v for k, v in dev_env.items() if k != "OUTBOX_BOOTSTRAP_SERVERS"}
    created = outbox("topics", "create", "--partitions", "1", "--prefix", "devb", env=no_bootstrap)
    assert created.returncode == 0, created.stderr
    assert "devb.half" in AdminClient(kafka_client_config(bootstrap)).list_topics(timeout=10).topics

    again = outbox("dev", "kafka", "start", env=dev_env)
    assert again.returncode == 0
    assert "already running" in again.stderr
    assert again.stdout.strip().splitlines()[-1] == f"bootstrap: {bootstrap}"

    stopped = outbox("dev", "kafka", "stop", env=dev_env)
    assert stopped.returncode == 0, stopped.stderr
    assert not processes.pid_alive(pid)
    assert outbox("dev", "kafka", "status", env=dev_env).returncode == 1


@pytest.mark.long_proof  # test_cli_start_status_stop's cluster variant; chaos runs the cluster
def test_cli_start_status_stop_a_three_node_cluster(dev_env: dict[str, str]) -> None:
    started = outbox("dev", "kafka", "start", "--brokers", "3", env=dev_env)
    assert started.returncode == 0, started.stderr
    assert "cluster of 3 nodes started in" in started.stderr
    bootstrap = started.stdout.strip().splitlines()[-1].removeprefix("bootstrap: ")
    assert len(bootstrap.split(",")) == 3
    state = json.loads((Path(dev_env["OUTBOX_DEV_HOME"]) / "kafka.json").read_text())
    pids = [int(pid) for pid in state["pids"]]
    assert len(set(pids)) == 3 and state["nodes"] == 3
    metadata = AdminClient(kafka_client_config(bootstrap)).list_topics(timeout=10)
    assert sorted(metadata.brokers) == [1, 2, 3]

    status = outbox("dev", "kafka", "status", env=dev_env)
    assert status.returncode == 0
    assert "3 of 3 nodes" in status.stdout and f"bootstrap: {bootstrap}" in status.stdout

    processes.kill_pid(pids[0])  # one node down: the cluster still runs
    status = outbox("dev", "kafka", "status", env=dev_env)
    assert status.returncode == 0 and "2 of 3 nodes" in status.stdout

    stopped = outbox("dev", "kafka", "stop", env=dev_env)
    assert stopped.returncode == 0, stopped.stderr
    assert not any(processes.pid_alive(pid) for pid in pids)
    assert outbox("dev", "kafka", "status", env=dev_env).returncode == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--brokers", "0"), "error: a local Kafka runs 1 node or a cluster of 3 to 5, not 0"),
        (("--nodes", "2"), "not 2 (two voters lose their quorum"),
        (("--nodes", "3", "--port", "9092"), "--port sets one node's port"),
    ],
)
def test_cli_refuses_node_counts_it_cannot_run(
    dev_env: dict[str, str], args: tuple[str, ...], message: str
) -> None:
    result = outbox("dev", "kafka", "start", *args, env=dev_env)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (Path(dev_env["OUTBOX_DEV_HOME"]) / "kafka.json").exists()


def test_cli_stop_when_not_running(dev_env: dict[str, str]) -> None:
    result = outbox("dev", "kafka", "stop", env=dev_env)
    assert result.returncode == 0
    assert "not running" in result.stdout


def test_cli_start_on_taken_port_names_it(dev_env: dict[str, str]) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        result = outbox("dev", "kafka", "start", "--port", str(port), env=dev_env)
    assert result.returncode == 1
    assert f"port {port}" in result.stderr and "already in use" in result.stderr
    assert not (Path(dev_env["OUTBOX_DEV_HOME"]) / "kafka.json").exists()


def test_cli_fetch_prints_the_libs_dir(dev_env: dict[str, str]) -> None:
    result = outbox("dev", "kafka", "fetch", env=dev_env)
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()) == ensure_kafka_jars()
