"""In-memory producers for a service's unit tests: no Java, no Kafka, no checker.

:class:`InMemoryTransactionProducer` and :class:`InMemoryAsyncTransactionProducer`
are the real producers with their Kafka parts swapped for an
:class:`InMemoryBroker`'s (:class:`InMemoryParts`, given as their ``parts``): the
same constructor (plus the broker), the same send flow (validation, size limits,
the order of the writes, the listener's calls, the late-end rule, the results and
the errors), only the records land in memory.
The broker also plays the checker: it publishes each committed half to its
real topic at once (the first decision of a half wins, as the relay's), and
:meth:`InMemoryTransactionProducer.check_back` asks the listener about every
undecided half as a check round would (a put-back copy, a check request, the
answer's op), whenever the test says so rather than after a timeout.

The pytest fixture ``outbox_in_memory_producer`` (:mod:`outbox.pytest_plugin`)
makes started ones and shuts them down after the test.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from typing import Any

from confluent_kafka import KafkaError

from outbox.acked_writer import Acknowledgement
from outbox.async_producer import AsyncTransactionListener, AsyncTransactionProducer
from outbox.errors import (
    ConfigurationError,
    InvalidMessageError,
    OutboxError,
    ProducerClosedError,
    ProducerNotStartedError,
)
from outbox.message import LocalTransactionState
from outbox.producer import TransactionListener, TransactionProducer
from outbox.protocol import (
    CheckRequest,
    HalfRecord,
    OpRecord,
    OutgoingRecord,
    RawRecord,
    RecordKind,
    Resolution,
    TopicNames,
    half_partition_for,
    real_record_of_half,
    validate_topic_name,
)
from outbox.seams import SendingCore, SendParts
from outbox.settings import ProducerSettings
from outbox.size_limits import SizeLimits
from outbox.topic_catalog import TopicFacts

DEFAULT_MAX_MESSAGE_BYTES = 1_048_588
"""A broker's default ``max.message.bytes``, as the real catalog assumes."""

_STATES = {
    Resolution.COMMIT: LocalTransactionState.COMMIT_MESSAGE,
    Resolution.ROLLBACK: LocalTransactionState.ROLLBACK_MESSAGE,
}


class InMemoryBroker:
    """Topics held in memory, with the checker's relay: what each real topic would receive.

    ``topics`` maps real topic names to partition counts; a send to a topic
    not in it is refused as the real producer refuses a missing topic. Left
    out (None), every topic exists with one partition. Internal outbox topics
    always exist, ``half_partitions`` each (half and op). Thread-safe; several
    producers (several groups, or prefixes) may share one broker.
    """

    def __init__(
        self,
        topics: Mapping[str, int] | None = None,
        *,
        half_partitions: int = 1,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    ) -> None:
        if isinstance(half_partitions, bool) or not isinstance(half_partitions, int):
            raise ConfigurationError(
                f"half_partitions must be an int >= 1, got {half_partitions!r}"
            )
        if half_partitions < 1:
            raise ConfigurationError(
                f"half_partitions must be an int >= 1, got {half_partitions!r}"
            )
        self.half_partitions = half_partitions
        self.max_message_bytes = max_message_bytes
        self._declared: dict[str, int] | None = None
        if topics is not None:
            self._declared = {}
            for name, partitions in dict(topics).items():
                self.create_topic(name, partitions)
        self._records: dict[str, list[RawRecord]] = {}
        self._next_offset: dict[tuple[str, int], int] = {}
        self._halves: dict[tuple[str, int, int], RawRecord] = {}
        self._decided: dict[tuple[str, int, int], Resolution] = {}
        self._unavailable: set[str] = set()
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ topics

    def create_topic(self, name: str, partitions: int = 1) -> None:
        """Declare a real topic (needed only when the broker was given ``topics``)."""
        try:
            validate_topic_name(name, "topic")
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise ConfigurationError(
                f"topic {name!r}: partitions must be an int >= 1, got {partitions!r}"
            )
        if self._declared is not None:
            self._declared[name] = partitions

    def make_unavailable(self, topic: str, unavailable: bool = True) -> None:
        """Fail every write to ``topic`` from now on (or again accept them), as a broker down."""
        with self._lock:
            (self._unavailable.add if unavailable else self._unavailable.discard)(topic)

    def facts(self, topic: str, internal: bool) -> TopicFacts:
        """What the producer's topic catalog would learn of ``topic``."""
        if internal:
            return TopicFacts(topic, self.half_partitions, self.max_message_bytes)
        if self._declared is None:
            return TopicFacts(topic, 1, self.max_message_bytes)
        partitions = self._declared.get(topic)
        if partitions is None:
            raise InvalidMessageError(
                f"topic {topic!r} does not exist on the in-memory broker; create it first"
                " (InMemoryBroker(topics={...}) or create_topic)"
            )
        return TopicFacts(topic, partitions, self.max_message_bytes)

    # ------------------------------------------------------------------ writing

    def append(self, record: OutgoingRecord, partitions: int, now_ms: int) -> RawRecord | None:
        """Store ``record``; None if its topic was made unavailable. Ops are relayed at once."""
        with self._lock:
            if record.topic in self._unavailable:
                return None
            partition = record.partition
            if partition is None:
                partition = half_partition_for(record.key, "", partitions) if record.key else 0
            offset = self._next_offset.get((record.topic, partition), 0)
            self._next_offset[(record.topic, partition)] = offset + 1
            stored = RawRecord(
                record.topic,
                partition,
                offset,
                record.key,
                record.value,
                tuple(record.headers),
                now_ms,
            )
            self._records.setdefault(record.topic, []).append(stored)
            kind = stored.kind()
            if kind is RecordKind.HALF:
                identity = HalfRecord.from_record(stored).identity(offset)
                self._halves.setdefault((record.topic, partition, identity), stored)
            elif kind is RecordKind.OP:
                self._relay(stored, now_ms)
            return stored

    def _relay(self, op_raw: RawRecord, now_ms: int) -> None:
        """The checker's relay: the first decision of a half wins; a COMMIT publishes it."""
        op = OpRecord.from_record(op_raw)
        half_topic = _half_topic_of(op_raw.topic)
        identity = (half_topic, op.half_partition, op.identity)
        if identity in self._decided:
            return
        self._decided[identity] = op.resolution
        half = self._halves.get(identity)
        if op.resolution is Resolution.COMMIT and half is not None:
            _, real = real_record_of_half(half)
            declared = self._declared or {}
            self.append(real, declared.get(real.topic, 1), now_ms)

    # ------------------------------------------------------------------ reading

    def records(self, topic: str) -> list[RawRecord]:
        """Every record stored on ``topic`` (internal topics too), in the order written."""
        with self._lock:
            return list(self._records.get(topic, ()))

    def published(self, topic: str) -> list[RawRecord]:
        """What a ``read_committed`` consumer of the real ``topic`` would read: committed events."""
        return self.records(topic)

    def undecided(self, half_topic: str, transaction_id: str | None = None) -> list[RawRecord]:
        """The original halves on ``half_topic`` with no decision yet (of one id, if given)."""
        with self._lock:
            found = [
                raw
                for key, raw in self._halves.items()
                if key[0] == half_topic and key not in self._decided
            ]
        if transaction_id is None:
            return found
        return [r for r in found if HalfRecord.from_record(r).transaction_id == transaction_id]

    def decision(self, half_topic: str, half_partition: int, identity: int) -> Resolution | None:
        """The decision the relay kept for a half, if any."""
        with self._lock:
            return self._decided.get((half_topic, half_partition, identity))


def _half_topic_of(op_topic: str) -> str:
    """The half topic paired with ``op_topic`` (the same prefix)."""
    return TopicNames(op_topic.removesuffix(".op")).half


class _MemoryCatalog:
    """The producer's :class:`~outbox.topic_catalog.TopicCatalog`, answered by the broker."""

    def __init__(self, broker: InMemoryBroker, is_internal: Callable[[str], bool]) -> None:
        self._broker = broker
        self._is_internal = is_internal

    def known(self, topic: str) -> TopicFacts | None:
        return self.get(topic)

    def get(self, topic: str) -> TopicFacts:
        return self._broker.facts(topic, self._is_internal(topic))


class _MemoryWriter:
    """The producer's :class:`~outbox.acked_writer.AckedWriter`: writes acknowledged at once."""

    def __init__(
        self, broker: InMemoryBroker, catalog: _MemoryCatalog, now_ms: Callable[[], int]
    ) -> None:
        self._broker = broker
        self._catalog = catalog
        self._now_ms = now_ms

    def submit(
        self, record: OutgoingRecord, deadline: float, failure: type[OutboxError]
    ) -> Acknowledgement:
        return self.submit_nowait(record, failure)

    def submit_nowait(self, record: OutgoingRecord, failure: type[OutboxError]) -> Acknowledgement:
        acknowledgement = Acknowledgement(record.topic, failure, {})
        facts = self._catalog.get(record.topic)
        stored = self._broker.append(record, facts.partitions, self._now_ms())
        if stored is None:
            error = KafkaError(KafkaError._TRANSPORT, "in-memory broker: topic made unavailable")
            acknowledgement(error, None)  # type: ignore[arg-type]
        else:
            acknowledgement(None, _Delivered(stored))  # type: ignore[arg-type]
        return acknowledgement

    def close(self, timeout: float = 10.0) -> None:
        """Nothing is ever in flight."""


class _Delivered:
    """The delivery report's message, as much of it as an acknowledgement reads."""

    __slots__ = ("_stored",)

    def __init__(self, stored: RawRecord) -> None:
        self._stored = stored

    def partition(self) -> int:
        return self._stored.partition

    def offset(self) -> int:
        return self._stored.offset


class InMemoryParts:
    """What an in-memory producer sends with: an :class:`InMemoryBroker`'s topics and writes
    instead of Kafka's (the :class:`~outbox.seams.PartsSource` it gives the real producer).

    Nothing to connect to; no check requests arrive: :meth:`check_back` plays a check round.
    """

    def __init__(self, broker: InMemoryBroker | None = None) -> None:
        if broker is not None and not isinstance(broker, InMemoryBroker):
            raise ConfigurationError(f"broker must be an InMemoryBroker, got {broker!r}")
        self.broker = broker if broker is not None else InMemoryBroker()
        self._core: SendingCore | None = None
        self._writer: _MemoryWriter | None = None
        self._closed = False

    def open(self, core: SendingCore) -> SendParts:
        """Take the in-memory broker's topics."""
        catalog = _MemoryCatalog(self.broker, core.topics.is_internal)
        self._writer = _MemoryWriter(self.broker, catalog, core.now_ms)
        self._core = core
        limits = SizeLimits(catalog, core.settings.client_config())
        return SendParts(catalog, limits, self._writer, self.broker.half_partitions)

    def close(self, timeout: float) -> None:
        """Nothing to close; :meth:`check_back` is refused from now on."""
        self._closed = True

    def check_back(self, transaction_id: str | None = None) -> dict[str, LocalTransactionState]:
        """:meth:`InMemoryTransactionProducer.check_back`, for the producer these parts are of."""
        if self._closed:
            raise ProducerClosedError("this producer was shut down; check_back needs a running one")
        core, writer = self._core, self._writer
        if core is None or writer is None:
            raise ProducerNotStartedError("call start() before check_back()")
        topics = core.topics
        states: dict[str, LocalTransactionState] = {}
        for raw in self.broker.undecided(topics.half, transaction_id):
            half = HalfRecord.from_record(raw)
            if half.producer_group != core.group:
                continue
            copy = half.put_back(raw.offset, raw.timestamp_ms)
            stored = writer.submit_nowait(
                copy.to_record(topics, raw.partition), OutboxError
            ).position()
            core.answer_check(CheckRequest(copy, raw.partition, stored[1], core.now_ms()))
            decided = self.broker.decision(topics.half, raw.partition, raw.offset)
            states[half.transaction_id] = _STATES.get(decided, LocalTransactionState.UNKNOW)  # type: ignore[arg-type]
        return states


def _settings(config: ProducerSettings | None) -> ProducerSettings:
    """The given settings, or settings that need no environment (nothing is connected to)."""
    return config if config is not None else ProducerSettings(bootstrap_servers="in-memory:0")


class InMemoryTransactionProducer(TransactionProducer):
    """:class:`~outbox.producer.TransactionProducer` on an :class:`InMemoryBroker`.

    The real producer's arguments (``options``: ``clock``, ``key_serializer``,
    ``value_serializer``), plus ``broker`` (a new one when left out);
    ``config`` may be left out without any environment. Read what the service
    sent from ``producer.broker`` (``published(real_topic)``, ``records(topic)``).
    """

    def __init__(
        self,
        group: str,
        listener: TransactionListener,
        config: ProducerSettings | None = None,
        check_executor: Executor | None = None,
        *,
        broker: InMemoryBroker | None = None,
        **options: Any,
    ) -> None:
        parts = InMemoryParts(broker)
        super().__init__(group, listener, _settings(config), check_executor, parts=parts, **options)
        self.broker = parts.broker
        self._parts = parts

    def check_back(self, transaction_id: str | None = None) -> dict[str, LocalTransactionState]:
        """One check round over every undecided half (of ``transaction_id``, if given).

        As the checker does it: a put-back copy of the half, a check request for
        the copy, the listener's answer written as an op on it (and relayed).
        Returns each asked transaction's state after its answer: COMMIT_MESSAGE,
        ROLLBACK_MESSAGE, or UNKNOW when it is still undecided.
        """
        return self._parts.check_back(transaction_id)


class InMemoryAsyncTransactionProducer(AsyncTransactionProducer):
    """:class:`~outbox.async_producer.AsyncTransactionProducer` on an :class:`InMemoryBroker`.

    As :class:`InMemoryTransactionProducer`; ``await check_back()`` asks the
    async listener on this loop.
    """

    def __init__(
        self,
        group: str,
        listener: AsyncTransactionListener,
        config: ProducerSettings | None = None,
        check_executor: Executor | None = None,
        *,
        broker: InMemoryBroker | None = None,
        **options: Any,
    ) -> None:
        parts = InMemoryParts(broker)
        super().__init__(group, listener, _settings(config), check_executor, parts=parts, **options)
        self.broker: InMemoryBroker = parts.broker
        self._parts = parts

    async def check_back(
        self, transaction_id: str | None = None
    ) -> dict[str, LocalTransactionState]:
        """As :meth:`InMemoryTransactionProducer.check_back`, the listener awaited on this loop."""
        return await asyncio.get_running_loop().run_in_executor(
            None, self._parts.check_back, transaction_id
        )
