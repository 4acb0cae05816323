"""The seams between the producers' parts, declared: what each side may count on.

The send core (:class:`outbox.send_flow.SendCore`) carries out the sends and the check
answers of one producer. Three kinds of callers use it, through :class:`SendingCore`
only: the asyncio producer (:mod:`outbox.async_producer`), which carries the same flows
out on its event loop; ``producer.transaction(message)`` (:mod:`outbox.caller_transaction`),
which stops a send at its local transaction; and a :class:`PartsSource`, which a
producer's start asks for the :class:`SendParts` it sends with: Kafka's
(:class:`outbox.kafka_parts.KafkaParts`) or an in-memory broker's
(:class:`outbox.testing.InMemoryParts`). The parts themselves meet the flows at
:class:`~outbox.topic_catalog.TopicFactsSource` and
:class:`~outbox.acked_writer.RecordWriter`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from outbox.acked_writer import RecordWriter
from outbox.flow_steps import Flow, Step
from outbox.message import Message, TransactionSendResult
from outbox.protocol import CheckRequest, TopicNames
from outbox.settings import ProducerSettings
from outbox.size_limits import SizeLimits
from outbox.topic_catalog import TopicFactsSource


@dataclass(frozen=True, slots=True)
class SendParts:
    """What a started producer sends with."""

    catalog: TopicFactsSource
    """The facts (partitions, size limit) of the topics sent to."""
    limits: SizeLimits
    """Whether a half, and every record it becomes, fits where it is going."""
    writer: RecordWriter
    """Where halves and ops are written and acknowledged."""
    half_partitions: int
    """Partitions of the half topic (and of the op topic, which matches it)."""


class SendingCore(Protocol):
    """What the asyncio producer, the caller-transaction form and a :class:`PartsSource`
    use of a producer's send core (:class:`outbox.send_flow.SendCore`)."""

    group: str
    topics: TopicNames
    settings: ProducerSettings
    listener: Any
    """The producer's listener (a :class:`~outbox.sql.SqlTransactionListener` joins
    a caller's transaction)."""
    parts: SendParts | None
    """The parts it sends with, once started."""

    def now_ms(self) -> int:
        """The producer's clock, in milliseconds."""
        ...

    def admit(self) -> None:
        """Count a send as under way, if the producer takes sends; else raise why not.

        Each :meth:`admit` is followed by one :meth:`release`, in a ``finally``.
        """
        ...

    def release(self) -> None:
        """Count a send admitted by :meth:`admit` as ended."""
        ...

    def send(self, message: Message, arg: Any) -> Flow[TransactionSendResult]:
        """The send of ``message``, as steps for a driver (:mod:`outbox.flow_steps`)."""
        ...

    def take(self, step: Step) -> Any:
        """What ``step`` gives the flow, once this thread has waited for it."""
        ...

    def answer_check(self, request: CheckRequest) -> None:
        """Answer one check request in this thread: the listener asked, its op written."""
        ...

    def answer_checks(self, requests: list[CheckRequest]) -> None:
        """Answer a batch of check requests in this thread, their ops written together."""
        ...


class PartsSource(Protocol):
    """Where a producer's start takes its parts from, and what its shutdown closes."""

    def open(self, core: SendingCore) -> SendParts:
        """The parts for ``core``'s group, topics and settings, its check requests now
        answered (by ``core.answer_checks``). Raises why they cannot be had."""
        ...

    def close(self, timeout: float) -> None:
        """Stop answering checks, deliver what was handed over, release what was opened.

        Called once, at the producer's shutdown, whether or not it was started.
        """
        ...
