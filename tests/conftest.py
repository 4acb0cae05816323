"""Shared fixtures: a real Kafka broker and a real PostgreSQL, from one of three sources.

``OUTBOX_TEST_BOOTSTRAP`` / ``OUTBOX_TEST_DATABASE_URL`` point at existing
servers; else testcontainers where a Docker engine answers; else local processes
(see :mod:`outbox_devtools`). A test that needs one and cannot get it fails, never skips.
"""

pytest_plugins = [
    "outbox_devtools.testing",
    "tests.fixtures.kafka",
    "tests.fixtures.postgres",
    "pytester",
]

LONGEST_FIRST = (
    "chaos/test_chaos_run.py",
    "chaos/test_chaos_partitions.py",
    "chaos/test_chaos_parking.py",
    "spark_sink/test_cluster.py",
    "docs/test_first_message.py",
    "demo/",
    "checker/test_cluster_failover.py",
    "checker/test_outage.py",
    "bench/",
    "spark_sink/",
    "sql/test_session_usage_model.py",
)
"""Test files that take a minute or more, longest first (the CI run's durations)."""


def pytest_collection_modifyitems(items: list) -> None:
    """Hand the longest test files out first: ``make test`` runs on two xdist workers with
    ``--dist loadfile``, which gives out files in collection order, and a long file given
    out last keeps one worker busy while the other has nothing left (longest processing
    time first). The order within a file, and of the rest, is kept (the sort is stable)."""
    root = len(str(__file__).rsplit("/", 1)[0]) + 1

    def rank(item) -> int:
        path = str(item.path)[root:]
        return next((i for i, p in enumerate(LONGEST_FIRST) if path.startswith(p)), 99)

    items.sort(key=rank)
