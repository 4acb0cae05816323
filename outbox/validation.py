"""Turning a user's :class:`Message` into a half record, or a clear refusal.

Everything is checked before anything is written: a message refused here
leaves no trace on any topic.
"""

from __future__ import annotations

from collections.abc import Mapping

from outbox.errors import InvalidMessageError
from outbox.message import HeadersInput, Message
from outbox.protocol import (
    RESERVED_HEADER_PREFIX,
    HalfRecord,
    TopicNames,
    is_reserved,
    validate_topic_name,
    validate_transaction_id,
)
from outbox.protocol.headers import HeaderList
from outbox.protocol.records import frozen_instance

_REAL_TOPICS_PASSED: set[tuple[str, str]] = set()
"""(topic, outbox prefix) pairs whose topic passed :func:`_check_real_topic`: a send
to a topic seen before skips its name checks. Bounded by :data:`_REAL_TOPICS_KEPT`."""
_REAL_TOPICS_KEPT = 4096


def _as_bytes(value: object, what: str, *, allow_none: bool) -> bytes | None:
    if value is None:
        if allow_none:
            return None
        raise InvalidMessageError(f"message {what} is missing (None)")
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    raise InvalidMessageError(
        f"message {what} must be bytes or str, got {type(value).__name__}"
        " (serialise it first, e.g. json.dumps(...).encode())"
    )


def _user_headers(headers: HeadersInput) -> HeaderList:
    if type(headers) is tuple and not headers:  # a Message's default: no headers
        return []
    items = headers.items() if isinstance(headers, Mapping) else headers
    result: HeaderList = []
    try:
        pairs = list(items)
    except TypeError:
        raise InvalidMessageError(
            "message headers must be a mapping or (name, value) pairs,"
            f" got {type(headers).__name__}"
        ) from None
    for pair in pairs:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise InvalidMessageError(f"message header {pair!r} is not a (name, value) pair")
        name, value = pair
        if not isinstance(name, str) or not name:
            raise InvalidMessageError(f"message header name {name!r} must be a non-empty str")
        if is_reserved(name):
            raise InvalidMessageError(
                f"message header {name!r} uses the reserved prefix {RESERVED_HEADER_PREFIX!r}"
            )
        result.append((name, _as_bytes(value, f"header {name!r}", allow_none=True)))
    return result


def build_half(
    message: Message,
    *,
    group: str,
    topics: TopicNames,
    transaction_id: str,
    born_ms: int,
    id_is_new: bool = False,
    end_window_ms: int | None = None,
) -> HalfRecord:
    """The half record for ``message``; raises :class:`InvalidMessageError` on bad input.

    ``end_window_ms``: the producer's transaction timeout, carried on the half so the
    checker asks about it no sooner (:attr:`~outbox.protocol.Header.END_WINDOW_MS`).

    ``id_is_new``: ``transaction_id`` was just drawn by
    :func:`~outbox.protocol.new_transaction_id`, valid by construction, so not checked again.
    """
    if not isinstance(message, Message):
        raise InvalidMessageError(f"expected an outbox.Message, got {type(message).__name__}")
    if message.parked_half is not None:
        raise InvalidMessageError(
            "message.parked_half is set by the producer on a parked send, never by a caller: "
            "send the message without it"
        )
    topic = message.topic
    if type(topic) is not str or (topic, topics.prefix) not in _REAL_TOPICS_PASSED:
        _check_real_topic(topic, topics)
    partition = message.partition
    if partition is not None and (not isinstance(partition, int) or partition < 0):
        raise InvalidMessageError(f"message partition must be an int >= 0, got {partition!r}")
    immunity = message.check_immunity_seconds
    if immunity is not None and (
        isinstance(immunity, bool) or not isinstance(immunity, int) or immunity < 0
    ):
        raise InvalidMessageError(
            f"check_immunity_seconds must be a whole number >= 0, got {immunity!r}"
        )
    if not id_is_new:
        try:
            validate_transaction_id(transaction_id)
        except ValueError as exc:
            raise InvalidMessageError(str(exc)) from None
    return frozen_instance(
        HalfRecord,
        {
            "transaction_id": transaction_id,
            "producer_group": group,
            "real_topic": topic,
            "key": _as_bytes(message.key, "key", allow_none=True),
            "value": _as_bytes(message.value, "value", allow_none=False),
            "born_ms": born_ms,
            "user_headers": _user_headers(message.headers),
            "real_partition": partition,
            "check_times": 0,
            "immunity_seconds": immunity,
            "origin_offset": None,
            "origin_stored_ms": None,
            "parked_ms": None,
            "end_window_ms": end_window_ms,
        },
    )


def _check_real_topic(topic: object, topics: TopicNames) -> None:
    """Refuse a topic a message may not name: not a Kafka name, or one of the outbox's own."""
    if not isinstance(topic, str) or not topic:
        raise InvalidMessageError("message topic is missing")
    try:
        validate_topic_name(topic, "message topic")
    except ValueError as exc:
        raise InvalidMessageError(str(exc)) from None
    if topics.is_internal(topic):
        raise InvalidMessageError(
            f"message topic {topic!r} is an internal outbox topic; send to a real topic"
        )
    if len(_REAL_TOPICS_PASSED) < _REAL_TOPICS_KEPT:
        _REAL_TOPICS_PASSED.add((topic, topics.prefix))
