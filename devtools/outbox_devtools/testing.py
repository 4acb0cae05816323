"""pytest plugin: a real local Kafka broker for the tests of a service using the outbox.

The outbox's claims (acknowledged halves, transactions, read_committed) hold
only against a real broker, so a service's own tests should run against one
too, without Docker: this plugin starts Apache Kafka from the official jars
(:class:`~outbox_devtools.kafka.LocalKafka`; Java and, once, Maven are needed).
Enable it in a ``conftest.py``::

    pytest_plugins = ["outbox_devtools.testing"]

    def test_order_is_published(kafka_broker):
        settings = ProducerSettings(bootstrap_servers=kafka_broker.bootstrap_servers)
        ...

Fixtures:

- ``kafka_broker``: one broker the whole session shares, started on first use
  and stopped at the end (give each test its own topic prefix);
- ``own_kafka_broker``: a broker only this test uses, free to ``kill()``,
  ``stop()`` and ``restart()`` for crash tests;
- ``kafka_cluster``: three nodes (:class:`~outbox_devtools.kafka.LocalKafkaCluster`,
  three copies, ``min.insync.replicas=2``) shared by the tests of one module,
  started only in modules that ask for it. A test may kill, stop or freeze a
  node; the fixture brings every node back and waits until the replicas are in
  sync before the next test;
- ``spark_cluster``: a Spark standalone cluster
  (:class:`~outbox_devtools.spark_cluster.LocalSparkCluster`: a master and two
  one-core workers from pyspark's own jars, on loopback) shared by the tests of
  one module; submit to ``.master_url``. A test may kill a worker; the fixture
  starts a new one before the next test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from outbox_devtools.kafka import LocalKafka, LocalKafkaCluster
from outbox_devtools.spark_cluster import LocalSparkCluster


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafka]:
    """A started broker the whole session shares; ``.bootstrap_servers`` is its address."""
    yield from _started(LocalKafka(tmp_path_factory.mktemp("kafka")))


@pytest.fixture
def own_kafka_broker(tmp_path: Path) -> Iterator[LocalKafka]:
    """A started broker only this test uses: free to ``kill()``, ``stop()``, ``restart()``."""
    yield from _started(LocalKafka(tmp_path / "kafka"))


@pytest.fixture(scope="module")
def _module_kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKafkaCluster]:
    cluster = LocalKafkaCluster(tmp_path_factory.mktemp("kafka-cluster"))
    try:
        yield cluster.start()
    finally:
        cluster.close()


@pytest.fixture
def kafka_cluster(_module_kafka_cluster: LocalKafkaCluster) -> Iterator[LocalKafkaCluster]:
    """A three-node cluster this module shares; every node runs and is in sync at each test."""
    cluster = _module_kafka_cluster
    for node in cluster.nodes:
        node.thaw()
    cluster.start()  # the nodes a previous test left down
    cluster.wait_in_sync()
    yield cluster


@pytest.fixture(scope="module")
def _module_spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSparkCluster]:
    cluster = LocalSparkCluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.fixture
def spark_cluster(_module_spark_cluster: LocalSparkCluster) -> LocalSparkCluster:
    """A Spark master and two workers this module shares; both workers run at each test."""
    return _module_spark_cluster.heal()


def _started(broker: LocalKafka) -> Iterator[LocalKafka]:
    """``broker`` started, and closed afterwards even when it failed to start."""
    try:
        yield broker.start()
    finally:
        broker.close()
