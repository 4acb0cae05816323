"""The producer's public value types, named after RocketMQ's.

``Message``, ``LocalTransactionState`` and ``TransactionSendResult`` mirror
``org.apache.rocketmq.common.message.Message``, ``LocalTransactionState`` and
``TransactionSendResult``, so a RocketMQ user finds what they expect.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from outbox.protocol import HalfRecord

HeaderValue: TypeAlias = bytes | str | None
HeadersInput: TypeAlias = Mapping[str, HeaderValue] | Iterable[tuple[str, HeaderValue]]


class LocalTransactionState(Enum):
    """What the local transaction (or a check of it) concluded."""

    COMMIT_MESSAGE = "COMMIT_MESSAGE"
    ROLLBACK_MESSAGE = "ROLLBACK_MESSAGE"
    UNKNOW = "UNKNOW"
    # RocketMQ spells it UNKNOW; the correct spelling is accepted too.
    UNKNOWN = "UNKNOW"


class SendStatus(Enum):
    """Whether the half record was stored (RocketMQ's ``SendStatus``)."""

    SEND_OK = "SEND_OK"
    PARKED = "PARKED"
    """``park_when_unavailable``: Kafka did not acknowledge the half in time, so the event
    went into the transaction-log row, in the local transaction; the checker publishes it
    from there once Kafka takes writes again (``half_offset`` is then ``None``)."""


class EndStatus(Enum):
    """What happened to the end step (the decision op) of a transaction.

    COMMITTED and ROLLED_BACK mean the decision is durable on the op topic; the
    checker's relay publishes a committed record from there, so the real topic
    may show it a moment later.
    """

    COMMITTED = "COMMITTED"
    ROLLED_BACK = "ROLLED_BACK"
    SENT_ONEWAY = "SENT_ONEWAY"
    """``end_oneway``: the decision op was handed to the client, not yet acknowledged.

    If it is lost, the failure is logged and the checker resolves the
    transaction by check-back, as RocketMQ does after ``endTransactionOneway``.
    """
    LEFT_UNKNOWN = "LEFT_UNKNOWN"
    """The local transaction said UNKNOW: nothing was written, the checker will ask."""
    REFUSED_LATE = "REFUSED_LATE"
    """Too late to end it ourselves (RocketMQ 5.1.1's rule): left to the check-back."""
    PARKED = "PARKED"
    """The send was parked and its local transaction committed: the event is in the
    transaction log, and the checker publishes it once Kafka takes writes again."""
    FAILED = "FAILED"
    """Writing the decision op failed or timed out; the error is on the result.

    The checker resolves the transaction by check-back (a timed-out op may also
    still land, recording the same decision).
    """


@dataclass(frozen=True)
class Message:
    """A record to publish on ``topic`` once its local transaction commits.

    ``transaction_id`` may be set by the caller (an idempotency key of its own);
    otherwise the producer assigns one, and the message handed to the listener
    carries it. ``check_times`` and ``born_ms`` are filled in on messages the
    listener receives for a check.

    ``half_partition`` and ``half_offset`` are filled in on every message the
    listener receives: the identity of the half record it is asked about (its
    half partition and its origin offset, the same on every copy of it). A
    reused ``transaction_id`` names several halves; a listener that answers a
    check by id must commit only the half whose local transaction committed,
    as :class:`outbox.sql.SqlTransactionListener` does by recording it.
    """

    topic: str
    value: bytes | str
    key: bytes | str | None = None
    headers: HeadersInput = ()
    partition: int | None = None
    check_immunity_seconds: int | None = None
    transaction_id: str | None = None
    check_times: int = 0
    born_ms: int | None = None
    half_partition: int | None = None
    half_offset: int | None = None
    parked_half: bytes | None = field(default=None, repr=False)
    """Set by a producer with ``park_when_unavailable`` on the message its listener gets
    when the half was not acknowledged in time (``half_offset`` is then ``None``): the half
    record, which the SQL listener stores in the log row for the checker to publish."""


def checked_message(half: HalfRecord, half_partition: int, half_offset: int) -> Message:
    """The message a check-back asks about, as its listener sees it: ``half`` is the put-back
    copy stored at ``half_offset`` of ``half_partition``, and the message's ``half_offset``
    is the half's identity (its original's offset), which the transaction log keys on.

    One definition for the producers' check answers and the checker's answers from the
    database, so both ask the transaction log the same question.
    """
    return Message(
        topic=half.real_topic,
        value=half.value if half.value is not None else b"",
        key=half.key,
        headers=list(half.user_headers),
        partition=half.real_partition,
        check_immunity_seconds=half.immunity_seconds,
        transaction_id=half.transaction_id,
        check_times=half.check_times,
        born_ms=half.born_ms,
        half_partition=half_partition,
        half_offset=half.identity(half_offset),
    )


@dataclass(frozen=True)
class TransactionSendResult:
    """The outcome of :meth:`TransactionProducer.send_message_in_transaction`."""

    send_status: SendStatus
    transaction_id: str
    half_partition: int
    half_offset: int | None
    """Where the half was stored; ``None`` for a send parked in the transaction log."""
    local_transaction_state: LocalTransactionState
    end_status: EndStatus
    local_transaction_error: BaseException | None = field(default=None, repr=False)
    """What the local transaction raised, if it raised (the state is then UNKNOW)."""
    end_error: BaseException | None = field(default=None, repr=False)
    """Why the end step failed or was refused, if it did."""
