"""librdkafka's own log lines go through Python ``logging``, never raw onto stderr.

Without a ``logger`` property librdkafka writes ``%3|1700000000.123|FAIL|...``
lines straight to file descriptor 2: past any handler, level or format the
program chose, and onto the demo's and the tests' screens. Every client the
outbox builds takes its configuration from :func:`outbox.config.kafka_client_config`
(``KafkaSettings.client_config`` included). The clients here talk to an
address nobody listens on, so librdkafka has connection failures to report.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from outbox.config import KAFKA_LOGGER_NAME, KafkaSettings, kafka_client_config

DEAD = "127.0.0.1:1"


def producer() -> Callable[[], None]:
    client = Producer(KafkaSettings(bootstrap_servers=DEAD).client_config())
    return lambda: client.poll(0.1)


def consumer() -> Callable[[], None]:
    client = Consumer(
        KafkaSettings(bootstrap_servers=DEAD).client_config(**{"group.id": uuid.uuid4().hex})
    )
    client.subscribe(["anything"])
    return lambda: client.poll(0.1)


def admin() -> Callable[[], None]:
    client = AdminClient(kafka_client_config(DEAD))
    return lambda: client.poll(0.1)


@pytest.mark.parametrize("client", [producer, consumer, admin])
def test_librdkafka_logs_reach_logging_not_stderr(
    client: Callable[[], Callable[[], Any]],
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=KAFKA_LOGGER_NAME)
    poll = client()
    deadline = time.monotonic() + 20
    while not any("Connection refused" in r.getMessage() for r in caplog.records):
        assert time.monotonic() < deadline, "librdkafka logged no connection failure"
        poll()
    failure = next(r for r in caplog.records if "Connection refused" in r.getMessage())
    assert failure.name == KAFKA_LOGGER_NAME
    assert failure.levelno == logging.ERROR  # librdkafka's level 3, mapped by confluent-kafka
    raw = [line for line in capfd.readouterr().err.splitlines() if line.startswith("%")]
    assert raw == []
