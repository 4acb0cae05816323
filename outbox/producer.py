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

This module holds the API a service uses: the producer, its listener's protocol,
and the checks of the arguments both producers share. What it drives lives
beside it: the send core and flow (:mod:`outbox.send_flow`), the end
(:mod:`outbox.end_flow`), the check answers (:mod:`outbox.check_answers`), the
steps and their drivers (:mod:`outbox.flow_steps`), the parts on Kafka
(:mod:`outbox.kafka_parts`) and the seams between them (:mod:`outbox.seams`).
"""

from __future__ import annotations

import inspect
import logging
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Executor
from types import TracebackType
from typing import Any, Protocol, Self

from pydantic import ValidationError

from outbox.caller_transaction import CallerTransaction
from outbox.config import settings_error
from outbox.errors import ConfigurationError, ListenerMissingError
from outbox.flow_steps import run_blocking
from outbox.kafka_parts import KafkaParts
from outbox.message import LocalTransactionState, Message, TransactionSendResult
from outbox.protocol import validate_producer_group
from outbox.seams import PartsSource
from outbox.send_flow import SendCore, record_local_transaction_error
from outbox.serialization import Serialization, SerializerLike
from outbox.settings import ProducerSettings

__all__ = [
    "TransactionListener",
    "TransactionProducer",
    "chosen_settings",
    "record_local_transaction_error",
    "require_listener",
    "send_core",
]

log = logging.getLogger(__name__)


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


class TransactionProducer:
    """Sends messages whose publication is tied to a local transaction.

    Thread-safe: any number of threads may call :meth:`send_message_in_transaction`.
    ``key_serializer`` / ``value_serializer`` turn typed keys and values into
    bytes for their real topic before the half is written (:mod:`outbox.serialization`).
    ``parts`` is where :meth:`start` takes the Kafka clients it sends with
    (:class:`~outbox.seams.PartsSource`): by default the cluster of ``settings``;
    the in-memory producers of :mod:`outbox.testing` pass theirs.
    """

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
        parts: PartsSource | None = None,
    ) -> None:
        validate_producer_group(group)
        require_listener(listener)
        self.settings = chosen_settings(settings, config)
        self._core = send_core(
            group,
            listener,
            self.settings,
            check_executor,
            clock=clock,
            key_serializer=key_serializer,
            value_serializer=value_serializer,
            parts=parts,
        )
        self.group = group
        self.topics = self.settings.topics
        self._listener_checked: object = None

    @property
    def config(self) -> ProducerSettings:
        """:attr:`settings` under its former name."""
        return self.settings

    @property
    def listener(self) -> TransactionListener:
        """The listener the sends and checks ask; may be replaced (checked at the next send)."""
        return self._core.listener  # type: ignore[no-any-return]

    @listener.setter
    def listener(self, listener: TransactionListener) -> None:
        self._core.listener = listener

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Self:
        """Connect, check the outbox topics, and start answering check requests."""
        self._core.start()
        return self

    def shutdown(self, timeout: float = 30.0) -> None:
        """Refuse new sends, finish the ends under way, deliver queued oneway ops, close.

        Idempotent.
        """
        self._core.shutdown(timeout)

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
        core = self._core
        listener = core.listener
        if listener is not self._listener_checked:  # reassigned since it was checked
            require_listener(listener)
            self._listener_checked = listener
        core.admit()
        try:
            return run_blocking(core.send(message, arg), core.take)
        finally:
            core.release()

    def transaction(self, message: Message) -> CallerTransaction:
        """The send with the caller's own database transaction as its local transaction.

        ``with producer.transaction(message) as txn:`` writes the half on entry;
        ``txn.join(session)`` puts the log row into the caller's SQLAlchemy
        session; the decision follows what the database did with it
        (:mod:`outbox.caller_transaction`). Needs a ``SqlTransactionListener``.
        """
        return CallerTransaction(self._core, message)


def send_core(
    group: str,
    listener: Any,
    settings: ProducerSettings,
    check_executor: Executor | None,
    *,
    clock: Callable[[], float],
    key_serializer: SerializerLike | None,
    value_serializer: SerializerLike | None,
    parts: PartsSource | None,
    ask: Callable[[Message], object] | None = None,
) -> SendCore:
    """The send core of a producer whose group and listener were checked already, on the
    parts of ``parts`` (by default Kafka's: :class:`~outbox.kafka_parts.KafkaParts`)."""
    _require_parking_listener(listener, settings)
    if parts is not None and not all(
        callable(getattr(parts, method, None)) for method in ("open", "close")
    ):
        raise ConfigurationError(
            f"parts must be a PartsSource (open(core) and close(timeout)), such as "
            f"outbox.testing.InMemoryParts; got {parts!r}"
        )
    serialization = Serialization(key_serializer, value_serializer)
    return SendCore(
        group,
        listener,
        settings,
        clock=clock,
        serialization=serialization,
        parts_source=parts if parts is not None else KafkaParts(settings, group, check_executor),
        ask=ask,
    )


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


def require_listener(listener: object, *, awaited: bool = False) -> None:
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


def _require_parking_listener(listener: object, settings: ProducerSettings) -> None:
    """``park_when_unavailable`` keeps the event in the transaction log: a SQL listener's."""
    if settings.park_when_unavailable and not getattr(listener, "parks_events", False):
        raise ConfigurationError(
            "park_when_unavailable keeps a parked event in the transaction-log row of its "
            "local transaction, so it needs a SqlTransactionListener (or the asyncio one); "
            f"got {type(listener).__name__}: use one, or turn park_when_unavailable off"
        )
