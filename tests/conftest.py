"""Shared fixtures: a real Kafka broker and a real PostgreSQL, from one of three sources.

A real MariaDB too, for MySQL's protocol: ``OUTBOX_TEST_MYSQL_URL`` or a local server.

``OUTBOX_TEST_BOOTSTRAP`` / ``OUTBOX_TEST_DATABASE_URL`` point at existing
servers; else testcontainers where a Docker engine answers; else local processes
(see :mod:`outbox_devtools`). A test that needs one and cannot get it fails, never skips.
"""

pytest_plugins = [
    "outbox_devtools.testing",
    "tests.fixtures.kafka",
    "tests.fixtures.postgres",
    "tests.fixtures.mariadb",
    "tests.scheduling",
    "pytester",
]
