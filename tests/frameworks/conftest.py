"""Fixtures for ``producer.transaction(...)`` inside web frameworks, as their users write it.

Each module builds one app around one producer per database (SQLite,
PostgreSQL, MariaDB), and every request in it is a transaction of its own: the tests
tell theirs apart by order id and transaction id, so the package shares one set
of outbox topics and one relay (a relay joins its consumer group in seconds; a
send takes milliseconds). What a test proves is read back from where a deployment
would see it: the op topic for the decision, the real topic for what the relay
published, the database for what was committed.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient
from sqlalchemy.orm import registry

from outbox import EndStatus, LocalTransactionState, TransactionSendResult
from outbox.admin import TopicSpec, ensure_topics, plan_topics
from outbox.protocol import RealRecord, Resolution, TopicNames
from tests.fixtures.relay import running_relay
from tests.producer.conftest import HALF_PARTITIONS, OutboxTopics
from tests.producer.test_check_back import ops_of, wait_for
from tests.sql.conftest import Database, database_on

QUIET_SECONDS = 1.0
"""How long a test waits for a publication that must not come (or a second one).

The relay publishes a committed op within milliseconds of reading it; a second
copy, or an event for a rolled-back order, would show up well within this."""


@pytest.fixture(scope="package")
def framework_topics(kafka_bootstrap: str, kafka_admin: AdminClient) -> OutboxTopics:
    """Outbox topics and an events topic for the whole package (its tests send apart)."""
    names = TopicNames(f"t{uuid.uuid4().hex[:8]}")
    real_topic = f"{names.prefix}-events"
    ensure_topics(kafka_admin, [*plan_topics(names, HALF_PARTITIONS), TopicSpec(real_topic, 2, 1)])
    return OutboxTopics(kafka_bootstrap, names, real_topic)


@pytest.fixture(scope="package")
def framework_relay(framework_topics: OutboxTopics) -> Iterator[None]:
    """The checker's relay: the only publisher of the events, as in a deployment."""
    with running_relay(framework_topics.client_config, framework_topics.names):
        yield


@pytest.fixture(
    scope="module",
    params=[
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("mariadb", marks=pytest.mark.mariadb),
    ],
)
def framework_database(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Database]:
    """A log table made by the migrations and an ``orders`` table, per module and database.

    SQLite is a file (``:memory:`` is one database per connection, and the
    frameworks open several); PostgreSQL and MariaDB are the session's servers,
    with table names of this module's own.
    """
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('framework') / 'service.db'}"
    else:
        url = request.getfixturevalue(f"{request.param}_url")
    yield from database_on(url, "sync")


def group_of(module: str, database: Database) -> str:
    """A producer group per module and database: a check-back of one module's half must
    never be answered by another module's producer, which reads another log table."""
    return f"{module}-{database.backend}"


def order_model(database: Database) -> type[Any]:
    """An ORM class on the test's ``orders`` table, as a service maps its own.

    The apps add orders through the ORM, so the rows are flushed by the commit
    itself (or by ``begin_nested``), after ``join`` put the log row in.
    """

    class Order:
        def __init__(self, id: str, transaction_id: str) -> None:
            self.id = id
            self.transaction_id = transaction_id

    registry().map_imperatively(Order, database.orders)
    return Order


def new_order_id() -> str:
    """Unique in the module's shared tables and topics."""
    return f"o-{uuid.uuid4().hex[:12]}"


def hold_id(order_id: str) -> str:
    """The row the declined endpoints write in a savepoint that is then released."""
    return f"{order_id}-hold"


def decided(topics: OutboxTopics, transaction_id: str) -> list[Resolution]:
    """The decisions written on the op topic for one transaction."""
    return [op.resolution for op in ops_of(topics) if op.transaction_id == transaction_id]


def published(topics: OutboxTopics, transaction_id: str) -> list[RealRecord]:
    """The events the relay published on the real topic for one transaction."""
    events = (RealRecord.from_record(r) for r in topics.read(topics.real_topic))
    return [event for event in events if event.transaction_id == transaction_id]


def orders_of(database: Database, order_id: str) -> dict[str, str]:
    """The committed rows of one order and of its savepoint's hold: id -> transaction id."""
    rows = database.order_rows()
    return {key: rows[key] for key in (order_id, hold_id(order_id)) if key in rows}


def assert_committed_once(
    database: Database,
    topics: OutboxTopics,
    result: TransactionSendResult | None,
    order_id: str,
) -> None:
    """COMMIT written when the block ended, the order and log rows in the database, and the
    relay's event published exactly once."""
    assert result is not None, "the outbox block never ended"
    transaction_id = result.transaction_id
    assert (result.local_transaction_state, result.end_status) == (
        LocalTransactionState.COMMIT_MESSAGE,
        EndStatus.COMMITTED,
    )
    assert decided(topics, transaction_id) == [Resolution.COMMIT]
    assert database.order_rows().get(order_id) == transaction_id
    assert transaction_id in database.log_rows()
    wait_for(lambda: len(published(topics, transaction_id)) >= 1)
    time.sleep(QUIET_SECONDS)  # a second publication would show up by now
    assert len(published(topics, transaction_id)) == 1


def assert_rolled_back(
    database: Database,
    topics: OutboxTopics,
    result: TransactionSendResult | None,
    order_id: str,
) -> None:
    """ROLLBACK written when the block ended, neither the order, its savepoint's row nor the
    log row committed, and nothing published."""
    assert result is not None, "the outbox block never ended"
    transaction_id = result.transaction_id
    assert (result.local_transaction_state, result.end_status) == (
        LocalTransactionState.ROLLBACK_MESSAGE,
        EndStatus.ROLLED_BACK,
    )
    assert decided(topics, transaction_id) == [Resolution.ROLLBACK]
    assert orders_of(database, order_id) == {}
    assert transaction_id not in database.log_rows()
    time.sleep(QUIET_SECONDS)  # the relay would have published a COMMIT by now
    assert published(topics, transaction_id) == []
