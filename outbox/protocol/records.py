"""The record kinds of the protocol, each with one encoder and one decoder.

| kind    | topic                    | key / value          | written by                     |
| ------- | ------------------------ | -------------------- | ------------------------------ |
| half    | ``<prefix>.half``        | the user's           | producer; checker (put-back)   |
| op      | ``<prefix>.op``          | transaction id / -   | producer end; checker (db)     |
| check   | ``<prefix>.check.<grp>`` | the user's           | checker                        |
| discard | ``<prefix>.discard``     | the half's, verbatim | checker                        |
| real    | the user's topic         | the user's           | checker relay (commit op)      |

Everything the protocol needs lives in ``outbox-`` headers, so user payloads are
never wrapped and a real record is a plain record with additive headers.
Decoders take a :class:`RawRecord` (built from a confluent-kafka message or by
hand in tests) and raise :class:`MalformedRecordError` naming the bad field.
"""

from __future__ import annotations

import dataclasses
import os
import string
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, Self, TypeVar

from outbox.protocol.headers import (
    RESERVED_HEADER_PREFIX,
    Header,
    HeaderList,
    HeaderReader,
    int_header,
    is_reserved,
    text_header,
    user_headers,
)
from outbox.protocol.partitioning import op_partition_for_half
from outbox.protocol.topics import TopicNames, validate_producer_group, validate_topic_name

_Frozen = TypeVar("_Frozen")


def frozen_instance(cls: type[_Frozen], fields: dict[str, Any]) -> _Frozen:
    """An instance of the frozen dataclass ``cls`` holding ``fields``, every one of them.

    What ``cls(**fields)`` makes, without its generated ``__init__``, which sets
    each field through ``object.__setattr__``: a send builds five such records,
    and that was a tenth of its Python time. For the exact class only (no
    ``__post_init__``, no slots), with every field given.
    """
    instance = object.__new__(cls)
    instance.__dict__.update(fields)
    return instance


_TRANSACTION_ID_CHARS = frozenset(string.ascii_letters + string.digits + "-_.:")
MAX_TRANSACTION_ID_LENGTH = 128


class RecordKind(StrEnum):
    HALF = "half"
    OP = "op"
    CHECK = "check"
    DISCARD = "discard"
    DISCARD_RESUMED = "discard-resumed"
    """Marker on the discard topic: that discard was resumed (``outbox discard resume``)."""


class Resolution(StrEnum):
    """The outcome an op record records."""

    COMMIT = "commit"
    ROLLBACK = "rollback"


class DiscardReason(StrEnum):
    """Why the checker gave up on a half."""

    CHECK_MAX = "check-max"
    RETENTION = "retention"
    MALFORMED = "malformed"
    UNPUBLISHABLE = "unpublishable"
    """Committed, but its real record cannot be written (topic gone, too large): kept here."""
    OVERSIZE = "oversize"
    """Undecided, but its put-back copy or check request is over a size limit: never asked."""


def new_transaction_id() -> str:
    """A fresh, globally unique transaction id (RocketMQ's ``UNIQ_KEY``).

    ``uuid.uuid4().hex`` without its ``UUID`` object, which cost a send more
    than drawing the bytes: 16 random bytes, version 4 and the RFC 4122 variant
    set, as hex.
    """
    drawn = bytearray(os.urandom(16))
    drawn[6] = drawn[6] & 0x0F | 0x40
    drawn[8] = drawn[8] & 0x3F | 0x80
    return drawn.hex()


def validate_transaction_id(transaction_id: object) -> str:
    """Raise ``ValueError`` unless ``transaction_id`` is a usable id."""
    if not isinstance(transaction_id, str) or not transaction_id:
        raise ValueError(f"transaction id must be a non-empty string, got {transaction_id!r}")
    if len(transaction_id) > MAX_TRANSACTION_ID_LENGTH:
        raise ValueError(f"transaction id is longer than {MAX_TRANSACTION_ID_LENGTH} chars")
    if not _TRANSACTION_ID_CHARS.issuperset(transaction_id):
        raise ValueError(
            f"transaction id {transaction_id[:40]!r} may only hold letters, digits and '-_.:'"
        )
    return transaction_id


class KafkaMessage(Protocol):
    """The parts of ``confluent_kafka.Message`` the decoders read."""

    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def key(self) -> bytes | None: ...
    def value(self) -> bytes | None: ...
    def headers(self) -> list[tuple[str, bytes | None]] | None: ...
    def timestamp(self) -> tuple[int, int]: ...


@dataclass(frozen=True)
class RawRecord:
    """A stored record as read from Kafka, independent of the client library."""

    topic: str
    partition: int
    offset: int
    key: bytes | None = None
    value: bytes | None = None
    headers: tuple[tuple[str, bytes | None], ...] = ()
    timestamp_ms: int | None = None

    @classmethod
    def from_kafka(cls, message: KafkaMessage) -> RawRecord:
        _, timestamp = message.timestamp()
        partition, offset, headers = message.partition(), message.offset(), message.headers()
        return cls(  # every record a checker or relay reads: each accessor asked once
            message.topic() or "",
            partition if partition is not None else -1,
            offset if offset is not None else -1,
            message.key(),
            message.value(),
            tuple(headers) if headers else (),
            timestamp if timestamp > 0 else None,
        )

    def reader(self, kind: RecordKind | str) -> HeaderReader:
        """A header reader whose errors name this record's position."""
        return HeaderReader(
            str(kind), self.headers, topic=self.topic, partition=self.partition, offset=self.offset
        )

    def header_text(self, name: str) -> str | None:
        """One header as text, leniently: ``None`` when absent, null, empty or not UTF-8.

        For tools that report on many records (status counts, discard listings),
        which must not fail on one bad record; decoders use :class:`HeaderReader`.
        """
        for key, value in self.headers:
            if key == name and value is not None:
                try:
                    return value.decode("utf-8") or None
                except UnicodeDecodeError:
                    return None
        return None

    def kind(self) -> RecordKind | None:
        """The ``outbox-kind`` header, or ``None`` for records without a valid one."""
        for name, value in self.headers:
            if name == Header.KIND.value and value is not None:
                try:
                    return RecordKind(value.decode("utf-8"))
                except (UnicodeDecodeError, ValueError):
                    return None
        return None


@dataclass(frozen=True)
class OutgoingRecord:
    """A record ready to hand to a producer."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: HeaderList = field(default_factory=list)
    partition: int | None = None

    def produce_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``confluent_kafka.Producer.produce``."""
        kwargs: dict[str, Any] = {
            "topic": self.topic,
            "key": self.key,
            "value": self.value,
            "headers": self.headers,
        }
        if self.partition is not None:
            kwargs["partition"] = self.partition
        return kwargs


def _check_kind(raw: RawRecord, expected: RecordKind) -> HeaderReader:
    reader = raw.reader(expected)
    found = reader.text(Header.KIND)
    if found != expected.value:
        raise reader.error(Header.KIND.value, f"expected {expected.value!r}, found {found!r}")
    return reader


def _read_transaction_id(reader: HeaderReader) -> str:
    transaction_id = reader.text(Header.TRANSACTION_ID)
    try:
        return validate_transaction_id(transaction_id)
    except ValueError as exc:
        raise reader.error(Header.TRANSACTION_ID.value, str(exc)) from None


def _read_name(reader: HeaderReader, header: Header, validate: Any) -> str:
    name = reader.text(header)
    try:
        return str(validate(name))
    except ValueError as exc:
        raise reader.error(header.value, str(exc)) from None


@dataclass(frozen=True)
class HalfRecord:
    """A prepared message: the user's record, parked until its outcome is known."""

    transaction_id: str
    producer_group: str
    real_topic: str
    key: bytes | None
    value: bytes | None
    born_ms: int
    user_headers: HeaderList = field(default_factory=list)
    real_partition: int | None = None
    check_times: int = 0
    immunity_seconds: int | None = None
    origin_offset: int | None = None
    """Set on put-back copies: offset of the original half (``None`` on the original)."""
    origin_stored_ms: int | None = None
    """Set on put-back copies: the broker's store time of the original half."""
    parked_ms: int | None = None
    """Set on a half drained from the transaction log of a parked send: when it was drained."""
    end_window_ms: int | None = None
    """How long after ``born_ms`` the producer may end the transaction itself (its
    transaction timeout, :attr:`Header.END_WINDOW_MS`); ``None`` on halves written before
    the header existed. The checker asks no sooner."""

    def identity(self, offset: int) -> int:
        """The origin offset of this half, stored at ``offset``: its identity in its partition.

        Decisions, the checker's memory of ended halves and the relay's memory of
        published ones are all keyed on it, never on the transaction id alone: a
        caller may reuse an id after a rollback, and that retry is a new half.
        """
        return self.origin_offset if self.origin_offset is not None else offset

    def to_record(self, topics: TopicNames, half_partition: int) -> OutgoingRecord:
        headers: HeaderList = [_HALF_KIND_HEADER, *self._protocol_headers(), *self.user_headers]
        return frozen_instance(
            OutgoingRecord,
            {
                "topic": topics.half,
                "key": self.key,
                "value": self.value,
                "headers": headers,
                "partition": half_partition,
            },
        )

    def _protocol_headers(self) -> HeaderList:
        # Built inline from the names below rather than through text_header and
        # int_header: every send encodes a half, and these calls were a fifth of it.
        headers: HeaderList = [
            (_TRANSACTION_ID, self.transaction_id.encode("utf-8")),
            (_PRODUCER_GROUP, self.producer_group.encode("utf-8")),
            (_REAL_TOPIC, self.real_topic.encode("utf-8")),
            (_BORN_MS, b"%d" % self.born_ms),
            (_CHECK_TIMES, b"%d" % self.check_times),
        ]
        if self.real_partition is not None:
            headers.append((_REAL_PARTITION, b"%d" % self.real_partition))
        if self.immunity_seconds is not None:
            headers.append((_IMMUNITY_SECONDS, b"%d" % self.immunity_seconds))
        if self.origin_offset is not None:
            headers.append((_ORIGIN_OFFSET, b"%d" % self.origin_offset))
        if self.origin_stored_ms is not None:
            headers.append((_ORIGIN_STORED_MS, b"%d" % self.origin_stored_ms))
        if self.parked_ms is not None:
            headers.append((_PARKED_MS, b"%d" % self.parked_ms))
        if self.end_window_ms is not None:
            headers.append((_END_WINDOW_MS, b"%d" % self.end_window_ms))
        return headers

    @classmethod
    def from_record(cls, raw: RawRecord) -> Self:
        return cls._from_headers(_check_kind(raw, RecordKind.HALF), raw)

    @classmethod
    def read(cls, raw: RawRecord) -> Self:
        """:meth:`from_record` in one pass over the headers: what the checker reads per half.

        A half it cannot read plainly (anything unusual: a duplicate, a null,
        a number with a sign, a name to validate) goes through :meth:`from_record`,
        so a malformed half fails with the same :class:`MalformedRecordError`.
        """
        read = _read_plainly(raw, _HALF_KIND, ())
        if read is None:
            return cls.from_record(raw)
        return read[0]  # type: ignore[return-value]

    @classmethod
    def _from_headers(cls, reader: HeaderReader, raw: RawRecord) -> Self:
        return cls(
            transaction_id=_read_transaction_id(reader),
            producer_group=_read_name(reader, Header.PRODUCER_GROUP, validate_producer_group),
            real_topic=_read_name(reader, Header.REAL_TOPIC, validate_topic_name),
            key=raw.key,
            value=raw.value,
            born_ms=reader.integer(Header.BORN_MS),
            user_headers=user_headers(raw.headers),
            real_partition=reader.optional_integer(Header.REAL_PARTITION),
            check_times=reader.integer(Header.CHECK_TIMES),
            immunity_seconds=reader.optional_integer(Header.IMMUNITY_SECONDS),
            origin_offset=reader.optional_integer(Header.ORIGIN_OFFSET),
            origin_stored_ms=reader.optional_integer(Header.ORIGIN_STORED_MS),
            parked_ms=reader.optional_integer(Header.PARKED_MS),
            end_window_ms=reader.optional_integer(Header.END_WINDOW_MS),
        )

    def put_back(self, offset: int, stored_ms: int | None) -> Self:
        """The copy the checker appends before asking: one more check, same identity.

        ``offset`` and ``stored_ms`` are where and when this half was stored; a
        copy of the original half records them as its origin, a copy of a copy
        keeps the origin it already names.
        """
        return type(self)(  # not dataclasses.replace: once per half checked, at half the cost
            transaction_id=self.transaction_id,
            producer_group=self.producer_group,
            real_topic=self.real_topic,
            key=self.key,
            value=self.value,
            born_ms=self.born_ms,
            user_headers=self.user_headers,
            real_partition=self.real_partition,
            check_times=self.check_times + 1,
            immunity_seconds=self.immunity_seconds,
            origin_offset=self.origin_offset if self.origin_offset is not None else offset,
            origin_stored_ms=(
                self.origin_stored_ms if self.origin_stored_ms is not None else stored_ms
            ),
            parked_ms=self.parked_ms,
            end_window_ms=self.end_window_ms,
        )

    def requeued(self, offset: int, stored_ms: int | None) -> Self:
        """A copy of a half inside its own immunity time: moved unchecked, same identity."""
        return dataclasses.replace(self.put_back(offset, stored_ms), check_times=self.check_times)

    def resumed(self, offset: int, stored_ms: int | None = None) -> Self:
        """The copy ``discard resume`` re-inserts: the check count starts over, same identity."""
        return dataclasses.replace(self.put_back(offset, stored_ms), check_times=0)

    def to_real_record(self) -> OutgoingRecord:
        """The committed event, as the user sent it plus the transaction id header."""
        headers: HeaderList = [
            *self.user_headers,
            text_header(Header.TRANSACTION_ID, self.transaction_id),
            text_header(Header.PRODUCER_GROUP, self.producer_group),
        ]
        return OutgoingRecord(self.real_topic, self.key, self.value, headers, self.real_partition)


@dataclass(frozen=True)
class OpRecord:
    """The outcome of one half, in the op partition paired with its half partition."""

    transaction_id: str
    producer_group: str
    half_partition: int
    half_offset: int
    resolution: Resolution
    ended_ms: int
    origin_offset: int | None = None
    """Identity of the half this decides (``HalfRecord.identity``); None means half_offset."""

    @property
    def identity(self) -> int:
        """The origin offset of the half this op decides: its key in the checker and relay."""
        return self.origin_offset if self.origin_offset is not None else self.half_offset

    def to_record(self, topics: TopicNames) -> OutgoingRecord:
        transaction_id = self.transaction_id.encode("utf-8")
        headers: HeaderList = [  # inline, as HalfRecord._protocol_headers: once per send
            _OP_KIND_HEADER,
            (_TRANSACTION_ID, transaction_id),
            (_PRODUCER_GROUP, self.producer_group.encode("utf-8")),
            (_HALF_PARTITION, b"%d" % self.half_partition),
            (_HALF_OFFSET, b"%d" % self.half_offset),
            (_RESOLUTION, self.resolution.encode("utf-8")),
            (_ENDED_MS, b"%d" % self.ended_ms),
        ]
        if self.origin_offset is not None:
            headers.append((_ORIGIN_OFFSET, b"%d" % self.origin_offset))
        return frozen_instance(
            OutgoingRecord,
            {
                "topic": topics.op,
                "key": transaction_id,
                "value": None,
                "headers": headers,
                "partition": op_partition_for_half(self.half_partition),
            },
        )

    @classmethod
    def from_record(cls, raw: RawRecord) -> Self:
        reader = _check_kind(raw, RecordKind.OP)
        resolution = reader.text(Header.RESOLUTION)
        try:
            parsed = Resolution(resolution)
        except ValueError:
            raise reader.error(
                Header.RESOLUTION.value, f"is {resolution[:40]!r}, expected commit or rollback"
            ) from None
        return cls(
            transaction_id=_read_transaction_id(reader),
            producer_group=_read_name(reader, Header.PRODUCER_GROUP, validate_producer_group),
            half_partition=reader.integer(Header.HALF_PARTITION),
            half_offset=reader.integer(Header.HALF_OFFSET),
            resolution=parsed,
            ended_ms=reader.integer(Header.ENDED_MS),
            origin_offset=reader.optional_integer(Header.ORIGIN_OFFSET),
        )


@dataclass(frozen=True, slots=True)
class Decision:
    """What the relay acts on in an op record, read without the full decoder.

    The relay reads every decision of a busy outbox; the full decoder validates
    every field and builds an :class:`OpRecord` it does not need. This reads
    the five headers a decision needs once, and hands any record it cannot read
    plainly to :meth:`OpRecord.from_record`, so a malformed op fails with the
    same :class:`MalformedRecordError` either way.
    """

    transaction_id: str
    half_partition: int
    half_offset: int
    identity: int
    commit: bool

    @classmethod
    def from_record(cls, raw: RawRecord) -> Decision:
        found = dict(raw.headers)
        try:
            if len(found) != len(raw.headers) or found[_KIND] != _OP_KIND:
                raise ValueError
            resolution = found[_RESOLUTION]
            if resolution not in _RESOLUTIONS:
                raise ValueError
            half_partition, half_offset = found[_HALF_PARTITION], found[_HALF_OFFSET]
            origin = found.get(_ORIGIN_OFFSET, half_offset)
            transaction_id = found[_TRANSACTION_ID]
            if (
                not (half_partition.isdigit() and half_offset.isdigit() and origin.isdigit())
                or not transaction_id
            ):
                raise ValueError
            return cls(
                transaction_id.decode("utf-8"),
                int(half_partition),
                int(half_offset),
                int(origin),
                resolution == _COMMIT,
            )
        except (KeyError, ValueError, AttributeError, UnicodeDecodeError):
            op = OpRecord.from_record(raw)  # names what is wrong, or reads what this could not
            return cls(
                op.transaction_id,
                op.half_partition,
                op.half_offset,
                op.identity,
                op.resolution is Resolution.COMMIT,
            )


def real_record_of_half(raw: RawRecord) -> tuple[str, OutgoingRecord]:
    """The transaction id and the real record of a stored half, as the relay publishes it.

    The same record as ``HalfRecord.from_record(raw).to_real_record()``, read in
    one pass over the headers; a half it cannot read plainly goes through that
    full decoder, which raises :class:`MalformedRecordError` naming the problem.
    """
    wanted: dict[str, bytes | None] = {}
    user: HeaderList = []
    seen = 0
    for name, value in raw.headers:
        if name[:_PREFIX_LENGTH].lower() != RESERVED_HEADER_PREFIX:
            user.append((name, value))
        elif name in _HALF_PUBLISH_HEADERS:
            wanted[name] = value
            seen += 1
    try:
        if seen != len(wanted) or wanted[_KIND] != _HALF_KIND:
            raise ValueError
        transaction_id, group = wanted[_TRANSACTION_ID], wanted[_PRODUCER_GROUP]
        topic = wanted[_REAL_TOPIC]
        partition = wanted.get(_REAL_PARTITION)
        if not (transaction_id and group and topic) or (
            partition is not None and not partition.isdigit()
        ):
            raise ValueError
        record = OutgoingRecord(
            topic.decode("utf-8"),
            raw.key,
            raw.value,
            [*user, (_TRANSACTION_ID, transaction_id), (_PRODUCER_GROUP, group)],
            None if partition is None else int(partition),
        )
        return transaction_id.decode("utf-8"), record
    except (KeyError, ValueError, AttributeError, UnicodeDecodeError):
        half = HalfRecord.from_record(raw)
        return half.transaction_id, half.to_real_record()


def half_stored_ms(raw: RawRecord) -> int | None:
    """When the broker stored the original of a half (for a copy, the time it carries).

    The start of RocketMQ's born-to-finish latency, on the cluster's clock as
    the checker's ages are, so a producer's wrong clock does not skew it. Falls
    back to the producer's born time for a record without a store time; lenient
    (``None``) for a half too broken to say, as the relay reads it after
    :func:`real_record_of_half` accepted it.
    """
    origin = stored = born = None
    for name, value in raw.headers:  # one pass: the relay reads this for every publication
        if name == _ORIGIN_OFFSET:
            origin = value
        elif name == _ORIGIN_STORED_MS:
            stored = value
        elif name == _BORN_MS:
            born = value
    if origin is not None:  # a copy: its own store time is later than the original's
        return _lenient_integer(stored) or _lenient_integer(born)
    return raw.timestamp_ms or _lenient_integer(born)


def _lenient_integer(value: bytes | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None


_KIND = Header.KIND.value
_TRANSACTION_ID = Header.TRANSACTION_ID.value
_PRODUCER_GROUP = Header.PRODUCER_GROUP.value
_REAL_TOPIC = Header.REAL_TOPIC.value
_REAL_PARTITION = Header.REAL_PARTITION.value
_RESOLUTION = Header.RESOLUTION.value
_HALF_PARTITION = Header.HALF_PARTITION.value
_HALF_OFFSET = Header.HALF_OFFSET.value
_ORIGIN_OFFSET = Header.ORIGIN_OFFSET.value
_ORIGIN_STORED_MS = Header.ORIGIN_STORED_MS.value
_PARKED_MS = Header.PARKED_MS.value
_BORN_MS = Header.BORN_MS.value
_CHECK_TIMES = Header.CHECK_TIMES.value
_IMMUNITY_SECONDS = Header.IMMUNITY_SECONDS.value
_END_WINDOW_MS = Header.END_WINDOW_MS.value
_ENDED_MS = Header.ENDED_MS.value
_REQUESTED_MS = Header.REQUESTED_MS.value
_HALF_KIND_HEADER = text_header(Header.KIND, RecordKind.HALF)
_OP_KIND_HEADER = text_header(Header.KIND, RecordKind.OP)
_CHECK_KIND_HEADER = text_header(Header.KIND, RecordKind.CHECK)
_OP_KIND = RecordKind.OP.value.encode()
_HALF_KIND = RecordKind.HALF.value.encode()
_COMMIT = Resolution.COMMIT.value.encode()
_RESOLUTIONS = frozenset(r.value.encode() for r in Resolution)
_PREFIX_LENGTH = len(RESERVED_HEADER_PREFIX)
_HALF_PUBLISH_HEADERS = frozenset(
    (_KIND, _TRANSACTION_ID, _PRODUCER_GROUP, _REAL_TOPIC, _REAL_PARTITION)
)


@dataclass(frozen=True)
class CheckRequest:
    """The checker asking a producer group about one put-back half copy."""

    half: HalfRecord
    half_partition: int
    half_offset: int
    requested_ms: int

    def to_record(self, topics: TopicNames) -> OutgoingRecord:
        half = self.half
        headers: HeaderList = [  # inline, as HalfRecord._protocol_headers: once per half checked
            _CHECK_KIND_HEADER,
            *half._protocol_headers(),
            (_HALF_PARTITION, b"%d" % self.half_partition),
            (_HALF_OFFSET, b"%d" % self.half_offset),
            (_REQUESTED_MS, b"%d" % self.requested_ms),
            *half.user_headers,
        ]
        return OutgoingRecord(topics.check(half.producer_group), half.key, half.value, headers)

    @classmethod
    def read(cls, raw: RawRecord) -> Self:
        """:meth:`from_record` in one pass over the headers (see :meth:`HalfRecord.read`)."""
        read = _read_plainly(raw, _CHECK_KIND, _CHECK_NUMBERS)
        if read is None:
            return cls.from_record(raw)
        half, (half_partition, half_offset, requested_ms) = read
        return cls(half, half_partition, half_offset, requested_ms)

    @classmethod
    def from_record(cls, raw: RawRecord) -> Self:
        reader = _check_kind(raw, RecordKind.CHECK)
        return cls(
            half=HalfRecord._from_headers(reader, raw),
            half_partition=reader.integer(Header.HALF_PARTITION),
            half_offset=reader.integer(Header.HALF_OFFSET),
            requested_ms=reader.integer(Header.REQUESTED_MS),
        )


_CHECK_KIND = RecordKind.CHECK.value.encode()
_CHECK_NUMBERS = (_HALF_PARTITION, _HALF_OFFSET, Header.REQUESTED_MS.value)
_HALF_NAMES = frozenset(
    (
        _KIND,
        _TRANSACTION_ID,
        _PRODUCER_GROUP,
        _REAL_TOPIC,
        _BORN_MS,
        _CHECK_TIMES,
        _REAL_PARTITION,
        _IMMUNITY_SECONDS,
        _ORIGIN_OFFSET,
        _ORIGIN_STORED_MS,
        _PARKED_MS,
        _END_WINDOW_MS,
    )
)
_CHECK_NAMES = _HALF_NAMES | frozenset(_CHECK_NUMBERS)
_VALID_NAMES: dict[bytes, str] = {}
"""Producer groups and topic names seen valid: a backlog names a few, over and over."""


def _valid_name(value: bytes | None, validate: Any) -> str:
    name = _VALID_NAMES.get(value)  # type: ignore[arg-type]
    if name is None:
        if value is None:
            raise ValueError
        name = validate(value.decode("utf-8"))
        if len(_VALID_NAMES) >= 4096:
            _VALID_NAMES.clear()
        _VALID_NAMES[value] = name
    return name


def _plain_integer(value: bytes | None) -> int:
    """A header number written plainly (decimal digits); ``ValueError`` for anything else."""
    if value is None or not value.isdigit():
        raise ValueError
    return int(value)


def _read_plainly(
    raw: RawRecord, kind: bytes, numbers: tuple[str, ...]
) -> tuple[HalfRecord, tuple[int, ...]] | None:
    """The half a half record or check request carries, and the ``numbers`` headers it has,
    read in one pass; ``None`` when anything is unusual (the full decoder then says what)."""
    wanted = _CHECK_NAMES if numbers else _HALF_NAMES
    found: dict[str, bytes | None] = {}
    user: HeaderList = []
    for name, value in raw.headers:
        if name in wanted:
            if name in found:
                return None
            found[name] = value
        elif not is_reserved(name):
            user.append((name, value))
    try:
        if found[_KIND] != kind:
            return None
        transaction_id = found[_TRANSACTION_ID]
        if transaction_id is None:
            return None
        real_partition = found.get(_REAL_PARTITION, _ABSENT)
        immunity = found.get(_IMMUNITY_SECONDS, _ABSENT)
        origin = found.get(_ORIGIN_OFFSET, _ABSENT)
        origin_stored = found.get(_ORIGIN_STORED_MS, _ABSENT)
        parked = found.get(_PARKED_MS, _ABSENT)
        end_window = found.get(_END_WINDOW_MS, _ABSENT)
        half = HalfRecord(
            transaction_id=validate_transaction_id(transaction_id.decode("utf-8")),
            producer_group=_valid_name(found[_PRODUCER_GROUP], validate_producer_group),
            real_topic=_valid_name(found[_REAL_TOPIC], validate_topic_name),
            key=raw.key,
            value=raw.value,
            born_ms=_plain_integer(found[_BORN_MS]),
            user_headers=user,
            real_partition=None if real_partition is _ABSENT else _plain_integer(real_partition),
            check_times=_plain_integer(found[_CHECK_TIMES]),
            immunity_seconds=None if immunity is _ABSENT else _plain_integer(immunity),
            origin_offset=None if origin is _ABSENT else _plain_integer(origin),
            origin_stored_ms=None if origin_stored is _ABSENT else _plain_integer(origin_stored),
            parked_ms=None if parked is _ABSENT else _plain_integer(parked),
            end_window_ms=None if end_window is _ABSENT else _plain_integer(end_window),
        )
        return half, tuple(_plain_integer(found[name]) for name in numbers)
    except (KeyError, ValueError, UnicodeDecodeError):
        return None


_ABSENT: Any = object()
"""A stand-in for a header that is not there (``None`` is a header's null value)."""


# Headers a discard record sets itself; any copy of them among the original
# half's headers (a malformed half may carry anything) is dropped.
_DISCARD_OWN_HEADERS = frozenset(
    h.value
    for h in (
        Header.KIND,
        Header.HALF_PARTITION,
        Header.HALF_OFFSET,
        Header.DISCARD_REASON,
        Header.DISCARD_DETAIL,
        Header.DISCARDED_MS,
    )
)


@dataclass(frozen=True)
class DiscardRecord:
    """A half the checker gave up on, kept verbatim so it can be resumed.

    It holds the original key, value and headers rather than a decoded
    :class:`HalfRecord`, because a half discarded as malformed does not decode.
    """

    half_partition: int
    half_offset: int
    reason: DiscardReason
    discarded_ms: int
    original_key: bytes | None = None
    original_value: bytes | None = None
    original_headers: HeaderList = field(default_factory=list)
    detail: str | None = None

    @classmethod
    def of_half(
        cls, raw: RawRecord, reason: DiscardReason, discarded_ms: int, detail: str | None = None
    ) -> Self:
        kept = [(name, value) for name, value in raw.headers if name not in _DISCARD_OWN_HEADERS]
        return cls(
            half_partition=raw.partition,
            half_offset=raw.offset,
            reason=reason,
            discarded_ms=discarded_ms,
            original_key=raw.key,
            original_value=raw.value,
            original_headers=kept,
            detail=detail,
        )

    def to_record(self, topics: TopicNames) -> OutgoingRecord:
        headers: HeaderList = [
            text_header(Header.KIND, RecordKind.DISCARD),
            int_header(Header.HALF_PARTITION, self.half_partition),
            int_header(Header.HALF_OFFSET, self.half_offset),
            text_header(Header.DISCARD_REASON, self.reason),
            int_header(Header.DISCARDED_MS, self.discarded_ms),
        ]
        if self.detail:
            headers.append(text_header(Header.DISCARD_DETAIL, self.detail[:1000]))
        headers.extend(self.original_headers)
        return OutgoingRecord(topics.discard, self.original_key, self.original_value, headers)

    @classmethod
    def from_record(cls, raw: RawRecord) -> Self:
        reader = _check_kind(raw, RecordKind.DISCARD)
        reason = reader.text(Header.DISCARD_REASON)
        try:
            parsed = DiscardReason(reason)
        except ValueError:
            choices = ", ".join(r.value for r in DiscardReason)
            raise reader.error(
                Header.DISCARD_REASON.value, f"is {reason[:40]!r}, expected one of {choices}"
            ) from None
        return cls(
            half_partition=reader.integer(Header.HALF_PARTITION),
            half_offset=reader.integer(Header.HALF_OFFSET),
            reason=parsed,
            discarded_ms=reader.integer(Header.DISCARDED_MS),
            original_key=raw.key,
            original_value=raw.value,
            original_headers=[(n, v) for n, v in raw.headers if n not in _DISCARD_OWN_HEADERS],
            detail=reader.optional_text(Header.DISCARD_DETAIL),
        )

    def original_half(self) -> HalfRecord:
        """The discarded half, decoded; raises if it was discarded as malformed."""
        raw = RawRecord(
            topic="(discarded half)",
            partition=self.half_partition,
            offset=self.half_offset,
            key=self.original_key,
            value=self.original_value,
            headers=(text_header(Header.KIND, RecordKind.HALF), *self.original_headers),
        )
        return HalfRecord.from_record(raw)


@dataclass(frozen=True)
class RealRecord:
    """A committed event as it stands on its real topic."""

    topic: str
    partition: int
    offset: int
    transaction_id: str
    producer_group: str | None
    key: bytes | None
    value: bytes | None
    user_headers: HeaderList

    @classmethod
    def from_record(cls, raw: RawRecord) -> Self:
        reader = raw.reader("real")
        if raw.kind() is not None:
            raise reader.error(Header.KIND.value, f"is {raw.kind()!r}: not a real record")
        group = reader.optional_text(Header.PRODUCER_GROUP)
        return cls(
            topic=raw.topic,
            partition=raw.partition,
            offset=raw.offset,
            transaction_id=_read_transaction_id(reader),
            producer_group=group,
            key=raw.key,
            value=raw.value,
            user_headers=user_headers(raw.headers),
        )
