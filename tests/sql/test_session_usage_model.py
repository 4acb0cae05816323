"""Generated ways of using a SQLAlchemy session around ``producer.transaction(...)``.

The decision of a joined send must follow the database, whatever the service's
code does with its session (savepoints, errors, commits through the connection
or an outer transaction, the block ending before the commit...). Hypothesis
generates such programs (:mod:`tests.sql.session_usage`), plays each on the
real broker and database, sync and asyncio, SQLite and PostgreSQL, and checks:
a send is published exactly once iff its row is committed, never otherwise,
the check-back included.

``OUTBOX_MODEL_EXAMPLES`` sets the examples per variant: a short,
derandomised run in the suite; ``make model`` runs a long one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, example, given, settings

from tests.producer.conftest import OutboxTopics
from tests.sql.conftest import Database
from tests.sql.session_usage import KNOWN, Harness, Usage, usages

pytestmark = pytest.mark.kafka

EXAMPLES = int(os.environ.get("OUTBOX_MODEL_EXAMPLES", "40"))
SHORT = EXAMPLES <= 40
"""The suite's run is the same every time (derandomised, no example database);
the long one searches afresh and keeps what it found."""
SQLITE_SHARE = 4
"""SQLite runs a quarter of the examples: a send whose transaction is still open when
its block ends costs the read-back's wait for the write lock (about a second, by
design), where PostgreSQL answers at once."""


SHARED_BACKENDS = ("sqlite", "mysql", "mariadb")
"""MySQL runs SQLite's share too, to keep the suite's time: its joined rollbacks are left
to the check-back until InnoDB's own evidence is read, so its sends cost a check-back."""


def examples_for(backend: str) -> int:
    return max(1, EXAMPLES // SQLITE_SHARE) if backend in SHARED_BACKENDS else EXAMPLES


@pytest.fixture
def harness(database: Database, outbox_topics: OutboxTopics, relay: None) -> Iterator[Harness]:
    """A started producer of the database's form on the test's topics, the relay running."""
    producer = database.producer(database.listener(), outbox_topics.settings())
    producer.start()
    made = Harness(database, outbox_topics, producer)
    try:
        yield made
    finally:
        producer.shutdown()
        made.close()


@pytest.mark.filterwarnings("ignore::sqlalchemy.exc.SAWarning")  # the programs' own misuse
@pytest.mark.timeout(300 if SHORT else 120 + 2 * EXAMPLES)
def test_each_way_of_using_the_session_publishes_exactly_the_committed_sends(
    harness: Harness,
) -> None:
    """Per example: each decision against the database; at the end: the topics end to end.

    The ``@given`` function is inside the test so that the harness (a producer,
    a database, topics) lives across examples: the end-to-end check covers every
    send of the run.
    """

    @settings(
        max_examples=examples_for(harness.backend),
        deadline=None,
        derandomize=SHORT,
        database=None if SHORT else settings.default.database,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        print_blob=not SHORT,
    )
    @given(usage=usages(harness.backend, harness.form))
    def play(usage: Usage) -> None:
        harness.play(usage)

    for known in KNOWN.values():  # the review's cases run first, every time
        play = example(usage=known)(play)
    try:
        play()
    finally:
        if harness.first_violation:
            print(harness.first_violation)  # shown with the failure: how soon it was found
    harness.settle()
