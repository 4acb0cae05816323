"""librdkafka's own log lines go through Python ``logging``, never raw onto stderr.

Without a ``logger`` property librdkafka writes ``%3|1700000000.123|FAIL|...``
lines straight to file descriptor 2: past any handler, level or format the
program chose, and onto the demo's and the tests' screens. Every client the
outbox builds takes its configuration from :func:`outbox.config.kafka_client_config`
(``KafkaSettings.client_config`` included). The clients here talk to an
address nobody listens on, so librdkafka has connection failures to report; a
line repeated by any client is held back for a while (issue 39's outage flood).
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
from outbox.kafka_log import RepeatedLineFilter, line_shape
from outbox_devtools.processes import free_port


def dead() -> str:
    """An address nobody listens on, a new one per client: a repeated line is held back."""
    return f"127.0.0.1:{free_port()}"


def producer() -> Callable[[], None]:
    client = Producer(KafkaSettings(bootstrap_servers=dead()).client_config())
    return lambda: client.poll(0.1)


def consumer() -> Callable[[], None]:
    client = Consumer(
        KafkaSettings(bootstrap_servers=dead()).client_config(**{"group.id": uuid.uuid4().hex})
    )
    client.subscribe(["anything"])
    return lambda: client.poll(0.1)


def admin() -> Callable[[], None]:
    client = AdminClient(kafka_client_config(dead()))
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


REFUSED = (
    "[rdkafka#consumer-{client}] [thrd:127.0.0.1:{port}/1]: 127.0.0.1:{port}/1: Connect to"
    " ipv4#127.0.0.1:{port} failed: Connection refused (after {ms}ms in state CONNECT)"
)


def refused(client: int = 3, port: int = 9092, ms: int = 0) -> logging.LogRecord:
    """One librdkafka connection failure as confluent-kafka logs it."""
    message = REFUSED.format(client=client, port=port, ms=ms)
    return logging.LogRecord(
        KAFKA_LOGGER_NAME, logging.ERROR, "", 0, "%s %s", ("FAIL", message), None
    )


def test_a_repeated_line_from_any_client_is_held_back_then_shown_with_its_count() -> None:
    now = [0.0]
    repeats = RepeatedLineFilter(window=30.0, clock=lambda: now[0])
    assert repeats.filter(refused(client=3))
    now[0] = 0.05
    assert not repeats.filter(refused(client=3, ms=1))  # the next retry, 50 ms later
    assert not repeats.filter(refused(client=11))  # another client, the same failure
    now[0] = 30.0
    again = refused(client=5)
    assert repeats.filter(again)
    assert again.getMessage().endswith("(2 more like it since last shown)")
    now[0] = 31.0
    assert not repeats.filter(refused())


def test_what_differs_is_shown_at_once() -> None:
    repeats = RepeatedLineFilter(clock=lambda: 0.0)
    assert repeats.filter(refused(port=9092))
    assert repeats.filter(refused(port=9093))  # another broker down: said too
    warning = refused()
    warning.levelno = logging.WARNING
    assert repeats.filter(warning)  # another level
    assert line_shape("after 6008 ms without") == line_shape("after 12 ms without")


def test_a_debug_trace_is_never_held_back() -> None:
    repeats = RepeatedLineFilter(clock=lambda: 0.0)
    for _ in range(3):
        trace = refused()
        trace.levelno = logging.DEBUG
        assert repeats.filter(trace)
