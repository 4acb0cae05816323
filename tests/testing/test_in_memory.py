"""The in-memory producers (:mod:`outbox.testing`) run the real producers' scenario table.

No broker: these rows are the ones ``tests/producer/test_scenarios.py`` runs on a
real broker with the relay, and must give the same results, ops, publications
and errors. Below them, what only the double has: shared brokers, unavailable
topics, its bad input, and the pytest fixture a service's tests get.
"""

from __future__ import annotations

from typing import Any

import pytest

from outbox import (
    EndStatus,
    HalfWriteError,
    ListenerMissingError,
    LocalTransactionState,
    Message,
    ProducerClosedError,
    ProducerNotStartedError,
    ProducerSettings,
)
from outbox.errors import ConfigurationError, EndTransactionError
from outbox.protocol import InvalidNameError, OpRecord, RawRecord, TopicNames
from outbox.testing import (
    InMemoryAsyncTransactionProducer,
    InMemoryBroker,
    InMemoryTransactionProducer,
)
from tests.producer import scenarios
from tests.producer.conftest import OnLoop, ScriptedListener

COMMIT = LocalTransactionState.COMMIT_MESSAGE
REAL_TOPIC = "orders-events"


class MemoryWorld:
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.names = TopicNames("outbox")
        self.real_topic = REAL_TOPIC
        self.broker = InMemoryBroker({REAL_TOPIC: scenarios.REAL_PARTITIONS}, half_partitions=3)
        self._made: list[Any] = []

    def unstarted(self, listener: Any, settings: dict[str, Any] | None = None, **others: Any):
        config = ProducerSettings(bootstrap_servers="in-memory:0", **(settings or {}))
        if self.kind == "sync":
            made: Any = InMemoryTransactionProducer(
                "orders", listener, config, broker=self.broker, **others
            )
        else:
            made = OnLoop(
                "orders",
                listener,
                config,
                producer_class=InMemoryAsyncTransactionProducer,
                broker=self.broker,
                **others,
            )
        self._made.append(made)
        return made

    def producer(self, listener: ScriptedListener, **options: Any) -> Any:
        settings = {k: v for k, v in options.items() if k in ProducerSettings.model_fields}
        others = {k: v for k, v in options.items() if k not in settings}
        return self.unstarted(listener, settings, **others).start()

    def ops(self) -> list[OpRecord]:
        return [OpRecord.from_record(r) for r in self.broker.records(self.names.op)]

    def published(self) -> list[RawRecord]:
        return self.broker.published(self.real_topic)

    def check_back(self, producer: Any, listener: ScriptedListener) -> None:
        producer.check_back()

    def close(self) -> None:
        for producer in self._made:
            producer.shutdown()
            if isinstance(producer, OnLoop):
                producer.close_loop()


@pytest.fixture(params=["sync", "async"])
def world(request: pytest.FixtureRequest):
    made = MemoryWorld(request.param)
    yield made
    made.close()


class TestScenarioTable(scenarios.ScenarioTable):
    """The shared rows, on this module's ``world``."""


# ---------------------------------------------------------------------- the double's own


def test_a_half_written_to_an_unavailable_topic_fails_and_runs_nothing(world: MemoryWorld):
    listener = ScriptedListener()
    producer = world.producer(listener)
    world.broker.make_unavailable(world.names.half)
    with pytest.raises(HalfWriteError, match="not stored"):
        producer.send_message_in_transaction(Message(REAL_TOPIC, b"v"), COMMIT)
    assert listener.executed == []


def test_an_unavailable_op_topic_fails_the_end_and_check_back_resolves_it(world: MemoryWorld):
    producer = world.producer(ScriptedListener(check_answer=COMMIT))
    world.broker.make_unavailable(world.names.op)
    result = producer.send_message_in_transaction(Message(REAL_TOPIC, b"v"), COMMIT)
    assert result.end_status is EndStatus.FAILED
    assert isinstance(result.end_error, EndTransactionError)
    assert world.published() == []
    world.broker.make_unavailable(world.names.op, False)
    assert producer.check_back() == {result.transaction_id: COMMIT}
    assert [r.value for r in world.published()] == [b"v"]
    assert producer.check_back() == {}  # decided: never asked again


def test_the_first_decision_of_a_half_wins(world: MemoryWorld):
    """A check answer after the own ROLLBACK publishes nothing (the relay keeps the first)."""
    producer = world.producer(ScriptedListener(check_answer=COMMIT))
    producer.send_message_in_transaction(Message(REAL_TOPIC, b"v"), scenarios.ROLLBACK)
    assert producer.check_back() == {}
    assert world.published() == []


def test_check_back_of_one_transaction_asks_only_about_it(world: MemoryWorld):
    listener = ScriptedListener(check_answer=COMMIT)
    producer = world.producer(listener)
    first = producer.send_message_in_transaction(Message(REAL_TOPIC, b"1"), scenarios.UNKNOW)
    producer.send_message_in_transaction(Message(REAL_TOPIC, b"2"), scenarios.UNKNOW)
    assert producer.check_back(first.transaction_id) == {first.transaction_id: COMMIT}
    assert [m.value for m in listener.checked] == [b"1"]
    assert listener.checked[0].check_times == 1


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"topics": {"bad topic": 1}}, ConfigurationError, "topic"),
        ({"topics": {"t": 0}}, ConfigurationError, "partitions must be an int >= 1"),
        ({"topics": {"t": "2"}}, ConfigurationError, "partitions must be an int >= 1"),
        ({"half_partitions": 0}, ConfigurationError, "half_partitions must be an int >= 1"),
        ({"half_partitions": True}, ConfigurationError, "half_partitions must be an int >= 1"),
    ],
)
def test_bad_broker(kwargs, error, match):
    with pytest.raises(error, match=match):
        InMemoryBroker(**kwargs)


@pytest.mark.parametrize(
    "producer_class", [InMemoryTransactionProducer, InMemoryAsyncTransactionProducer]
)
def test_bad_producer_arguments(producer_class):
    with pytest.raises(ListenerMissingError):
        producer_class("g", None)
    with pytest.raises(InvalidNameError, match="producer group"):
        producer_class("bad group", ScriptedListener())
    with pytest.raises(ConfigurationError, match="broker must be an InMemoryBroker"):
        producer_class("g", _async_or_sync(producer_class), broker="localhost:9092")
    with pytest.raises(ConfigurationError, match="value_serializer must be"):
        producer_class("g", _async_or_sync(producer_class), value_serializer="json")


def test_check_back_and_transaction_need_a_running_producer(world: MemoryWorld):
    producer = world.unstarted(ScriptedListener())
    with pytest.raises(ProducerNotStartedError, match="start"):
        producer.check_back()
    with pytest.raises(ProducerNotStartedError, match="start"):
        _enter(producer)
    producer.start()
    producer.shutdown()
    with pytest.raises(ProducerClosedError, match="shut down"):
        producer.check_back()
    with pytest.raises(ProducerClosedError, match="shut down"):
        _enter(producer)


def _enter(producer: Any) -> None:
    """Enter ``producer.transaction(...)`` as its kind does (``with`` or ``async with``)."""
    if isinstance(producer, OnLoop):

        async def enter() -> None:
            async with producer.producer.transaction(Message(REAL_TOPIC, b"v")):
                pytest.fail("the block must not run")

        producer.loop.run(enter())
        return
    with producer.transaction(Message(REAL_TOPIC, b"v")):
        pytest.fail("the block must not run")


def _async_or_sync(producer_class: type) -> Any:
    if producer_class is InMemoryTransactionProducer:
        return ScriptedListener()
    from tests.producer.conftest import Awaited

    return Awaited(ScriptedListener())


def test_the_fixture_is_registered_for_any_service(pytester: pytest.Pytester):
    """A service's test gets ``outbox_in_memory_producer`` through the pytest11 entry point."""
    pytester.makepyfile(
        """
        from outbox import LocalTransactionState, Message

        class Listener:
            def execute_local_transaction(self, message, arg):
                return LocalTransactionState.COMMIT_MESSAGE

            def check_local_transaction(self, message):
                return LocalTransactionState.COMMIT_MESSAGE

        def test_service(outbox_in_memory_producer):
            producer = outbox_in_memory_producer(Listener())
            producer.send_message_in_transaction(Message("orders", b"placed"))
            assert [r.value for r in producer.broker.published("orders")] == [b"placed"]
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_the_callers_transaction_on_sqlite_needs_no_broker(tmp_path):
    """``producer.transaction(...)`` on the double: a service's request handler, tested alone."""
    import sqlalchemy as sa
    from sqlalchemy.orm import Session, sessionmaker

    from outbox.sql import SqlTransactionListener, create_engine, upgrade

    engine = create_engine(f"sqlite:///{tmp_path / 'orders.db'}")
    upgrade(engine)
    listener = SqlTransactionListener(sessionmaker(engine), None, group="orders")
    producer = InMemoryTransactionProducer("orders", listener).start()
    try:
        with pytest.raises(RuntimeError), producer.transaction(Message("orders", b"o-1")) as kept:
            with Session(engine) as session, session.begin():
                session.execute(sa.text("SELECT 1"))
                kept.join(session)
            raise RuntimeError("after the commit: the event is kept")
        with producer.transaction(Message("orders", b"o-2")) as dropped, Session(engine) as session:
            dropped.join(session)
            session.rollback()
        assert (kept.result.end_status, dropped.result.end_status) == (
            EndStatus.COMMITTED,
            EndStatus.ROLLED_BACK,
        )
        assert [r.value for r in producer.broker.published("orders")] == [b"o-1"]
        # The check-back answers from the same log: the committed row is there.
        assert listener.check_local_transaction(kept.message) is COMMIT
    finally:
        producer.shutdown()
        engine.dispose()
