"""The one-pass readers of halves and check requests read what the full decoders read.

``HalfRecord.read`` and ``CheckRequest.read`` are what the checker and the
check responder decode every record with; anything they do not read plainly
goes to ``from_record``. Hypothesis mutates the headers of valid records
(drops, doubles, nulls, garbles, renames, case changes, signs) and each reader
must give the full decoder's value, or raise its error word for word.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from outbox.protocol import (
    CheckRequest,
    HalfRecord,
    MalformedRecordError,
    RawRecord,
    TopicNames,
)

TOPICS = TopicNames("plain")

_VALUES = st.one_of(
    st.none(),
    st.sampled_from(
        [b"", b"0", b"7", b"007", b"-3", b"-0", b"+4", b" 5", b"1_0", b"\xff", b"x", b"half"]
    ),
    st.sampled_from([b"check", b"op", b"orders", b"bad topic", b"a" * 300, b"tx:1", b"\xc3\xa9"]),
    st.binary(max_size=6),
)


@st.composite
def halves(draw: Any) -> HalfRecord:
    optional = st.one_of(st.none(), st.integers(0, 2**40))
    return HalfRecord(
        transaction_id=draw(st.sampled_from(["tx-1", "a.b:c_d", "x" * 128])),
        producer_group=draw(st.sampled_from(["orders", "g.1", "G_2-x"])),
        real_topic=draw(st.sampled_from(["events", "plain.events"])),
        key=draw(st.one_of(st.none(), st.binary(max_size=4))),
        value=draw(st.one_of(st.none(), st.binary(max_size=4))),
        born_ms=draw(st.integers(0, 2**45)),
        user_headers=draw(
            st.lists(
                st.tuples(
                    st.sampled_from(["trace", "Outbox-kind", "OUTBOX-X", "outbox", "é"]),
                    st.one_of(st.none(), st.binary(max_size=3)),
                ),
                max_size=3,
            )
        ),
        real_partition=draw(optional),
        check_times=draw(st.integers(0, 20)),
        immunity_seconds=draw(optional),
        origin_offset=draw(optional),
        origin_stored_ms=draw(optional),
    )


@st.composite
def mutated(draw: Any, headers: list[tuple[str, bytes | None]]) -> tuple[Any, ...]:
    headers = list(headers)
    for _ in range(draw(st.integers(0, 3))):
        if not headers:
            break
        at = draw(st.integers(0, len(headers) - 1))
        name, value = headers[at]
        change = draw(st.sampled_from(["drop", "double", "value", "rename", "upper", "add"]))
        if change == "drop":
            del headers[at]
        elif change == "double":
            headers.insert(at, (name, draw(_VALUES)))
        elif change == "value":
            headers[at] = (name, draw(_VALUES))
        elif change == "rename":
            headers[at] = (draw(st.sampled_from([n for n, _ in headers])), value)
        elif change == "upper":
            headers[at] = (name.upper(), value)
        else:
            headers.insert(at, ("outbox-half-partition", draw(_VALUES)))
    return tuple(headers)


def _outcome(decode: Any, raw: RawRecord) -> Any:
    try:
        return decode(raw)
    except MalformedRecordError as exc:
        return ("malformed", str(exc), exc.field)


@settings(max_examples=400, deadline=None)
@given(half=halves(), data=st.data())
def test_reading_a_half_plainly_is_decoding_it(half: HalfRecord, data: st.DataObject):
    record = half.to_record(TOPICS, 3)
    headers = data.draw(mutated(record.headers))
    raw = RawRecord(TOPICS.half, 3, 11, record.key, record.value, headers, 5)
    assert _outcome(HalfRecord.read, raw) == _outcome(HalfRecord.from_record, raw)


@settings(max_examples=400, deadline=None)
@given(half=halves(), data=st.data())
def test_reading_a_check_request_plainly_is_decoding_it(half: HalfRecord, data: st.DataObject):
    request = CheckRequest(half, 2, data.draw(st.integers(0, 2**40)), 1_800_000_000_000)
    record = request.to_record(TOPICS)
    headers = data.draw(mutated(record.headers))
    raw = RawRecord(record.topic, 0, 4, record.key, record.value, headers, 5)
    assert _outcome(CheckRequest.read, raw) == _outcome(CheckRequest.from_record, raw)


def test_a_half_and_a_request_read_plainly_equal_their_originals():
    half = HalfRecord("tx", "orders", "events", b"k", b"v", 5, [("h", b"1")], 2, 3, 60, 9, 4)
    record = half.to_record(TOPICS, 0)
    assert HalfRecord.read(RawRecord(TOPICS.half, 0, 1, b"k", b"v", tuple(record.headers))) == half
    request = CheckRequest(half, 0, 12, 99)
    out = request.to_record(TOPICS)
    assert CheckRequest.read(RawRecord(out.topic, 0, 0, b"k", b"v", tuple(out.headers))) == request
