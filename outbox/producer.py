"""``TransactionProducer``: RocketMQ's ``TransactionMQProducer``, on Kafka.

The send flow is RocketMQ's (``DefaultMQProducerImpl#sendMessageInTransaction``):
write the half and wait for its acknowledgement; run the local transaction;
write the decision as an op record (COMMIT or ROLLBACK; nothing for UNKNOW).
Halves and ops go through one idempotent ``acks=all`` producer
(:mod:`outbox.acked_writer`); there are no Kafka transactions here.

The producer never writes the real record: the checker's relay reads the op
topic and publishes each committed half exactly once, keeping the first
decision it sees for a half. So there is one publisher, whether the decision
came from this send or from a check-back answer, and a crash between the half
and its op leaves a half the checker resolves by asking.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from contextlib import AbstractContextManager
from contextvars import ContextVar
from functools import partial
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from pydantic import ValidationError

from outbox import metrics, tracing
from outbox.access import connect, raise_if_group_refused
from outbox.acked_writer import AckedWriter, Acknowledgement, wait_acknowledged
from outbox.admin import TopicSpec, ensure_topics, read_topic_states
from outbox.caller_transaction import CallerTransaction
from outbox.check_responder import CheckResponder
from outbox.config import settings_error
from outbox.errors import (
    ConfigurationError,
    EndTransactionError,
    HalfWriteError,
    InvalidMessageError,
    KafkaUnavailableError,
    LateEndRefusedError,
    ListenerMissingError,
    NotAuthorizedError,
    OutboxError,
    ProducerClosedError,
    ProducerNotStartedError,
    TopicAdminError,
    TopicMismatchError,
)
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
    OpRecord,
    OutgoingRecord,
    Resolution,
    half_partition_for,
    new_transaction_id,
    validate_producer_group,
)
from outbox.protocol.parked import encode_parked_half
from outbox.protocol.records import frozen_instance
from outbox.send_flow import (
    FittingHalf,
    Flow,
    LocalTransaction,
    Step,
    TopicLookup,
    Write,
    run_blocking,
    run_blocking_together,
)
from outbox.serialization import Serialization, SerializerLike
from outbox.settings import ProducerSettings
from outbox.size_limits import SizeLimits
from outbox.topic_catalog import TopicCatalog, TopicFacts
from outbox.validation import build_half

log = logging.getLogger(__name__)
_T = TypeVar("_T")


class TransactionListener(Protocol):
    """The application's side of a transaction (RocketMQ's ``TransactionListener``)."""

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        """Run the local transaction of ``message``; say whether it committed.

        An exception counts as UNKNOW. To roll back and still report why, catch
        it, call :func:`record_local_transaction_error` and answer ROLLBACK_MESSAGE.
        """
        ...

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        """Say whether the local transaction of ``message`` committed (check-back)."""
        ...


_RESOLUTIONS = {
    LocalTransactionState.COMMIT_MESSAGE: Resolution.COMMIT,
    LocalTransactionState.ROLLBACK_MESSAGE: Resolution.ROLLBACK,
}

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


class TransactionProducer:
    """Sends messages whose publication is tied to a local transaction.

    Thread-safe: any number of threads may call :meth:`send_message_in_transaction`.
    ``key_serializer`` / ``value_serializer`` turn typed keys and values into
    bytes for their real topic before the half is written (:mod:`outbox.serialization`).
    """

    _awaits_listener = False
    """Whether the listener's methods are coroutine functions (the asyncio producer's core)."""

    def __init__(
        self,
        group: str,
        listener: TransactionListener,
        settings: ProducerSettings | None = None,
        check_executor: Executor | None = None,
        *,
        config: ProducerSettings | None = None,
        clock: Callable[[], float] = time.time,
        key_serializer: SerializerLike | None = None,
        value_serializer: SerializerLike | None = None,
    ) -> None:
        validate_producer_group(group)
        _require_listener(listener, awaited=self._awaits_listener)
        self.settings = chosen_settings(settings, config)
        _require_parking_listener(listener, self.settings)
        self._serialization = Serialization(key_serializer, value_serializer)
        self.group = group
        self.listener = listener
        self._listener_checked: object = None
        self.topics = self.settings.topics
        self._half_timeout = _half_timeout(self.settings)
        self._clock = clock
        self._own_executor = check_executor is None
        self._check_executor = check_executor or ThreadPoolExecutor(
            self.settings.check_threads, thread_name_prefix=f"outbox-check-{group}"
        )
        self._admission = threading.Lock()
        """Held to admit or release a send; taken directly there (a C-level ``with``)."""
        self._state_lock = threading.Condition(self._admission)
        self._started = False
        self._closed = False
        self._in_flight = 0
        self._half_partitions = 0
        self._catalog: TopicCatalog | None = None
        self._limits: SizeLimits | None = None
        self._writer: AckedWriter | None = None
        self._responder: CheckResponder | None = None
        self._metrics = metrics.GroupMetrics(group)

    @property
    def config(self) -> ProducerSettings:
        """:attr:`settings` under its former name."""
        return self.settings

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Self:
        """Connect, check the outbox topics, and start answering check requests."""
        with self._state_lock:
            if self._closed:
                raise ProducerClosedError("this producer was shut down; create a new one")
            if self._started:
                return self
        timeout = self.settings.start_timeout_seconds
        client_config = self.settings.client_config()
        admin = connect(client_config, self.settings, self.settings.bootstrap_servers, timeout)
        try:
            self._inspect_topics(admin, timeout)
        except NotAuthorizedError as exc:
            raise exc.by(self.settings.principal) from None
        self._catalog = TopicCatalog(admin, timeout, self.settings.principal)
        self._limits = SizeLimits(self._catalog, client_config)
        try:
            self._writer = AckedWriter(client_config)
            self._responder = CheckResponder(
                client_config,
                topic=self.topics.check(self.group),
                consumer_group=self.topics.check(self.group),
                producer_group=self.group,
                answer=self._answer_checks,
                executor=self._check_executor,
                capacity=self.settings.check_threads + self.settings.check_queue_size,
                tasks=self.settings.check_threads,
                ttl_ms=self.settings.check_request_ttl_seconds * 1000,
                now_ms=self._now_ms,
            )
            self._responder.start()
        except KafkaException as exc:
            self._close_parts(timeout)
            raise KafkaUnavailableError(f"could not start the producer: {exc}") from None
        except BaseException:
            self._close_parts(timeout)
            raise
        with self._state_lock:
            self._started = True
        log.info("transaction producer started group=%s", self.group)
        return self

    def _inspect_topics(self, admin: AdminClient, timeout: float) -> None:
        half, op = self.topics.half, self.topics.op
        states = read_topic_states(admin, [half, op], timeout=timeout)
        missing = [name for name, state in states.items() if not state.exists]
        if missing:
            raise TopicAdminError(
                f"outbox topic(s) {', '.join(missing)} do not exist: run "
                f"`outbox topics create --prefix {self.topics.prefix} --partitions N` first"
            )
        if states[half].partitions != states[op].partitions:
            raise TopicMismatchError(
                f"{half} has {states[half].partitions} partitions but {op} has "
                f"{states[op].partitions}; they must match"
            )
        self._half_partitions = states[half].partitions
        check = TopicSpec(self.topics.check(self.group), self._half_partitions)
        ensure_topics(admin, [check], timeout=timeout)
        raise_if_group_refused(admin, check.name, timeout)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Refuse new sends, finish the ends under way, deliver queued oneway ops, close.

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
        self._close_parts(timeout)
        log.info("transaction producer shut down group=%s", self.group)

    def _close_parts(self, timeout: float) -> None:
        if self._responder is not None:
            self._responder.stop(timeout)
        if self._own_executor:
            self._check_executor.shutdown(wait=True)
        if self._writer is not None:
            self._writer.close(timeout)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ sending

    def send_message_in_transaction(
        self, message: Message, arg: Any = None
    ) -> TransactionSendResult:
        """Write the half, run the local transaction, write its decision op; see the module docs.

        Raises on bad input, a producer not started or shut down, or a half
        that was not stored (the local transaction then never runs). A failed
        or late end is reported on the result, not raised: the checker resolves
        the transaction by check-back. By default the call returns once the op
        is acknowledged; with ``end_oneway`` right after handing it over.
        """
        if self.listener is not self._listener_checked:  # reassigned since it was checked
            _require_listener(self.listener)
            self._listener_checked = self.listener
        self._admit()
        try:
            return self._run(self._send_flow(message, arg))
        finally:
            self._release()

    def transaction(self, message: Message) -> CallerTransaction:
        """The send with the caller's own database transaction as its local transaction.

        ``with producer.transaction(message) as txn:`` writes the half on entry;
        ``txn.join(session)`` puts the log row into the caller's SQLAlchemy
        session; the decision follows what the database did with it
        (:mod:`outbox.caller_transaction`). Needs a ``SqlTransactionListener``.
        """
        return CallerTransaction(self, message)

    def _admit(self) -> None:
        """Count a send as under way (shutdown waits for it), if the producer takes sends.

        Each :meth:`_admit` is followed by one :meth:`_release`, in a ``finally``.
        """
        with self._admission:
            if self._closed:
                raise ProducerClosedError("this producer was shut down; no message was sent")
            if not self._started:
                raise ProducerNotStartedError("call start() before sending; no message was sent")
            self._in_flight += 1

    def _release(self) -> None:
        with self._admission:
            self._in_flight -= 1
            if self._closed:  # only a shutdown waits for the count
                self._state_lock.notify_all()

    def _run(self, flow: Flow[_T]) -> _T:
        """Carry out ``flow`` in this thread, blocking at each step."""
        return run_blocking(flow, self._take)

    def _take(self, step: Step) -> Any:
        """What ``step`` gives the flow, once this thread has waited for it."""
        assert self._catalog and self._limits and self._writer
        if isinstance(step, Write):
            acknowledgement = self._writer.submit(step.record, step.deadline, step.failure)
            if not step.wait:
                return acknowledgement
            return wait_acknowledged(
                acknowledgement, step.record, step.timeout, step.deadline, step.failure
            )
        if isinstance(step, TopicLookup):
            return self._catalog.get(step.topic)
        if isinstance(step, FittingHalf):
            return self._limits.fitting_half_record(step.half, self.topics, step.half_partition)
        return self.listener.execute_local_transaction(step.message, step.arg)

    def _send_flow(self, message: Message, arg: Any) -> Flow[TransactionSendResult]:
        """The send in its span, whose trace context the half carries to the real record.

        With no span to record (no OpenTelemetry, or no SDK) the steps are the
        flow itself, not wrapped in a generator that only passes them on.
        """
        if not tracing.recording():
            return self._send_steps(message, arg, tracing.NO_SPAN)
        return self._traced_send_flow(message, arg)

    def _traced_send_flow(self, message: Message, arg: Any) -> Flow[TransactionSendResult]:
        attributes = {"messaging.system": "kafka", "outbox.producer_group": self.group}
        with tracing.span(tracing.SEND, "PRODUCER", attributes) as span:
            result = yield from self._send_steps(message, arg, span)
            span.set_attribute(
                "outbox.local_transaction_state", result.local_transaction_state.value
            )
            span.set_attribute("outbox.end_status", result.end_status.value)
            return result

    def _send_steps(self, message: Message, arg: Any, span: Any) -> Flow[TransactionSendResult]:
        """The send, as steps for a driver: this thread's (:meth:`_run`) or an event loop's.

        Everything that decides (validation, the order of the writes, the
        outcome, the result) is here, so both drivers give the same results
        and raise the same errors; a driver only waits for what a step names.
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
            born_ms=self._now_ms(),
            id_is_new=id_is_new,
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
        assert self._catalog and self._limits
        real: TopicFacts | None = self._catalog.known(half.real_topic)
        if real is None:
            real = yield TopicLookup(half.real_topic)
        if half.real_partition is not None and half.real_partition >= real.partitions:
            raise InvalidMessageError(
                f"message partition {half.real_partition} does not exist: topic "
                f"{half.real_topic!r} has {real.partitions} partitions"
            )
        half_partition = half_partition_for(half.key, transaction_id, self._half_partitions)
        record: OutgoingRecord
        if self._limits.knows_half(half):
            record = self._limits.fitting_half_record(half, self.topics, half_partition)
        else:
            record = yield FittingHalf(half, half_partition)
        try:
            _, half_offset = yield self._write(record, HalfWriteError, timeout=self._half_timeout)
        except HalfWriteError as exc:
            if not (self.settings.park_when_unavailable and exc.retriable):
                raise
            return (
                yield from self._parked_steps(message, half, half_partition, record, arg, exc, span)
            )
        self._metrics.halves_written.inc()
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
        end_status, end_error = yield from self._end(
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

    def _write(
        self,
        record: OutgoingRecord,
        failure: type[OutboxError],
        wait: bool = True,
        timeout: float | None = None,
    ) -> Write:
        timeout = self.settings.send_timeout_seconds if timeout is None else timeout
        return Write(record, failure, timeout, time.monotonic() + timeout, wait)

    def _parked_steps(
        self,
        message: Message,
        half: HalfRecord,
        half_partition: int,
        record: OutgoingRecord,
        arg: Any,
        why: HalfWriteError,
        span: Any,
    ) -> Flow[TransactionSendResult]:
        """The send of a half Kafka did not acknowledge in time: parked in the log row.

        The local transaction runs with the half on its message; the SQL listener keeps
        it in the row it commits, and the checker publishes it from there (a half of its
        own and its COMMIT op in one Kafka transaction). The half handed to the client
        may still be stored later: no op is ever written for it, and its check-back
        answers ROLLBACK (the row is parked), so only the checker's copy is published.
        """
        log.warning(
            "half not acknowledged in time; parking the event in the transaction log "
            "transaction_id=%s why=%s",
            half.transaction_id,
            why,
        )
        self._metrics.parked.inc()
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
            with _child_span(parent, tracing.LOCAL_TRANSACTION, half.transaction_id) as span:
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
        state = _as_state(answer, half.transaction_id, "execute_local_transaction")
        return state, (recorded[-1] if recorded else None)

    # ------------------------------------------------------------------ ending

    def _end(
        self,
        half: HalfRecord,
        half_partition: int,
        half_offset: int,
        origin_offset: int,
        state: LocalTransactionState,
        *,
        origin: str,
        parent: Any,
    ) -> Flow[tuple[EndStatus, BaseException | None]]:
        """Write the decision on ``half`` (the copy at ``half_offset``) as an op, if it has one.

        ``origin_offset`` is the half's identity, which the relay keys decisions on;
        ``parent`` the span of the send or check (no end span under :data:`~tracing.NO_SPAN`).
        Not a generator itself: it returns the flow of the end, which for a send
        with no span is :meth:`_write_decision`'s, with no layer to pass its steps on.
        """
        resolution = _RESOLUTIONS.get(state)
        if resolution is None:
            self._metrics.child(metrics.UNKNOWNS, origin).inc()
            log.info("transaction left unknown transaction_id=%s", half.transaction_id)
            return _ended(EndStatus.LEFT_UNKNOWN, None)
        decision = self._write_decision(
            half, half_partition, half_offset, origin_offset, resolution, origin
        )
        if parent is tracing.NO_SPAN:
            return decision
        return self._end_in_span(decision, half.transaction_id, resolution, origin, parent)

    def _end_in_span(
        self,
        decision: Flow[tuple[EndStatus, BaseException | None]],
        transaction_id: str,
        resolution: Resolution,
        origin: str,
        parent: Any,
    ) -> Flow[tuple[EndStatus, BaseException | None]]:
        with _child_span(parent, tracing.END, transaction_id, resolution, origin) as span:
            status, error = yield from decision
            if span is not tracing.NO_SPAN:
                span.set_attribute("outbox.end_status", status.value)
                if error is not None:
                    tracing.fail(span, error)
            return status, error

    def _write_decision(
        self,
        half: HalfRecord,
        half_partition: int,
        half_offset: int,
        origin_offset: int,
        resolution: Resolution,
        origin: str,
    ) -> Flow[tuple[EndStatus, BaseException | None]]:
        if origin == "send":
            # RocketMQ 5.1.1's rule, checked once before the op is written: past
            # the window a check may already have answered, and the relay keeps
            # the first decision, so a late COMMIT after a ROLLBACK answer would
            # be silently ignored. Refusing it tells the caller instead.
            remaining = self._seconds_left_to_end(half)
            if remaining <= 0:
                error = LateEndRefusedError(
                    f"local transaction ended {-remaining:.1f}s past the direct-end window; "
                    "left to the check-back"
                )
                self._metrics.child(metrics.END_FAILURES, "late").inc()
                log.warning("late end refused transaction_id=%s", half.transaction_id)
                return EndStatus.REFUSED_LATE, error
        op = frozen_instance(
            OpRecord,
            {
                "transaction_id": half.transaction_id,
                "producer_group": self.group,
                "half_partition": half_partition,
                "half_offset": half_offset,
                "resolution": resolution,
                "ended_ms": self._now_ms(),
                "origin_offset": origin_offset,
            },
        )
        started = time.monotonic()
        oneway = origin == "send" and self.settings.end_oneway
        try:
            # A parking send waits for its op no longer than for its half: a lost or late op
            # is the check-back's to stand in for (a late one records the same decision).
            timeout = self._half_timeout if origin == "send" else None
            written = yield self._write(
                op.to_record(self.topics), EndTransactionError, not oneway, timeout
            )
        except EndTransactionError as exc:
            self._metrics.child(metrics.END_FAILURES, "failed").inc()
            log.error("end failed transaction_id=%s error=%s", half.transaction_id, exc)
            return EndStatus.FAILED, exc
        if oneway:
            written.add_done_callback(_OnewayReport(self._metrics, half.real_topic, op, started))
            return EndStatus.SENT_ONEWAY, None
        _count_end(self._metrics, half.real_topic, resolution, origin, started)
        if resolution is Resolution.COMMIT:
            return EndStatus.COMMITTED, None
        return EndStatus.ROLLED_BACK, None

    def _seconds_left_to_end(self, half: HalfRecord) -> float:
        """Time left before RocketMQ 5.1.1 would refuse this producer's own end."""
        window = max(float(half.immunity_seconds or 0), self.settings.transaction_timeout_seconds)
        age = self._clock() - half.born_ms / 1000
        return window - self.settings.late_end_margin_seconds - age

    def _answer_check(self, request: CheckRequest) -> None:
        """Run on the check executor: ask the listener, write its answer as an op on the copy.

        The op names the copy it answers and the original's offset (the identity
        the relay keys decisions on); it is always acknowledged, never oneway.
        """
        half = request.half
        attributes = {
            "messaging.system": "kafka",
            "messaging.destination.name": half.real_topic,
            "outbox.producer_group": self.group,
            "outbox.transaction_id": half.transaction_id,
            "outbox.check_times": half.check_times,
        }
        with tracing.span(
            tracing.CHECK, "CONSUMER", attributes, parent_headers=half.user_headers
        ) as span:
            self._answer_check_in_span(request, span)

    def _answer_checks(self, requests: list[CheckRequest]) -> None:
        """Run on the check executor: answer a batch of checks as :meth:`_answer_check` does
        each, their ops written together and their acknowledgements awaited together.

        Spans are opened and closed one check at a time, so with tracing on
        the checks are answered one by one.
        """
        if tracing.recording():
            for request in requests:
                self._answer_one(request)
            return
        flows = [self._check_flow(request, tracing.NO_SPAN) for request in requests]
        failures = run_blocking_together(flows, self._start, self._take)
        for failure in failures:
            if failure is not None:
                log.error("answering a check request failed", exc_info=failure)

    def _answer_one(self, request: CheckRequest) -> None:
        try:
            self._answer_check(request)
        except Exception:
            log.exception("answering a check request failed")

    def _start(self, step: Step) -> Callable[[], Any]:
        """What waits for ``step``'s outcome, a write handed to the client already."""
        if not isinstance(step, Write) or not step.wait:
            return partial(self._take, step)
        assert self._writer
        try:
            acknowledgement = self._writer.submit(step.record, step.deadline, step.failure)
        except Exception as exc:
            return partial(_raise, exc)
        record, timeout, deadline, failure = step.record, step.timeout, step.deadline, step.failure
        return partial(wait_acknowledged, acknowledgement, record, timeout, deadline, failure)

    def _answer_check_in_span(self, request: CheckRequest, span: Any) -> None:
        self._run(self._check_flow(request, span))

    def _check_flow(self, request: CheckRequest, span: Any) -> Flow[Any]:
        """The listener's answer to ``request``, then its op on the copy (if it has one)."""
        half = request.half
        identity = half.identity(request.half_offset)
        message = Message(
            topic=half.real_topic,
            value=half.value if half.value is not None else b"",
            key=half.key,
            headers=list(half.user_headers),
            partition=half.real_partition,
            check_immunity_seconds=half.immunity_seconds,
            transaction_id=half.transaction_id,
            check_times=half.check_times,
            born_ms=half.born_ms,
            half_partition=request.half_partition,
            half_offset=identity,
        )
        try:
            answer = self._ask_listener(message)
            state = _as_state(answer, half.transaction_id, "check_local_transaction")
        except Exception as exc:
            log.exception(
                "check_local_transaction raised; answering UNKNOW transaction_id=%s",
                half.transaction_id,
            )
            tracing.fail(span, exc)
            state = LocalTransactionState.UNKNOW
        span.set_attribute("outbox.local_transaction_state", state.value)
        self._metrics.child(metrics.CHECKS_ANSWERED, state.value).inc()
        log.info("check answered transaction_id=%s state=%s", half.transaction_id, state.value)
        return (
            yield from self._end(
                half,
                request.half_partition,
                request.half_offset,
                identity,
                state,
                origin="check",
                parent=span,
            )
        )

    def _ask_listener(self, message: Message) -> object:
        """The listener's answer to a check, on a check executor thread."""
        return self.listener.check_local_transaction(message)

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)


def _raise(error: Exception) -> None:
    raise error


def _ended(
    status: EndStatus, error: BaseException | None
) -> Flow[tuple[EndStatus, BaseException | None]]:
    """The flow of an end with nothing to write: no step, its outcome at once."""
    return status, error
    yield  # a generator, which finishes at its first step


def _count_end(
    group: metrics.GroupMetrics,
    real_topic: str,
    resolution: Resolution,
    origin: str,
    started: float,
) -> None:
    group.end_latency.observe(time.monotonic() - started)
    counter = metrics.COMMITS if resolution is Resolution.COMMIT else metrics.ROLLBACKS
    group.child(counter, real_topic, origin).inc()


class _OnewayReport:
    """Learns, on the client's thread, whether a oneway op was stored (watching its report).

    The caller has returned already, so a lost op can only be logged and
    counted; the half then has no op and the checker resolves it by check-back.
    """

    __slots__ = ("metrics", "op", "real_topic", "started")

    def __init__(
        self, group: metrics.GroupMetrics, real_topic: str, op: OpRecord, started: float
    ) -> None:
        self.metrics = group
        self.real_topic = real_topic
        self.op = op
        self.started = started

    def __call__(self, acknowledgement: Acknowledgement) -> None:
        error = acknowledgement.exception()
        if error is None:
            _count_end(self.metrics, self.real_topic, self.op.resolution, "send", self.started)
            return
        self.metrics.child(metrics.END_FAILURES, "oneway").inc()
        log.warning(
            "oneway end not delivered; left to the check-back transaction_id=%s error=%s",
            self.op.transaction_id,
            error,
        )


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


def _child_span(
    parent: Any,
    name: str,
    transaction_id: str,
    resolution: Resolution | None = None,
    origin: str | None = None,
) -> AbstractContextManager[Any]:
    """A span of the send or check ``parent``: none at all when ``parent`` records nothing."""
    if parent is tracing.NO_SPAN:
        return tracing.NO_SPAN_BLOCK
    attributes: dict[str, tracing.AttributeValue] = {"outbox.transaction_id": transaction_id}
    if resolution is not None and origin is not None:
        attributes["outbox.resolution"] = resolution.value
        attributes["outbox.origin"] = origin
    return tracing.span(name, attributes=attributes)


def chosen_settings(
    settings: ProducerSettings | None, config: ProducerSettings | None
) -> ProducerSettings:
    """The producer's settings: ``settings``, or ``config`` (its former name, still
    accepted with a ``DeprecationWarning``), else read from the environment."""
    if config is not None:
        if settings is not None:
            raise ConfigurationError("give settings= only: config= is its former name")
        warnings.warn(
            "the producer's config= parameter is now settings=",
            DeprecationWarning,
            stacklevel=3,
        )
        settings = config
    if settings is not None:
        return settings
    try:
        return ProducerSettings()  # type: ignore[call-arg]
    except ValidationError as exc:
        raise settings_error(exc, ProducerSettings) from None


def _require_listener(listener: object, *, awaited: bool = False) -> None:
    """A listener with both methods, coroutine functions exactly when the producer awaits them."""
    kind = "an AsyncTransactionListener with async def" if awaited else "a TransactionListener with"
    for method in ("execute_local_transaction", "check_local_transaction"):
        function = getattr(listener, method, None)
        if not callable(function):
            raise ListenerMissingError(f"{kind} {method}() is required, got {listener!r}")
        if inspect.iscoroutinefunction(function) != awaited:
            fix = (
                "AsyncTransactionProducer awaits its listener, and a blocking one would stall "
                "the event loop: make it async def, or use TransactionProducer"
                if awaited
                else "an async listener needs AsyncTransactionProducer"
            )
            raise ListenerMissingError(
                f"{method}() of {listener!r} is {'not ' if awaited else ''}a coroutine "
                f"function: {fix}"
            )


def _half_timeout(settings: ProducerSettings) -> float:
    """How long a send waits for its half: ``park_after_seconds`` when it may park."""
    if settings.park_when_unavailable:
        return min(settings.park_after_seconds, settings.send_timeout_seconds)
    return settings.send_timeout_seconds


def _require_parking_listener(listener: object, settings: ProducerSettings) -> None:
    """``park_when_unavailable`` keeps the event in the transaction log: a SQL listener's."""
    if settings.park_when_unavailable and not getattr(listener, "parks_events", False):
        raise ConfigurationError(
            "park_when_unavailable keeps a parked event in the transaction-log row of its "
            "local transaction, so it needs a SqlTransactionListener (or the asyncio one); "
            f"got {type(listener).__name__}: use one, or turn park_when_unavailable off"
        )


def _as_state(answer: object, transaction_id: str, method: str) -> LocalTransactionState:
    if isinstance(answer, LocalTransactionState):
        return answer
    if answer is not None:
        log.warning(
            "%s returned %r, not a LocalTransactionState; treating as UNKNOW transaction_id=%s",
            method,
            answer,
            transaction_id,
        )
    return LocalTransactionState.UNKNOW
