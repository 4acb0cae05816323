"""Shared fixtures: a real Kafka broker and a real PostgreSQL, from one of three sources.

A real MariaDB too, for MySQL's protocol: ``OUTBOX_TEST_MYSQL_URL`` or a local server.

``OUTBOX_TEST_BOOTSTRAP`` / ``OUTBOX_TEST_DATABASE_URL`` point at existing
servers; else testcontainers where a Docker engine answers; else local processes
(see :mod:`outbox_devtools`). A test that needs one and cannot get it fails, never skips.
"""

import os

from outbox_devtools.kafka import QUICK_JIT_VARIABLE

pytest_plugins = [
    "outbox_devtools.testing",
    "tests.fixtures.kafka",
    "tests.fixtures.postgres",
    "tests.fixtures.mariadb",
    "tests.scheduling",
    "pytester",
]


def pytest_configure(config) -> None:
    """The suite's local brokers compile with the quick JIT only (see
    :data:`outbox_devtools.kafka.QUICK_JIT_VARIABLE`): its brokers live seconds to minutes.
    Set here, it reaches every worker and every process a test starts (``outbox chaos``)."""
    os.environ.setdefault(QUICK_JIT_VARIABLE, "1")
