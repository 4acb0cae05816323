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
) -> HalfRecord:
    """The half record for ``message``; raises :class:`InvalidMessageError` on bad input."""
    if not isinstance(message, Message):
        raise InvalidMessageError(f"expected an outbox.Message, got {type(message).__name__}")
    topic = message.topic
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
    try:
        validate_transaction_id(transaction_id)
    except ValueError as exc:
        raise InvalidMessageError(str(exc)) from None
    return HalfRecord(
        transaction_id=transaction_id,
        producer_group=group,
        real_topic=topic,
        key=_as_bytes(message.key, "key", allow_none=True),
        value=_as_bytes(message.value, "value", allow_none=False),
        born_ms=born_ms,
        user_headers=_user_headers(message.headers),
        real_partition=partition,
        immunity_seconds=immunity,
    )
