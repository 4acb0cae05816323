"""The send flow: RocketMQ's ``sendMessageInTransaction``, and the core that carries it out.

Write the half and wait for its acknowledgement; run the local transaction; write
the decision as an op record (:mod:`outbox.end_flow`). The flow is steps for a driver
(:mod:`outbox.flow_steps`): this thread's, or an event loop's; everything that
decides (validation, the order of the writes, the outcome, the result) is here, so
both producers give the same results and raise the same errors.

:class:`SendCore` is what both producers (:mod:`outbox.producer`,
:mod:`outbox.async_producer`) are underneath: the send flow and the check answers
(:mod:`outbox.check_answers`) of one producer group, the parts they are carried out
with once started (:class:`~outbox.seams.SendParts`, from a
:class:`~outbox.seams.PartsSource`), and the admission of sends, which a shutdown
waits on. Its callers see it as :class:`~outbox.seams.SendingCore`.

:func:`record_local_transaction_error` (exported by :mod:`outbox.producer` too) is
the listener's way to keep an error on the result of the send whose local transaction
runs. Logged as ``outbox.producer``, where these messages have always been.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from functools import partial
from typing import Any

from outbox import metrics, tracing
from outbox.acked_writer import wait_acknowledged
from outbox.check_answers import CheckAnswers
from outbox.end_flow import EndFlow, as_state
from outbox.errors import (
    ConnectionSecurityError,
    HalfWriteError,
    InvalidMessageError,
    KafkaUnavailableError,
    ProducerClosedError,
    ProducerNotStartedError,
)
from outbox.flow_steps import FittingHalf, Flow, LocalTransaction, Step, TopicLookup, Write
from outbox.message import (
    EndStatus,
    LocalTransactionState,
    Message,
    SendStatus,
    TransactionSendResult,
)
from outbox.protocol import (
    CheckRequest,
    HalfRecord,
    OutgoingRecord,
    half_partition_for,
    new_transaction_id,
)
from outbox.protocol.parked import encode_parked_half
from outbox.protocol.records import frozen_instance
from outbox.seams import PartsSource, SendParts
from outbox.serialization import Serialization
from outbox.settings import ProducerSettings
from outbox.topic_catalog import TopicFacts
from outbox.validation import build_half

log = logging.getLogger("outbox.producer")

_local_errors: ContextVar[list[BaseException] | None] = ContextVar(
    "outbox_local_transaction_errors", default=None
)


def record_local_transaction_error(error: BaseException) -> bool:
    """Keep ``error`` on the result of the send whose local transaction is running here.

    Only an exception that escapes ``execute_local_transaction`` reaches
    ``TransactionSendResult.local_transaction_error`` on its own, and an escaping
    exception always means UNKNOW. A listener that catches the error and
    answers ROLLBACK_MESSAGE itself (as :class:`outbox.sql.SqlTransactionListener`
    does when the business function raises) calls this so the caller still
    learns why. The last error recorded wins. Returns False, and does nothing,
    when no send is running in this thread or task (a check, a direct call).
    """
    errors = _local_errors.get()
    if errors is None:
        return False
    errors.append(error)
    return True


@contextmanager
def recorded_local_transaction_errors() -> Iterator[list[BaseException]]:
    """The errors :func:`record_local_transaction_error` records in this context while the
    block runs, as a send collects them around its local transaction (for a listener's tests)."""
    recorded: list[BaseException] = []
    previous = _local_errors.get()
    _local_errors.set(recorded)
    try:
        yield recorded
    finally:
        _local_errors.set(previous)


def half_timeout(settings: ProducerSettings) -> float:
    """How long a send waits for its half: ``park_after_seconds`` when it may park."""
    if settings.park_when_unavailable:
        return min(settings.park_after_seconds, settings.send_timeout_seconds)
    return settings.send_timeout_seconds


class SendCore:
    """The sends and check answers of one producer, and the parts and admission they need.

    ``listener`` runs the local transactions (through :meth:`take`) and, unless ``ask``
    stands in for it, answers the checks; ``parts_source`` gives the parts at
    :meth:`start` and closes them at :meth:`shutdown`.
    """

    def __init__(
        self,
        group: str,
        listener: Any,
        settings: ProducerSettings,
        *,
        clock: Callable[[], float],
        serialization: Serialization,
        parts_source: PartsSource,
        ask: Callable[[Message], object] | None = None,
    ) -> None:
        self.group = group
        self.listener = listener
        self.settings = settings
        self.topics = settings.topics
        self.clock = clock
        self.metrics = metrics.GroupMetrics(group)
        self.parts: SendParts | None = None
        """The parts the flows are carried out with, once started."""
        self._serialization = serialization
        self._parts_source = parts_source
        self._half_timeout = half_timeout(settings)
        self._end_window_ms = round(settings.transaction_timeout_seconds * 1000)
        """The producer's transaction timeout, carried on each half: the checker asks no sooner."""
        self._ends = EndFlow(group, settings, self.metrics, clock, self._half_timeout)
        self._checks = CheckAnswers(
            group,
            self.metrics,
            self._ends,
            ask=ask or self._ask_listener,
            take=self.take,
            start=self.start_step,
        )
        self._admission = threading.Lock()
        """Held to admit or release a send; taken directly there (a C-level ``with``)."""
        self._state_lock = threading.Condition(self._admission)
        self._started = False
        self._closed = False
        self._in_flight = 0

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Take the parts from the parts source and admit sends; nothing if started already."""
        with self._state_lock:
            if self._closed:
                raise ProducerClosedError("this producer was shut down; create a new one")
            if self._started:
                return
        parts = self._parts_source.open(self)
        with self._state_lock:
            self.parts = parts
            self._started = True
        log.info("transaction producer started group=%s", self.group)

    def shutdown(self, timeout: float) -> None:
        """Refuse new sends, wait (up to ``timeout``) for those under way, close the parts.

        Idempotent.
        """
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
            deadline = time.monotonic() + timeout
            while self._in_flight and time.monotonic() < deadline:
                self._state_lock.wait(deadline - time.monotonic())
            if self._in_flight:
                log.warning("%d sends still running at shutdown", self._in_flight)
        self._parts_source.close(timeout)
        log.info("transaction producer shut down group=%s", self.group)

    def admit(self) -> None:
        """Count a send as under way (shutdown waits for it), if the producer takes sends.

        Each :meth:`admit` is followed by one :meth:`release`, in a ``finally``.
        """
        with self._admission:
            if self._closed:
                raise ProducerClosedError("this producer was shut down; no message was sent")
            if not self._started:
                raise ProducerNotStartedError("call start() before sending; no message was sent")
            self._in_flight += 1

    def release(self) -> None:
        """Count a send admitted by :meth:`admit` as ended."""
        with self._admission:
            self._in_flight -= 1
            if self._closed:  # only a shutdown waits for the count
                self._state_lock.notify_all()

    def now_ms(self) -> int:
        """The producer's clock, in milliseconds."""
        return int(self.clock() * 1000)

    # ------------------------------------------------------------------ carrying out

    def take(self, step: Step) -> Any:
        """What ``step`` gives the flow, once this thread has waited for it."""
        parts = self.parts
        assert parts is not None
        if isinstance(step, Write):
            acknowledgement = parts.writer.submit(step.record, step.deadline, step.failure)
            if not step.wait:
                return acknowledgement
            return wait_acknowledged(
                acknowledgement, step.record, step.timeout, step.deadline, step.failure
            )
        if isinstance(step, TopicLookup):
            return parts.catalog.get(step.topic)
        if isinstance(step, FittingHalf):
            return parts.limits.fitting_half_record(step.half, self.topics, step.half_partition)
        return self.listener.execute_local_transaction(step.message, step.arg)

    def start_step(self, step: Step) -> Callable[[], Any]:
        """What waits for ``step``'s outcome, a write handed to the client already."""
        if not isinstance(step, Write) or not step.wait:
            return partial(self.take, step)
        parts = self.parts
        assert parts is not None
        try:
            acknowledgement = parts.writer.submit(step.record, step.deadline, step.failure)
        except Exception as exc:
            return partial(_raise, exc)
        record, timeout, deadline, failure = step.record, step.timeout, step.deadline, step.failure
        return partial(wait_acknowledged, acknowledgement, record, timeout, deadline, failure)

    def answer_check(self, request: CheckRequest) -> None:
        """Answer one check request in this thread: the listener asked, its op written."""
        self._checks.answer(request)

    def answer_checks(self, requests: list[CheckRequest]) -> None:
        """Answer a batch of check requests in this thread, their ops written together
        (the check responder's ``answer``, on its executor)."""
        self._checks.answer_batch(requests)

    def _ask_listener(self, message: Message) -> object:
        """The listener's answer to a check, on a check executor thread."""
        return self.listener.check_local_transaction(message)

    # ------------------------------------------------------------------ the send

    def send(self, message: Message, arg: Any) -> Flow[TransactionSendResult]:
        """The send in its span, whose trace context the half carries to the real record.

        With no span to record (no OpenTelemetry, or no SDK) the steps are the
        flow itself, not wrapped in a generator that only passes them on.
        """
        if not tracing.recording():
            return self._send_steps(message, arg, tracing.NO_SPAN)
        return self._traced_send(message, arg)

    def _traced_send(self, message: Message, arg: Any) -> Flow[TransactionSendResult]:
        attributes = {"messaging.system": "kafka", "outbox.producer_group": self.group}
        with tracing.span(tracing.SEND, "PRODUCER", attributes) as span:
            result = yield from self._send_steps(message, arg, span)
            span.set_attribute(
                "outbox.local_transaction_state", result.local_transaction_state.value
            )
            span.set_attribute("outbox.end_status", result.end_status.value)
            return result

    def _send_steps(self, message: Message, arg: Any, span: Any) -> Flow[TransactionSendResult]:
        """The send, as steps for a driver: a thread's or an event loop's.

        Everything that decides is here; a driver only waits for what a step names.
        """
        transaction_id = getattr(message, "transaction_id", None)
        id_is_new = not transaction_id
        if id_is_new:
            transaction_id = new_transaction_id()
        half = build_half(
            self._serialization.encoded(message),
            group=self.group,
            topics=self.topics,
            transaction_id=transaction_id,
            born_ms=self.now_ms(),
            id_is_new=id_is_new,
            end_window_ms=self._end_window_ms,
        )
        if span is not tracing.NO_SPAN:
            span.set_attribute("messaging.destination.name", half.real_topic)
            span.set_attribute("outbox.transaction_id", transaction_id)
        traced = tracing.with_trace_context(half.user_headers)
        if traced is not half.user_headers:
            half = dataclasses.replace(half, user_headers=traced)
        # Steps are yielded only to wait: a topic and a size limit known already
        # are read here, so a send to a known topic yields its two writes and
        # its local transaction, and nothing else.
        parts = self.parts
        assert parts is not None
        half_partition = half_partition_for(half.key, transaction_id, parts.half_partitions)
        real: TopicFacts | None = parts.catalog.known(half.real_topic)
        record: OutgoingRecord
        try:
            if real is None:
                real = yield TopicLookup(half.real_topic)
            if half.real_partition is not None and half.real_partition >= real.partitions:
                raise InvalidMessageError(
                    f"message partition {half.real_partition} does not exist: topic "
                    f"{half.real_topic!r} has {real.partitions} partitions"
                )
            if parts.limits.knows_half(half):
                record = parts.limits.fitting_half_record(half, self.topics, half_partition)
            else:
                record = yield FittingHalf(half, half_partition)
        except KafkaUnavailableError as exc:
            if not self.settings.park_when_unavailable or isinstance(exc, ConnectionSecurityError):
                raise
            # Kafka did not tell the topic's facts in time: the send parks with what is
            # known, and the relay checks the record (topic, partition, size) when it
            # publishes it, as it checks every committed event.
            record = parts.limits.parked_half_record(half, self.topics, half_partition)
            return (
                yield from self._parked_steps(message, half, half_partition, record, arg, exc, span)
            )
        try:
            _, half_offset = yield Write.within(record, HalfWriteError, self._half_timeout)
        except HalfWriteError as exc:
            if not (self.settings.park_when_unavailable and exc.retriable):
                raise
            return (
                yield from self._parked_steps(message, half, half_partition, record, arg, exc, span)
            )
        self.metrics.halves_written.inc()
        if half_offset is None and self.settings.park_when_unavailable:
            unknown = HalfWriteError(f"{record.topic}: half stored at an unknown offset")
            return (
                yield from self._parked_steps(
                    message, half, half_partition, record, arg, unknown, span
                )
            )
        if half_offset is None:
            # Stored, but where is unknown: a decision or a transaction log row
            # naming a guessed position would name another transaction's half.
            # Nothing local has run, so the check-back rolls this half back.
            raise HalfWriteError(
                f"{record.topic} partition {half_partition}: half stored, but the broker did not"
                " report its offset (a write retried across a leader change); the local"
                " transaction was not run and the half is left to the check-back"
            )
        if span is not tracing.NO_SPAN:
            span.set_attribute("outbox.half_partition", half_partition)
            span.set_attribute("outbox.half_offset", half_offset)
        log.debug("half written transaction_id=%s offset=%d", transaction_id, half_offset)

        state, local_error = yield from self._local_transaction(
            message, half, half_partition, half_offset, arg, span
        )
        end_status, end_error = yield from self._ends.end(
            half, half_partition, half_offset, half_offset, state, origin="send", parent=span
        )
        return frozen_instance(
            TransactionSendResult,
            {
                "send_status": SendStatus.SEND_OK,
                "transaction_id": transaction_id,
                "half_partition": half_partition,
                "half_offset": half_offset,
                "local_transaction_state": state,
                "end_status": end_status,
                "local_transaction_error": local_error,
                "end_error": end_error,
            },
        )

    def _parked_steps(
        self,
        message: Message,
        half: HalfRecord,
        half_partition: int,
        record: OutgoingRecord,
        arg: Any,
        why: HalfWriteError | KafkaUnavailableError,
        span: Any,
    ) -> Flow[TransactionSendResult]:
        """The send of a half Kafka did not acknowledge in time (or whose topic it did not
        tell in time, the half then never handed to the client): parked in the log row.

        The local transaction runs with the half on its message; the SQL listener keeps
        it in the row it commits, and the checker publishes it from there (a half of its
        own and its COMMIT op in one Kafka transaction). The half handed to the client
        may still be stored later: no op is ever written for it, and its check-back
        answers ROLLBACK (the row is parked), so only the checker's copy is published.
        """
        log.warning(
            "Kafka did not answer in time; parking the event in the transaction log "
            "transaction_id=%s why=%s",
            half.transaction_id,
            why,
        )
        self.metrics.parked.inc()
        if span is not tracing.NO_SPAN:
            span.set_attribute("outbox.parked", True)
        stamped = dataclasses.replace(message, parked_half=encode_parked_half(record))
        state, local_error = yield from self._local_transaction(
            stamped, half, half_partition, None, arg, span
        )
        if state is LocalTransactionState.COMMIT_MESSAGE:
            end_status = EndStatus.PARKED
        elif state is LocalTransactionState.ROLLBACK_MESSAGE:
            end_status = EndStatus.ROLLED_BACK
        else:
            end_status = EndStatus.LEFT_UNKNOWN  # committed or not, the checker drains what is
        return frozen_instance(
            TransactionSendResult,
            {
                "send_status": SendStatus.PARKED,
                "transaction_id": half.transaction_id,
                "half_partition": half_partition,
                "half_offset": None,
                "local_transaction_state": state,
                "end_status": end_status,
                "local_transaction_error": local_error,
                "end_error": None,
            },
        )

    def _local_transaction(
        self,
        message: Message,
        half: HalfRecord,
        half_partition: int,
        half_offset: int | None,
        arg: Any,
        parent: Any,
    ) -> Flow[tuple[LocalTransactionState, BaseException | None]]:
        stamped = _stamped(message, half, half_partition, half_offset)
        recorded: list[BaseException] = []
        # Put back by value, not by token: a caller's transaction block may end in
        # another context than it began (a thread pool's copy), where a token is refused.
        previous = _local_errors.get()
        _local_errors.set(recorded)
        try:
            child = tracing.child_span(parent, tracing.LOCAL_TRANSACTION, half.transaction_id)
            with child as span:
                answer = yield LocalTransaction(stamped, arg)
                if recorded:
                    tracing.fail(span, recorded[-1])
        except Exception as exc:
            log.warning(
                "local transaction raised; state UNKNOW transaction_id=%s error=%r",
                half.transaction_id,
                exc,
            )
            return LocalTransactionState.UNKNOW, exc
        finally:
            _local_errors.set(previous)
        state = as_state(answer, half.transaction_id, "execute_local_transaction")
        return state, (recorded[-1] if recorded else None)


def _raise(error: Exception) -> None:
    raise error


def _stamped(
    message: Message, half: HalfRecord, half_partition: int, half_offset: int | None
) -> Message:
    """``message`` as the listener sees it: the send's transaction id, born time, and the
    half it is about (its partition and offset), which the SQL log records.

    ``dataclasses.replace`` without its per-call field introspection: a copy
    of the instance's fields, four of them set anew. A subclass (which may keep
    fields in slots) goes through ``replace``.
    """
    stamps = {
        "transaction_id": half.transaction_id,
        "born_ms": half.born_ms,
        "half_partition": half_partition,
        "half_offset": half_offset,
    }
    if type(message) is not Message:
        return dataclasses.replace(message, **stamps)
    stamped = object.__new__(type(message))
    fields = stamped.__dict__
    fields.update(message.__dict__)
    fields.update(stamps)
    return stamped
