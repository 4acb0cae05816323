"""Acknowledged writes: one idempotent producer shared by every sending thread.

Halves and decision ops both go through it. A send must not run its local
transaction before its half is stored, and by default must not report a
decision before its op is stored, so each caller waits for its own delivery
report, as a future: a thread blocks on it, an asyncio task awaits it. A
background thread serves the reports, so many senders' records share the
client's batches instead of each flushing the whole producer. A oneway op
(``end_oneway``) is handed to the client instead; its report comes later.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from outbox.access import refused_write
from outbox.errors import OutboxError, QueueFullError
from outbox.protocol import OutgoingRecord

log = logging.getLogger(__name__)

_KAFKA_AWAY = frozenset(
    (
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    )
)
"""Delivery failures that say Kafka is away or slow, not that the record was refused."""


def kafka_away(error: KafkaError) -> bool:
    """Whether a write failed because Kafka could not take it now (trying later may work)."""
    return bool(error.retriable()) or error.code() in _KAFKA_AWAY


class Acknowledgement:
    """A record's (partition, offset) once stored, or the caller's failure if it was not.

    The offset is None when the client stored the record without learning where
    (librdkafka reports an idempotent write retried across a leader change, and
    answered as a duplicate, with no offset): unknown stays unknown, never a
    guess, since a half named by a wrong offset names another transaction's half.

    It is the record's delivery callback itself, so a write costs one object and
    one lock: the lock is held from the start and released by the report, a
    waiting thread acquires it (no ``Future``, whose ``Condition`` costs an
    ``RLock`` and a wait list per write). An event loop watches it instead
    (:meth:`add_done_callback`). Nobody can cancel it: a caller that stops
    waiting leaves the report to arrive all the same.
    """

    __slots__ = (
        "_arrived",
        "_client_config",
        "_error",
        "_failure",
        "_position",
        "_topic",
        "_watchers",
    )

    def __init__(
        self, topic: str, failure: type[OutboxError], client_config: dict[str, Any]
    ) -> None:
        self._topic = topic
        self._failure = failure
        self._client_config = client_config
        self._position: tuple[int, int | None] | None = None
        self._error: OutboxError | None = None
        self._watchers: list[Callable[[Acknowledgement], object]] = []
        self._arrived = threading.Lock()
        self._arrived.acquire()

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        """The delivery report, on the client's report thread (``on_delivery``)."""
        if error is not None:
            why = refused_write(self._topic, error, self._client_config)
            self._error = self._failure(f"{self._topic} record not stored: {why}")
            self._error.retriable = kafka_away(error)
        else:
            self._position = (message.partition() or 0, message.offset())
        self._arrived.release()
        if self._watchers:
            self._notify()

    def _notify(self) -> None:
        # Each watcher is popped, atomically, by exactly one of the report thread
        # and the thread adding it, whichever finds the report arrived.
        watchers = self._watchers
        while watchers:
            try:
                watcher = watchers.pop()
            except IndexError:
                return
            watcher(self)

    def done(self) -> bool:
        """Whether the delivery report arrived."""
        return not self._arrived.locked()

    def add_done_callback(self, watcher: Callable[[Acknowledgement], object]) -> None:
        """Call ``watcher(self)`` once the report arrives (at once if it has), on that thread."""
        self._watchers.append(watcher)
        if self.done():
            self._notify()

    def result(self, timeout: float) -> tuple[int, int | None]:
        """The (partition, offset), waiting up to ``timeout`` seconds; the failure, raised.

        Raises ``TimeoutError`` when the report did not come in time.
        """
        if not self._arrived.acquire(True, max(0.0, timeout)):
            raise TimeoutError
        self._arrived.release()
        if self._error is not None:  # as position(), without its call
            raise self._error
        assert self._position is not None
        return self._position

    def position(self) -> tuple[int, int | None]:
        """The (partition, offset) of a record whose report arrived; its failure, raised."""
        if self._error is not None:
            raise self._error
        assert self._position is not None
        return self._position

    def exception(self) -> OutboxError | None:
        """The failure of a record whose report arrived, or None if it was stored."""
        return self._error


class RecordWriter(Protocol):
    """What the send flows write with: an :class:`AckedWriter`, or the in-memory broker's
    writer (:mod:`outbox.testing`)."""

    def submit(
        self, record: OutgoingRecord, deadline: float, failure: type[OutboxError]
    ) -> Acknowledgement:
        """Hand ``record`` over, waiting until ``deadline`` (monotonic) for room."""
        ...

    def submit_nowait(self, record: OutgoingRecord, failure: type[OutboxError]) -> Acknowledgement:
        """Hand ``record`` over: :class:`QueueFullError` when there is no room."""
        ...

    def close(self, timeout: float = 10.0) -> None:
        """Deliver what is still queued, then close."""
        ...


class AckedWriter:
    """Idempotent, ``acks=all`` writes: each caller gets a future of its own acknowledgement.

    Threads wait on it (:meth:`write`); an event loop awaits it; a oneway op is
    handed over and its future only watched.
    """

    def __init__(self, client_config: dict[str, Any]) -> None:
        self._client_config = client_config
        self.producer = Producer(
            {
                **client_config,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 1,
            }
        )
        self._closed = threading.Event()
        self._poller = threading.Thread(target=self._serve_reports, name="outbox-acks")
        self._poller.daemon = True
        self._poller.start()

    def _serve_reports(self) -> None:
        while not self._closed.is_set():
            self.producer.poll(0.05)

    def write(
        self, record: OutgoingRecord, timeout: float, failure: type[OutboxError]
    ) -> tuple[int, int | None]:
        """Store ``record``; return its (partition, offset) once acknowledged.

        Raises ``failure`` when it was refused or not acknowledged in time. A
        timed-out record may still be stored later: both kinds written here are
        safe to find late (a half is then checked, an op says what the caller decided).
        """
        deadline = time.monotonic() + timeout
        acknowledgement = self.submit(record, deadline, failure)
        return wait_acknowledged(acknowledgement, record, timeout, deadline, failure)

    def submit(
        self, record: OutgoingRecord, deadline: float, failure: type[OutboxError]
    ) -> Acknowledgement:
        """Hand ``record`` to the client, waiting until ``deadline`` (monotonic) for room.

        Raises ``failure`` if the client would not take it (queue full until the
        deadline, or refused outright); otherwise the future says whether it was stored.
        """
        while True:
            try:
                return self.submit_nowait(record, failure)
            except QueueFullError:
                if time.monotonic() > deadline:
                    full = failure(
                        f"the producer queue stayed full; {record.topic} record not written"
                    )
                    full.retriable = True
                    raise full from None
                time.sleep(0.005)

    def submit_nowait(self, record: OutgoingRecord, failure: type[OutboxError]) -> Acknowledgement:
        """:meth:`submit` without waiting: :class:`QueueFullError` when there is no room."""
        acknowledgement = Acknowledgement(record.topic, failure, self._client_config)
        partition = record.partition
        try:
            self.producer.produce(
                record.topic,
                record.value,
                record.key,
                partition=-1 if partition is None else partition,  # -1: the client's partitioner
                on_delivery=acknowledgement,
                headers=record.headers,
            )
        except BufferError:
            raise QueueFullError(record.topic) from None
        except KafkaException as exc:
            rejected = failure(f"{record.topic} record rejected: {exc.args[0]}")
            rejected.retriable = kafka_away(exc.args[0])
            raise rejected from None
        return acknowledgement

    def close(self, timeout: float = 10.0) -> None:
        """Deliver what is still queued (oneway ops included, whose futures then complete)."""
        self._closed.set()
        self._poller.join(timeout)
        remaining = self.producer.flush(timeout)
        if remaining:
            log.warning("%d records were still unacknowledged at close", remaining)


def wait_acknowledged(
    acknowledgement: Acknowledgement,
    record: OutgoingRecord,
    timeout: float,
    deadline: float,
    failure: type[OutboxError],
) -> tuple[int, int | None]:
    """Block until ``acknowledgement`` comes, or ``deadline`` (monotonic) passes: ``failure``."""
    try:
        return acknowledgement.result(max(0.0, deadline - time.monotonic()))
    except TimeoutError:
        raise not_acknowledged(record, timeout, failure) from None


def not_acknowledged(
    record: OutgoingRecord, timeout: float, failure: type[OutboxError]
) -> OutboxError:
    """The error of a record whose acknowledgement did not come within ``timeout``.

    Retriable: the record may still be stored later, or never.
    """
    error = failure(f"{record.topic} record not acknowledged within {timeout:g}s")
    error.retriable = True
    return error


def produce_when_room(producer: Producer, **kwargs: Any) -> None:
    """``producer.produce(**kwargs)``, serving delivery reports while the client's queue is full.

    A full queue (``BufferError``) enqueued nothing, so trying again is safe; for
    writers that may wait as long as the broker needs (their own deadline is
    elsewhere: a transaction timeout, a flush).
    """
    while True:
        try:
            producer.produce(**kwargs)
            return
        except BufferError:
            producer.poll(0.01)
