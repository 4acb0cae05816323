"""One table of send scenarios, run on the real producer (real broker, relay) and on the
in-memory one (:mod:`outbox.testing`): where the double is meant to behave as the
real producer, the same rows must give the same results, ops, publications and errors.

A *world* is where a scenario runs: it makes started producers of one kind
(sync or asyncio face), and reads back the decision ops and what reached the
real topic once everything decided has been relayed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import pytest
from confluent_kafka.serialization import StringSerializer

from outbox import (
    EndStatus,
    InvalidMessageError,
    LocalTransactionState,
    Message,
    MessageTooLargeError,
    ProducerClosedError,
    ProducerNotStartedError,
)
from outbox.protocol import OpRecord, RawRecord, Resolution, TopicNames, is_reserved
from outbox.serialization import MessageSerializationError
from tests.producer.conftest import ScriptedListener

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW
REAL_PARTITIONS = 2
"""Partitions of the real topic in every world."""


class World(Protocol):
    real_topic: str
    names: TopicNames

    def producer(self, listener: ScriptedListener, **options: Any) -> Any:
        """A started producer of the world's kind (blocking face), on its topics."""

    def ops(self) -> list[OpRecord]:
        """The decision ops written so far."""

    def published(self) -> list[RawRecord]:
        """What reached the real topic, once every op written has been relayed."""

    def check_back(self, producer: Any, listener: ScriptedListener) -> None:
        """One check round for the pending half, returning once it is answered (or not)."""


@dataclass(frozen=True)
class Scenario:
    """A send and what it must leave: the result, the ops, the real records."""

    name: str
    arg: Callable[[], object]
    state: LocalTransactionState
    end: EndStatus
    ops: tuple[Resolution, ...]
    published: bool
    error: type[BaseException] | None = None
    check_answer: object = None
    options: dict[str, Any] = field(default_factory=dict)
    value: object = b'{"order": 1}'
    stored_value: bytes = b'{"order": 1}'


SCENARIOS = [
    Scenario("commit", lambda: COMMIT, COMMIT, EndStatus.COMMITTED, (Resolution.COMMIT,), True),
    Scenario(
        "rollback", lambda: ROLLBACK, ROLLBACK, EndStatus.ROLLED_BACK, (Resolution.ROLLBACK,), False
    ),
    Scenario("unknown", lambda: UNKNOW, UNKNOW, EndStatus.LEFT_UNKNOWN, (), False),
    Scenario("returns None", lambda: None, UNKNOW, EndStatus.LEFT_UNKNOWN, (), False),
    Scenario("returns junk", lambda: "yes", UNKNOW, EndStatus.LEFT_UNKNOWN, (), False),
    Scenario(
        "raises",
        lambda: RuntimeError("db down"),
        UNKNOW,
        EndStatus.LEFT_UNKNOWN,
        (),
        False,
        error=RuntimeError,
    ),
    Scenario(
        "unknown, check answers commit",
        lambda: UNKNOW,
        UNKNOW,
        EndStatus.LEFT_UNKNOWN,
        (Resolution.COMMIT,),
        True,
        check_answer=COMMIT,
    ),
    Scenario(
        "unknown, check answers rollback",
        lambda: UNKNOW,
        UNKNOW,
        EndStatus.LEFT_UNKNOWN,
        (Resolution.ROLLBACK,),
        False,
        check_answer=ROLLBACK,
    ),
    Scenario(
        "oneway commit",
        lambda: COMMIT,
        COMMIT,
        EndStatus.SENT_ONEWAY,
        (Resolution.COMMIT,),
        True,
        options={"end_oneway": True},
    ),
    Scenario(
        "typed value through a serializer",
        lambda: COMMIT,
        COMMIT,
        EndStatus.COMMITTED,
        (Resolution.COMMIT,),
        True,
        options={"value_serializer": StringSerializer("utf_8")},
        value="ä typed str",
        stored_value="ä typed str".encode(),
    ),
]


def run_scenario(world: World, scenario: Scenario) -> None:
    listener = ScriptedListener(scenario.check_answer or UNKNOW)
    producer = world.producer(listener, **scenario.options)
    message = Message(world.real_topic, scenario.value, key="order-1", headers={"trace": "t1"})
    result = producer.send_message_in_transaction(message, scenario.arg())

    assert (result.local_transaction_state, result.end_status) == (scenario.state, scenario.end)
    assert type(result.local_transaction_error) is (scenario.error or type(None))
    (executed,) = listener.executed
    assert executed.transaction_id == result.transaction_id
    assert (executed.half_partition, executed.half_offset) == (
        result.half_partition,
        result.half_offset,
    )
    if scenario.check_answer is not None:
        world.check_back(producer, listener)
        (checked,) = listener.checked
        assert (checked.transaction_id, checked.value) == (
            result.transaction_id,
            scenario.stored_value,
        )
    ops = world.ops()
    assert tuple(op.resolution for op in ops) == scenario.ops
    assert all(op.identity == result.half_offset for op in ops)
    published = world.published()
    if not scenario.published:
        assert published == []
        return
    (record,) = published
    user_headers = [(k, v) for k, v in record.headers if not is_reserved(k)]
    assert (record.key, record.value, user_headers) == (
        b"order-1",
        scenario.stored_value,
        [("trace", b"t1")],
    )
    assert (b"outbox-transaction-id", result.transaction_id.encode()) in [
        (k.encode(), v) for k, v in record.headers
    ]


def _too_large(topic: str, names: TopicNames) -> Message:
    return Message(topic, b"x" * 2_000_000)


BAD_MESSAGES: list[tuple[str, Callable[[str, TopicNames], object], type[Exception], str]] = [
    ("not a message", lambda t, n: {"topic": t}, InvalidMessageError, "expected an outbox.Message"),
    ("no topic", lambda t, n: Message("", b"v"), InvalidMessageError, "topic is missing"),
    (
        "internal topic",
        lambda t, n: Message(n.half, b"v"),
        InvalidMessageError,
        "internal outbox topic",
    ),
    ("int value", lambda t, n: Message(t, 123), InvalidMessageError, "must be bytes or str"),
    ("None value", lambda t, n: Message(t, None), InvalidMessageError, "value is missing"),
    (
        "reserved header",
        lambda t, n: Message(t, b"v", headers={"outbox-kind": "x"}),
        InvalidMessageError,
        "reserved prefix",
    ),
    (
        "headers not pairs",
        lambda t, n: Message(t, b"v", headers=[("a",)]),
        InvalidMessageError,
        "not a \\(name, value\\) pair",
    ),
    (
        "partition out of range",
        lambda t, n: Message(t, b"v", partition=REAL_PARTITIONS),
        InvalidMessageError,
        f"partition {REAL_PARTITIONS} does not exist",
    ),
    (
        "negative partition",
        lambda t, n: Message(t, b"v", partition=-1),
        InvalidMessageError,
        ">= 0",
    ),
    ("too large", _too_large, MessageTooLargeError, "too large"),
    (
        "missing topic",
        lambda t, n: Message(f"{t}-missing", b"v"),
        InvalidMessageError,
        "does not exist",
    ),
]


def run_bad_messages(world: World) -> None:
    """Every row of :data:`BAD_MESSAGES` refused by one producer, nothing run or written."""
    listener = ScriptedListener()
    producer = world.producer(listener)
    for name, build, error, match in BAD_MESSAGES:
        with pytest.raises(error, match=match):
            producer.send_message_in_transaction(build(world.real_topic, world.names), COMMIT)
        assert listener.executed == [], name
    assert world.ops() == []


def failing_serializer(value: object, ctx: object) -> bytes:
    raise ValueError("no schema for this")


BAD_SERIALIZERS: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    (
        "serializer raises",
        {"value_serializer": failing_serializer},
        MessageSerializationError,
        "value_serializer failed for topic",
    ),
    (
        "serializer returns an int",
        {"value_serializer": lambda value: 42},
        MessageSerializationError,
        "returned int",
    ),
    (
        "key serializer returns a list",
        {"key_serializer": lambda key, ctx: [key]},
        MessageSerializationError,
        "key_serializer returned list",
    ),
    (
        "value serializer returns None",
        {"value_serializer": lambda value: None},
        MessageSerializationError,
        "needs a value",
    ),
]


def run_bad_serializers(world: World) -> None:
    """Every row of :data:`BAD_SERIALIZERS`: refused before the half, nothing run or written."""
    for name, options, error, match in BAD_SERIALIZERS:
        listener = ScriptedListener()
        producer = world.producer(listener, **options)
        with pytest.raises(error, match=match):
            producer.send_message_in_transaction(Message(world.real_topic, b"v", key="k"), COMMIT)
        assert listener.executed == [], name
    assert world.ops() == []


def run_lifecycle(make_unstarted: Callable[[], Any], real_topic: str) -> None:
    """Not started: refused; shut down: refused; nothing runs."""
    listener = ScriptedListener()
    producer = make_unstarted(listener)
    with pytest.raises(ProducerNotStartedError, match="call start"):
        producer.send_message_in_transaction(Message(real_topic, b"v"), COMMIT)
    producer.start()
    producer.shutdown()
    with pytest.raises(ProducerClosedError, match="shut down"):
        producer.send_message_in_transaction(Message(real_topic, b"v"), COMMIT)
    assert listener.executed == []


class ScenarioTable:
    """The table's tests, for a test class of a module that defines the ``world`` fixture."""

    @pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
    def test_scenario(self, world: World, scenario: Scenario) -> None:
        run_scenario(world, scenario)

    def test_bad_messages(self, world: World) -> None:
        run_bad_messages(world)

    def test_bad_serializers(self, world: World) -> None:
        run_bad_serializers(world)

    def test_lifecycle(self, world: Any) -> None:
        run_lifecycle(world.unstarted, world.real_topic)
