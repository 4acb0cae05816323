"""Typed events: a producer's key and value serializers, applied as confluent-kafka applies them.

``Message.key`` and ``value`` may be any object when the producer has a
serializer for them: a ``confluent_kafka.serialization.Serializer`` (a Schema
Registry's Avro, JSON Schema or Protobuf serializer, ``StringSerializer``...)
or a plain callable. Each runs once, before the half is written, with a
``SerializationContext`` naming the message's *real* topic: a Schema Registry
serializer registers and looks its subject up under ``<real topic>-value``
(``TopicNameStrategy``), never under the half topic the bytes are parked in,
and the relay later publishes those very bytes to the real topic, so any
consumer of it deserializes them with the same registry.

A serializer that writes headers (confluent-kafka's header schema id) writes
them to the message's headers, which travel with the half to the real record.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

from confluent_kafka.serialization import MessageField, SerializationContext, Serializer

from outbox.errors import ConfigurationError, InvalidMessageError
from outbox.message import Message

SerializerLike: TypeAlias = Serializer | Callable[..., Any]
"""A confluent-kafka ``Serializer``, ``f(obj, ctx)`` or ``f(obj)``: bytes, str or None out."""


class MessageSerializationError(InvalidMessageError):
    """A key or value serializer failed or returned no bytes; nothing was written."""


class _Field:
    """One serializer, called the way it takes its arguments: (obj, ctx) or (obj)."""

    __slots__ = ("call", "field", "name", "serializer")

    def __init__(self, serializer: SerializerLike, field: str, name: str) -> None:
        if not callable(serializer):
            raise ConfigurationError(
                f"{name} must be a confluent_kafka Serializer or a callable, "
                f"got {type(serializer).__name__}"
            )
        self.serializer = serializer
        self.field = field
        self.name = name
        self.call: Callable[[Any, SerializationContext], Any]
        if isinstance(serializer, Serializer) or _takes_context(serializer):
            self.call = serializer
        else:
            self.call = lambda obj, _ctx: serializer(obj)

    def apply(self, obj: object, topic: str, headers: list[tuple[str, Any]]) -> bytes | str | None:
        context = SerializationContext(topic, self.field, headers)
        try:
            out = self.call(obj, context)
        except Exception as exc:
            raise MessageSerializationError(
                f"{self.name} failed for topic {topic!r}: {exc!r}; nothing was sent"
            ) from exc
        if out is None or isinstance(out, bytes | str):
            return out
        raise MessageSerializationError(
            f"{self.name} returned {type(out).__name__} for topic {topic!r}, "
            "expected bytes (or str, or None); nothing was sent"
        )


def _takes_context(function: Callable[..., Any]) -> bool:
    """Whether ``function`` accepts two positional arguments (the object and its context)."""
    try:
        inspect.signature(function).bind(None, None)
    except TypeError:
        return False
    except ValueError:  # no signature to read (some builtins): called as f(obj)
        return False
    return True


class Serialization:
    """The producer's serializers, turning a typed message into the bytes its half carries."""

    __slots__ = ("key", "value")

    def __init__(
        self,
        key_serializer: SerializerLike | None = None,
        value_serializer: SerializerLike | None = None,
    ) -> None:
        self.key = (
            None
            if key_serializer is None
            else _Field(key_serializer, MessageField.KEY, "key_serializer")
        )
        self.value = (
            None
            if value_serializer is None
            else _Field(value_serializer, MessageField.VALUE, "value_serializer")
        )

    def encoded(self, message: Message) -> Message:
        """``message`` with its key and value serialized for its real topic.

        Without serializers, or for input that is not a well-formed message
        (the half's validation then names what is wrong), ``message`` itself.
        A key of None stays None: no key.
        """
        if (self.key is None and self.value is None) or not isinstance(message, Message):
            return message
        headers = _header_list(message.headers)
        if headers is None or not isinstance(message.topic, str):
            return message
        key, value = message.key, message.value
        if self.key is not None and key is not None:
            key = self.key.apply(key, message.topic, headers)
        if self.value is not None:
            value = self.value.apply(value, message.topic, headers)
            if value is None:
                raise MessageSerializationError(
                    f"value_serializer returned None for topic {message.topic!r}: "
                    "a transactional message needs a value; nothing was sent"
                )
        return dataclasses.replace(message, key=key, value=value, headers=headers)


def _header_list(headers: object) -> list[tuple[str, Any]] | None:
    """The headers as a list a serializer may append to; None when they are not a list of pairs."""
    try:
        items = headers.items() if isinstance(headers, Mapping) else headers
        return list(items)  # type: ignore[call-overload]
    except TypeError:
        return None
