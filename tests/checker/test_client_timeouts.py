"""The checker's Kafka clients give up on a node that takes connections and never answers."""

from __future__ import annotations

import logging
import re
import socket
import time

import pytest
from confluent_kafka.admin import AdminClient

from outbox.config import KAFKA_LOGGER_NAME
from outbox_checker.settings import CheckerSettings


def _first_version_request_failure(settings: CheckerSettings, caplog, seconds: float) -> str:
    """The client's log line about its first ApiVersion request failing, polled for."""
    admin = AdminClient(settings.client_config())
    deadline = time.monotonic() + seconds
    with caplog.at_level(logging.INFO, logger=KAFKA_LOGGER_NAME):
        while time.monotonic() < deadline:
            admin.poll(0.2)
            for record in caplog.records:
                if "ApiVersionRequest failed" in record.getMessage():
                    return record.getMessage()
    pytest.fail(f"no ApiVersion request failed within {seconds}s")


def test_a_checker_client_gives_up_on_a_silent_node_after_three_seconds(caplog):
    # A frozen broker (SIGSTOP) or one behind a dead link: the kernel still completes the
    # TCP handshake, so the client's first request (ApiVersion) is what waits. librdkafka
    # waits 10 s for it; a fresh relay producer spent those 10 s on a frozen coordinator.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        settings = CheckerSettings(bootstrap_servers=f"127.0.0.1:{port}", http_address="")
        line = _first_version_request_failure(settings, caplog, seconds=15)
    waited = re.search(r"after (\d+)ms", line)
    assert waited is not None, line
    assert 3_000 <= int(waited.group(1)) < 6_000, line


def test_pass_through_properties_set_the_client_timeouts_otherwise():
    settings = CheckerSettings(
        bootstrap_servers="127.0.0.1:9092",
        kafka_properties={"api.version.request.timeout.ms": "10000"},
    )
    assert settings.client_config()["api.version.request.timeout.ms"] == "10000"
    assert (
        CheckerSettings(bootstrap_servers="127.0.0.1:9092").client_config()[
            "api.version.request.timeout.ms"
        ]
        == 3_000
    )
