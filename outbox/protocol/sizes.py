"""How large the records a half becomes can grow, so a size check covers every one of them.

A message is refused at the door when any record the protocol will later make of
it would be refused by Kafka: the half itself, its put-back copy and the check
request about that copy (their headers grow), the real record, and its discard
record (which adds a reason and a detail). Otherwise the checker or the relay
would meet a record it cannot write, long after the producer said yes.
"""

from __future__ import annotations

from collections.abc import Iterator

from outbox.protocol.records import (
    CheckRequest,
    DiscardReason,
    DiscardRecord,
    HalfRecord,
    OutgoingRecord,
    RawRecord,
)
from outbox.protocol.topics import TopicNames

RECORD_FRAMING_BYTES = 100
"""What a record's framing in its batch adds beyond key, value and headers (a safe round figure)."""
HEADER_FRAMING_BYTES = 10
"""What each header's framing (two varint lengths) adds at most."""
_WIDEST = 2**63 - 1
"""The widest offset or timestamp a header can carry: the derived records' worst case."""
_WIDEST_DETAIL = "x" * 1000
"""The longest discard detail the protocol writes."""


def record_size(record: OutgoingRecord | RawRecord) -> int:
    """An upper bound of the bytes ``record`` takes in a batch (what both limits measure)."""
    headers = sum(
        len(name) + len(value or b"") + HEADER_FRAMING_BYTES for name, value in record.headers
    )
    return len(record.key or b"") + len(record.value or b"") + headers + RECORD_FRAMING_BYTES


def records_a_half_becomes(
    half: HalfRecord, topics: TopicNames, half_partition: int
) -> Iterator[tuple[str, OutgoingRecord]]:
    """Each kind of record ``half`` can become, at its largest, named for an error message."""
    record = half.to_record(topics, half_partition)
    yield "half record", record
    copy = half.put_back(_WIDEST, _WIDEST)
    yield "put-back copy", copy.to_record(topics, half_partition)
    yield "check request", CheckRequest(copy, half_partition, _WIDEST, _WIDEST).to_record(topics)
    yield "real record", half.to_real_record()
    stored = RawRecord(
        topics.half, half_partition, _WIDEST, record.key, record.value, tuple(record.headers)
    )
    discard = DiscardRecord.of_half(stored, DiscardReason.CHECK_MAX, _WIDEST, _WIDEST_DETAIL)
    yield "discard record", discard.to_record(topics)
