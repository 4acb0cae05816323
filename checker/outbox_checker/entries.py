"""Half and op records as the checker reads them, decoded if they could be.

The rounds decide on them (:mod:`outbox_checker.rules`), the readers make them
(:class:`outbox_checker.kafka_reader.KafkaPartitionReader`), and the checkpoint's loader
and the parked sends' drain read them too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from outbox.protocol import HalfRecord, KafkaMessage, MalformedRecordError, OpRecord, RawRecord

log = logging.getLogger("outbox_checker.rules")  # where the rounds have always said it


class HalfEntry:
    """A record of the half partition, decoded (if it can be) the first time it is looked at.

    A round settles most halves by their offset alone: an op already names them
    decided, and RocketMQ's check service skips those without even reading them.
    Under traffic, copying every half out of the client (its headers above all)
    and decoding it was most of a round's CPU, spent on halves it only skipped;
    so an entry made from a client message (:meth:`of_message`, what the rounds'
    reader makes) keeps the message until ``raw``, ``stored_ms``, ``half`` or
    ``error`` is asked for. ``offset`` is known at once.
    """

    __slots__ = ("_decoded", "_error", "_half", "_message", "_raw", "_stored_ms", "offset")

    def __init__(
        self,
        raw: RawRecord,
        stored_ms: int,
        half: HalfRecord | None,
        error: MalformedRecordError | None = None,
    ) -> None:
        """An entry decoded already (``half``, or the ``error`` that kept it from decoding)."""
        self.offset = raw.offset
        self._message: KafkaMessage | None = None
        self._raw: RawRecord | None = raw
        self._stored_ms: int | None = stored_ms
        self._half = half
        self._error = error
        self._decoded = True

    @classmethod
    def of(cls, raw: RawRecord) -> HalfEntry:
        """The entry of a record read already; it is decoded when first looked at."""
        entry = cls._undecoded(raw.offset)
        entry._raw = raw
        return entry

    @classmethod
    def of_message(cls, message: KafkaMessage) -> HalfEntry:
        """The entry of a client message (a ``TopicCursor`` converter), copied out when needed."""
        entry = cls._undecoded(message.offset())
        entry._message = message
        return entry

    @classmethod
    def _undecoded(cls, offset: int | None) -> HalfEntry:
        entry = cls.__new__(cls)
        entry.offset = offset if offset is not None else -1
        entry._message = None
        entry._raw = None
        entry._stored_ms = None
        entry._half = None
        entry._error = None
        entry._decoded = False
        return entry

    @property
    def raw(self) -> RawRecord:
        """The stored record."""
        if self._raw is None:
            assert self._message is not None
            self._raw, self._message = RawRecord.from_kafka(self._message), None
        return self._raw

    @property
    def stored_ms(self) -> int:
        """When the broker stored it (0 if the record has no timestamp)."""
        if self._stored_ms is None:
            self._stored_ms = self.raw.timestamp_ms or 0
        return self._stored_ms

    @property
    def half(self) -> HalfRecord | None:
        """The decoded half, or ``None`` when it did not decode (see :attr:`error`)."""
        if not self._decoded:
            self._decode()
        return self._half

    @property
    def error(self) -> MalformedRecordError | None:
        """Why the record did not decode, if it did not."""
        if not self._decoded:
            self._decode()
        return self._error

    def _decode(self) -> None:
        try:
            self._half, self._error = HalfRecord.read(self.raw), None
        except MalformedRecordError as exc:
            self._half, self._error = None, exc
        self._decoded = True

    def _fields(self) -> tuple[object, ...]:
        return (self.raw, self.stored_ms, self.half, self.error)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, HalfEntry):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash((self.raw, self.stored_ms))

    def __repr__(self) -> str:
        return f"HalfEntry(raw={self.raw!r}, stored_ms={self.stored_ms}, half={self.half!r})"


@dataclass(frozen=True)
class OpEntry:
    """A record of the op partition; ``op`` is ``None`` when it did not decode."""

    offset: int
    op: OpRecord | None

    @classmethod
    def of(cls, raw: RawRecord) -> OpEntry:
        try:
            return cls(raw.offset, OpRecord.from_record(raw))
        except MalformedRecordError as exc:
            log.warning("ignoring a malformed op record: %s", exc)
            return cls(raw.offset, None)
