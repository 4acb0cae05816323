"""A parked send's half, as the transaction log keeps it until the checker drains it.

With ``park_when_unavailable`` a send whose half Kafka did not acknowledge in
time stores the half (every header: transaction id, producer group, real topic,
trace context, user headers) in its log row instead, in the same database
transaction as the business change. The checker reads it back and writes it to
the half topic. The form is the half record's own Kafka form (key, value,
headers) in JSON, each byte string in base64: readable with any SQL console,
and decoded by the same codec as a half read from Kafka, so a parked half is
validated exactly as a stored one.
"""

from __future__ import annotations

import base64
import json

from outbox.protocol.errors import MalformedRecordError
from outbox.protocol.records import HalfRecord, OutgoingRecord, RawRecord

_FORMAT = 1


def encode_parked_half(record: OutgoingRecord) -> bytes:
    """The log row's ``parked_half`` for the half record a send could not get acknowledged."""
    document = {
        "format": _FORMAT,
        "key": _text(record.key),
        "value": _text(record.value),
        "headers": [[name, _text(value)] for name, value in record.headers],
    }
    return json.dumps(document, separators=(",", ":")).encode("ascii")


def decode_parked_half(data: bytes, *, where: str = "transaction log") -> HalfRecord:
    """The half a log row parked; :class:`MalformedRecordError` if it cannot be read."""
    try:
        document = json.loads(data)
        if document.get("format") != _FORMAT:
            raise ValueError(f"format {document.get('format')!r}, expected {_FORMAT}")
        raw = RawRecord(
            topic=where,
            partition=-1,
            offset=-1,
            key=_bytes(document["key"]),
            value=_bytes(document["value"]),
            headers=tuple((str(name), _bytes(value)) for name, value in document["headers"]),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise MalformedRecordError("parked half", "parked_half", str(exc)) from None
    return HalfRecord.from_record(raw)


def _text(value: bytes | None) -> str | None:
    return None if value is None else base64.b64encode(value).decode("ascii")


def _bytes(text: object) -> bytes | None:
    if text is None:
        return None
    if not isinstance(text, str):
        raise TypeError(f"expected base64 text, got {type(text).__name__}")
    return base64.b64decode(text, validate=True)
