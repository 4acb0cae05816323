"""Fixtures for producer tests: fresh outbox topics and a real topic per test.

Every producer test runs twice, through ``producer_type``: on the threaded
:class:`TransactionProducer`, and on the :class:`AsyncTransactionProducer`
driven from the test's thread (:class:`OnLoop`), so one table of cases proves
both give the same results and raise the same errors.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any, Self, TypeVar

import pytest
from confluent_kafka.admin import AdminClient

from outbox import (
    AsyncTransactionProducer,
    LocalTransactionState,
    Message,
    ProducerSettings,
    TransactionProducer,
    TransactionSendResult,
)
from outbox.admin import TopicSpec, ensure_topics, plan_topics
from outbox.config import kafka_client_config
from outbox.protocol import RawRecord, TopicNames
from outbox.reading import read_topic
from tests.fixtures.relay import running_relay

HALF_PARTITIONS = 3


@dataclass
class OutboxTopics:
    """The topics one test owns, and ways to read them back."""

    bootstrap: str
    names: TopicNames
    real_topic: str

    @property
    def client_config(self) -> dict[str, Any]:
        """The library's client configuration: its clients log through ``logging``, so one
        still alive when the broker stops (an abandoned stuck call's producer) does not
        print its reconnect failures raw at the end of the suite."""
        return kafka_client_config(self.bootstrap)

    def settings(self, **overrides: object) -> ProducerSettings:
        return ProducerSettings(
            bootstrap_servers=self.bootstrap, topic_prefix=self.names.prefix, **overrides
        )

    def read(self, topic: str, isolation: str = "read_committed") -> list[RawRecord]:
        return read_topic(self.client_config, topic, isolation=isolation, timeout=60)


@pytest.fixture
def outbox_topics(
    kafka_bootstrap: str, kafka_admin: AdminClient, unique_prefix: str
) -> OutboxTopics:
    names = TopicNames(unique_prefix)
    real_topic = f"{unique_prefix}-events"
    ensure_topics(kafka_admin, [*plan_topics(names, HALF_PARTITIONS), TopicSpec(real_topic, 2, 1)])
    return OutboxTopics(kafka_bootstrap, names, real_topic)


@pytest.fixture
def relay(outbox_topics: OutboxTopics) -> Iterator[None]:
    """The checker's relay for the test's topics: commits reach the real topic."""
    with running_relay(outbox_topics.client_config, outbox_topics.names):
        yield


class ScriptedListener:
    """Answers each local transaction with the state passed as ``arg``.

    ``arg`` may also be an exception to raise, or a callable to run. Check
    answers come from ``check_answer`` and every checked message is recorded.
    """

    def __init__(self, check_answer: object = LocalTransactionState.COMMIT_MESSAGE) -> None:
        self.check_answer = check_answer
        self.checked: list[Message] = []
        self.executed: list[Message] = []
        self.check_called = threading.Event()

    def execute_local_transaction(self, message: Message, arg: object) -> object:
        self.executed.append(message)
        if isinstance(arg, BaseException):
            raise arg
        if callable(arg):
            return arg(message)
        return arg

    def check_local_transaction(self, message: Message) -> object:
        self.checked.append(message)
        self.check_called.set()
        if isinstance(self.check_answer, BaseException):
            raise self.check_answer
        if callable(self.check_answer):
            return self.check_answer(message)
        return self.check_answer


@pytest.fixture
def listener() -> ScriptedListener:
    return ScriptedListener()


_T = TypeVar("_T")


class EventLoopThread:
    """An event loop in a thread of its own, for sync tests of async code.

    A call runs in a task that carries the caller's context variables, as an
    awaited call would (the producer's record of local transaction errors).
    """

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="test-loop", daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        context = contextvars.copy_context()
        result: Future[_T] = Future()

        def finished(task: asyncio.Task[_T]) -> None:
            if task.exception() is not None:
                result.set_exception(task.exception())  # type: ignore[arg-type]
            else:
                result.set_result(task.result())

        def begin() -> None:
            self.loop.create_task(coroutine, context=context).add_done_callback(finished)

        self.loop.call_soon_threadsafe(begin)
        return result.result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


class Awaited:
    """A sync listener's answers, as the coroutines an async producer awaits, on its loop."""

    def __init__(self, listener: Any) -> None:
        self.listener = listener

    async def execute_local_transaction(self, message: Message, arg: object) -> object:
        return self.listener.execute_local_transaction(message, arg)

    async def check_local_transaction(self, message: Message) -> object:
        return self.listener.check_local_transaction(message)


def awaited(listener: Any) -> Any:
    """``listener`` made async; anything that is not a sync listener stays as given (bad input)."""
    methods = [
        getattr(listener, m, None) for m in ("execute_local_transaction", "check_local_transaction")
    ]
    if all(callable(m) and not inspect.iscoroutinefunction(m) for m in methods):
        return Awaited(listener)
    return listener


class OnLoop:
    """An :class:`AsyncTransactionProducer` with the blocking face of a TransactionProducer.

    Its event loop runs in a thread of its own (``loop``, or one it makes);
    each call runs a coroutine there and waits for it, so a test written for
    the threaded producer drives the async one unchanged. The listener is made
    async (:func:`awaited`).
    """

    def __init__(
        self,
        group: str,
        listener: Any,
        config: ProducerSettings | None = None,
        check_executor: Executor | None = None,
        *,
        clock: Callable[[], float] = time.time,
        loop: EventLoopThread | None = None,
        producer_class: type[AsyncTransactionProducer] = AsyncTransactionProducer,
        **options: Any,
    ) -> None:
        self.producer = producer_class(
            group, awaited(listener), config, check_executor, clock=clock, **options
        )
        self.config = self.producer.config
        self.group = self.producer.group
        self.loop = loop or EventLoopThread()
        self._own_loop = loop is None

    def _call(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        return self.loop.run(coroutine)

    def start(self) -> Self:
        self._call(self.producer.start())
        return self

    def shutdown(self, timeout: float = 30.0) -> None:
        self._call(self.producer.shutdown(timeout))

    def send_message_in_transaction(
        self, message: Message, arg: object = None
    ) -> TransactionSendResult:
        return self._call(self.producer.send_message_in_transaction(message, arg))

    def check_back(self, transaction_id: str | None = None) -> Any:
        """The in-memory producer's check round (:mod:`outbox.testing`), on the loop."""
        return self._call(self.producer.check_back(transaction_id))  # type: ignore[attr-defined]

    def close_loop(self) -> None:
        if self._own_loop:
            self.loop.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()


ProducerType = Callable[..., Any]
"""``TransactionProducer``, or :class:`OnLoop` (the async producer), with the same arguments."""


@pytest.fixture(params=["sync", "async"])
def producer_type(request: pytest.FixtureRequest) -> Iterator[ProducerType]:
    """Each producer test once per producer: the threaded one and the asyncio one."""
    if request.param == "sync":
        yield TransactionProducer
        return
    made: list[OnLoop] = []

    def make(*args: Any, **kwargs: Any) -> OnLoop:
        made.append(OnLoop(*args, **kwargs))
        return made[-1]

    yield make
    for producer in made:
        producer.shutdown()
        producer.close_loop()


@pytest.fixture
def producer(
    outbox_topics: OutboxTopics, listener: ScriptedListener, producer_type: ProducerType
) -> Iterator[TransactionProducer]:
    with producer_type("orders", listener, outbox_topics.settings()) as started:
        yield started
