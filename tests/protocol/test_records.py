"""Every record kind: round trip through its encoding, and every way to garble it."""

import dataclasses

import pytest

from outbox.protocol import (
    CheckRequest,
    Decision,
    DiscardReason,
    DiscardRecord,
    HalfRecord,
    Header,
    MalformedRecordError,
    OpRecord,
    OutgoingRecord,
    RawRecord,
    RealRecord,
    RecordKind,
    Resolution,
    TopicNames,
    half_stored_ms,
    is_reserved,
    new_transaction_id,
    real_record_of_half,
    validate_transaction_id,
)

TOPICS = TopicNames("test")


def stored(record: OutgoingRecord, partition: int | None = None, offset: int = 41) -> RawRecord:
    """What a consumer would read back for ``record``."""
    return RawRecord(
        topic=record.topic,
        partition=record.partition if partition is None else partition,
        offset=offset,
        key=record.key,
        value=record.value,
        headers=tuple(record.headers),
    )


def a_half(**changes) -> HalfRecord:
    fields = dict(
        transaction_id=new_transaction_id(),
        producer_group="orders",
        real_topic="order-events",
        key=b"order-1",
        value=b'{"id": 1}',
        born_ms=1_700_000_000_000,
        user_headers=[("trace", b"abc"), ("trace", b"def"), ("empty", None)],
    )
    fields.update(changes)
    return HalfRecord(**fields)


def with_headers(raw: RawRecord, headers) -> RawRecord:
    return RawRecord(raw.topic, raw.partition, raw.offset, raw.key, raw.value, tuple(headers))


def replace_header(raw: RawRecord, name: str, value) -> RawRecord:
    return with_headers(raw, [(n, value if n == name else v) for n, v in raw.headers])


def drop_header(raw: RawRecord, name: str) -> RawRecord:
    return with_headers(raw, [(n, v) for n, v in raw.headers if n != name])


# --- round trips ------------------------------------------------------------


def test_half_round_trip_keeps_every_field_and_user_header_order():
    half = a_half(real_partition=3, check_times=2, immunity_seconds=60)
    out = half.to_record(TOPICS, half_partition=5)
    assert (out.topic, out.partition, out.key, out.value) == (
        "test.half",
        5,
        b"order-1",
        b'{"id": 1}',
    )
    raw = stored(out)
    assert raw.kind() is RecordKind.HALF
    assert HalfRecord.from_record(raw) == half


def test_half_without_optional_fields_round_trips():
    half = a_half(key=None, value=None, user_headers=[])
    assert HalfRecord.from_record(stored(half.to_record(TOPICS, 0))) == half


def test_put_back_adds_one_check_and_keeps_born_time():
    half = a_half(check_times=4)
    copy = half.put_back(5, None)
    assert (copy.check_times, copy.born_ms, copy.transaction_id) == (
        5,
        half.born_ms,
        half.transaction_id,
    )
    assert half.put_back(5, None).resumed(9).check_times == 0


_EVERY_FIELD_SET = {
    "transaction_id": "tx-9",
    "producer_group": "g",
    "real_topic": "events",
    "key": b"k",
    "value": b"v",
    "born_ms": 11,
    "user_headers": [("trace", b"t")],
    "real_partition": 2,
    "check_times": 3,
    "immunity_seconds": 40,
    "origin_offset": 5,
    "origin_stored_ms": 12,
    "parked_ms": 13,
    "end_window_ms": 14,
}


@pytest.mark.parametrize("decoder", [HalfRecord.from_record, HalfRecord.read])
def test_a_half_with_every_field_set_reads_back_whole_through_both_decoders(decoder):
    half = HalfRecord(**_EVERY_FIELD_SET)
    assert decoder(stored(half.to_record(TOPICS, 1))) == half


@pytest.mark.parametrize("origin", [True, False], ids=["copy of a copy", "copy of the original"])
def test_put_back_carries_every_other_field(origin: bool):
    """``put_back`` names each field (dataclasses.replace cost a walk twice as much): one
    added to HalfRecord must be added there too, or every copy would drop it."""
    assert {f.name for f in dataclasses.fields(HalfRecord)} == set(_EVERY_FIELD_SET), (
        "a new HalfRecord field: give it a value here, and carry it in put_back"
    )
    half = HalfRecord(**{**_EVERY_FIELD_SET, **({} if origin else _NO_ORIGIN)})
    changed = {"check_times": 4}
    if not origin:
        changed |= {"origin_offset": 70, "origin_stored_ms": 80}
    assert half.put_back(70, 80) == dataclasses.replace(half, **changed)
    assert half.requeued(70, 80) == dataclasses.replace(half, **{**changed, "check_times": 3})


_NO_ORIGIN = {"origin_offset": None, "origin_stored_ms": None}


def test_real_record_restores_the_user_record_plus_transaction_headers():
    half = a_half(real_partition=2)
    out = half.to_real_record()
    assert (out.topic, out.partition, out.key, out.value) == (
        "order-events",
        2,
        half.key,
        half.value,
    )
    assert out.headers[:3] == half.user_headers
    real = RealRecord.from_record(stored(out, offset=9))
    assert real.transaction_id == half.transaction_id
    assert real.producer_group == "orders"
    assert real.user_headers == half.user_headers
    assert not any(is_reserved(name) for name, _ in real.user_headers)


def test_real_record_without_partition_lets_kafka_choose():
    assert "partition" not in a_half().to_real_record().produce_kwargs()
    assert a_half().to_record(TOPICS, 4).produce_kwargs()["partition"] == 4


@pytest.mark.parametrize("resolution", list(Resolution))
def test_op_round_trip_goes_to_the_paired_partition(resolution):
    op = OpRecord(new_transaction_id(), "orders", 6, 1234, resolution, 1_700_000_000_500)
    out = op.to_record(TOPICS)
    assert (out.topic, out.partition, out.key) == ("test.op", 6, op.transaction_id.encode())
    assert OpRecord.from_record(stored(out)) == op


def test_check_request_round_trip_reconstructs_the_message():
    request = CheckRequest(a_half(check_times=3), half_partition=1, half_offset=77, requested_ms=5)
    out = request.to_record(TOPICS)
    assert out.topic == "test.check.orders"
    assert (out.key, out.value) == (request.half.key, request.half.value)
    assert CheckRequest.from_record(stored(out, partition=0)) == request


@pytest.mark.parametrize("reason", list(DiscardReason))
def test_discard_round_trip_and_resume(reason):
    half = a_half(check_times=15)
    raw_half = stored(half.to_record(TOPICS, 2), offset=300)
    discard = DiscardRecord.of_half(raw_half, reason, discarded_ms=99, detail="why")
    back = DiscardRecord.from_record(stored(discard.to_record(TOPICS), partition=0))
    assert back == discard
    assert (back.half_partition, back.half_offset, back.reason) == (2, 300, reason)
    assert back.original_half() == half
    assert back.original_half().resumed(back.half_offset).check_times == 0


def test_discard_of_a_malformed_half_keeps_it_verbatim():
    garbage = RawRecord(
        "test.half", 1, 8, b"k", b"v", ((Header.KIND.value, b"half"), ("outbox-check-times", b"x"))
    )
    discard = DiscardRecord.of_half(garbage, DiscardReason.MALFORMED, 1, "check times garbled")
    back = DiscardRecord.from_record(stored(discard.to_record(TOPICS), partition=0))
    assert (back.original_key, back.original_value) == (b"k", b"v")
    assert ("outbox-check-times", b"x") in back.original_headers
    with pytest.raises(MalformedRecordError, match="malformed half record"):
        back.original_half()


def test_transaction_ids_are_unique_and_valid():
    ids = {new_transaction_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(validate_transaction_id(i) == i for i in ids)


# --- malformed input --------------------------------------------------------

HALF_RAW = stored(
    a_half(immunity_seconds=30, real_partition=1, end_window_ms=6_000).to_record(TOPICS, 0)
)


@pytest.mark.parametrize(
    "header",
    [
        Header.KIND,
        Header.TRANSACTION_ID,
        Header.PRODUCER_GROUP,
        Header.REAL_TOPIC,
        Header.BORN_MS,
        Header.CHECK_TIMES,
    ],
)
def test_half_missing_a_required_header_names_it(header):
    with pytest.raises(MalformedRecordError, match=f"{header.value}: is missing") as info:
        HalfRecord.from_record(drop_header(HALF_RAW, header.value))
    assert info.value.field == header.value
    assert (info.value.topic, info.value.partition, info.value.offset) == ("test.half", 0, 41)


@pytest.mark.parametrize(
    "header,value,problem",
    [
        (Header.BORN_MS, b"yesterday", "not an integer"),
        (Header.CHECK_TIMES, b"-1", "below the minimum"),
        (Header.CHECK_TIMES, b"\xff\xfe", "not valid UTF-8"),
        (Header.IMMUNITY_SECONDS, b"1.5", "not an integer"),
        (Header.END_WINDOW_MS, b"6s", "not an integer"),
        (Header.REAL_PARTITION, "٣".encode(), "not an integer"),
        (Header.TRANSACTION_ID, b"has space", "may only hold"),
        (Header.TRANSACTION_ID, b"", "is empty"),
        (Header.TRANSACTION_ID, None, "null value"),
        (Header.REAL_TOPIC, b"bad/topic", "characters Kafka does not allow"),
        (Header.PRODUCER_GROUP, b"x" * 300, "longer than"),
    ],
)
@pytest.mark.parametrize("decoder", [HalfRecord.from_record, HalfRecord.read])
def test_half_with_a_garbled_header_names_it(header, value, problem, decoder):
    with pytest.raises(MalformedRecordError, match=problem) as info:
        decoder(replace_header(HALF_RAW, header.value, value))
    assert info.value.field == header.value
    assert info.value.kind == "half"


def test_repeated_protocol_header_is_malformed():
    raw = with_headers(HALF_RAW, [*HALF_RAW.headers, (Header.CHECK_TIMES.value, b"0")])
    with pytest.raises(MalformedRecordError, match="appears 2 times"):
        HalfRecord.from_record(raw)


@pytest.mark.parametrize(
    "decoder", [OpRecord.from_record, CheckRequest.from_record, DiscardRecord.from_record]
)
def test_a_half_read_as_another_kind_says_what_it_found(decoder):
    with pytest.raises(MalformedRecordError, match=r"expected '.*', found 'half'"):
        decoder(HALF_RAW)


def test_an_unknown_kind_is_malformed_and_has_no_kind():
    raw = replace_header(HALF_RAW, Header.KIND.value, b"nonsense")
    assert raw.kind() is None
    with pytest.raises(MalformedRecordError, match="found 'nonsense'"):
        HalfRecord.from_record(raw)


def test_plain_record_has_no_kind_and_is_not_a_half():
    raw = RawRecord("t", 0, 0, b"k", b"v", ())
    assert raw.kind() is None
    with pytest.raises(MalformedRecordError, match="outbox-kind: is missing"):
        HalfRecord.from_record(raw)


def test_op_with_unknown_resolution_names_it():
    op = OpRecord("tx", "g", 0, 1, Resolution.COMMIT, 2)
    raw = replace_header(stored(op.to_record(TOPICS)), Header.RESOLUTION.value, b"maybe")
    with pytest.raises(MalformedRecordError, match="outbox-resolution: is 'maybe'"):
        OpRecord.from_record(raw)


def test_op_with_negative_offset_names_it():
    op = OpRecord("tx", "g", 0, 1, Resolution.ROLLBACK, 2)
    raw = replace_header(stored(op.to_record(TOPICS)), Header.HALF_OFFSET.value, b"-5")
    with pytest.raises(MalformedRecordError, match="outbox-half-offset"):
        OpRecord.from_record(raw)


def test_check_request_missing_its_half_offset_names_it():
    request = CheckRequest(a_half(), 0, 1, 2)
    raw = drop_header(stored(request.to_record(TOPICS)), Header.HALF_OFFSET.value)
    with pytest.raises(MalformedRecordError, match="outbox-half-offset: is missing"):
        CheckRequest.from_record(raw)


def test_discard_with_unknown_reason_lists_the_valid_ones():
    discard = DiscardRecord.of_half(HALF_RAW, DiscardReason.CHECK_MAX, 1)
    raw = replace_header(
        stored(discard.to_record(TOPICS), 0), Header.DISCARD_REASON.value, b"bored"
    )
    with pytest.raises(MalformedRecordError, match="check-max, retention, malformed"):
        DiscardRecord.from_record(raw)


def test_real_record_without_transaction_id_names_it():
    with pytest.raises(MalformedRecordError, match="outbox-transaction-id: is missing"):
        RealRecord.from_record(RawRecord("orders", 0, 0, b"k", b"v", (("trace", b"x"),)))


def test_internal_record_is_not_a_real_record():
    with pytest.raises(MalformedRecordError, match="not a real record"):
        RealRecord.from_record(HALF_RAW)


@pytest.mark.parametrize("bad", [None, "", 5, "x" * 129, "bad id", "ü"])
def test_validate_transaction_id_rejects(bad):
    with pytest.raises(ValueError, match="transaction id"):
        validate_transaction_id(bad)


def test_header_text_is_lenient_where_decoders_are_strict():
    raw = RawRecord(
        "t",
        0,
        0,
        None,
        None,
        (("a", b"text"), ("empty", b""), ("null", None), ("binary", b"\xff\xfe")),
    )
    assert raw.header_text("a") == "text"
    assert [raw.header_text(n) for n in ("empty", "null", "binary", "absent")] == [None] * 4


def test_a_copy_names_its_origin_and_a_copy_of_a_copy_keeps_it():
    half = a_half()
    assert half.identity(7) == 7
    copy = half.put_back(7, 1_000)
    assert (copy.origin_offset, copy.origin_stored_ms, copy.identity(99)) == (7, 1_000, 7)
    again = copy.put_back(99, 5_000)
    assert (again.origin_offset, again.origin_stored_ms, again.check_times) == (7, 1_000, 2)
    raw = RawRecord(
        "outbox.half",
        0,
        99,
        again.key,
        again.value,
        tuple(again.to_record(TopicNames(), 0).headers),
    )
    assert HalfRecord.from_record(raw).identity(99) == 7


def test_an_op_names_the_identity_of_the_half_it_decides():
    op = OpRecord("tx", "g", 0, 99, Resolution.COMMIT, 2, origin_offset=7)
    raw = RawRecord("outbox.op", 0, 0, None, None, tuple(op.to_record(TopicNames()).headers))
    assert OpRecord.from_record(raw).identity == 7
    assert OpRecord("tx", "g", 0, 99, Resolution.COMMIT, 2).identity == 99


@pytest.mark.parametrize("resolution", list(Resolution))
def test_the_lean_decision_reads_what_the_full_decoder_reads(resolution):
    op = OpRecord("tx-1", "g", 2, 99, resolution, 5, origin_offset=7)
    raw = RawRecord("outbox.op", 2, 0, None, None, tuple(op.to_record(TopicNames()).headers))
    assert Decision.from_record(raw) == Decision("tx-1", 2, 99, 7, resolution is Resolution.COMMIT)
    plain = OpRecord("tx-1", "g", 2, 99, resolution, 5)
    raw = RawRecord("outbox.op", 2, 0, None, None, tuple(plain.to_record(TopicNames()).headers))
    assert Decision.from_record(raw).identity == 99


def test_the_lean_decision_refuses_what_the_full_decoder_refuses():
    op = OpRecord("tx-1", "g", 2, 99, Resolution.COMMIT, 5)
    headers = [(n, v) for n, v in op.to_record(TopicNames()).headers if n != Header.HALF_OFFSET]
    with pytest.raises(MalformedRecordError, match="outbox-half-offset"):
        Decision.from_record(RawRecord("outbox.op", 2, 0, None, None, tuple(headers)))
    twice = [*op.to_record(TopicNames()).headers, (Header.RESOLUTION.value, b"rollback")]
    with pytest.raises(MalformedRecordError, match="appears 2 times"):
        Decision.from_record(RawRecord("outbox.op", 2, 0, None, None, tuple(twice)))


@pytest.mark.parametrize("partition", [None, 1])
def test_the_lean_real_record_is_the_full_decoders_real_record(partition):
    half = a_half().put_back(3, 1_000)
    half = dataclasses.replace(half, real_partition=partition)
    out = half.to_record(TopicNames(), 0)
    raw = RawRecord("outbox.half", 0, 9, out.key, out.value, tuple(out.headers))
    assert real_record_of_half(raw) == (half.transaction_id, half.to_real_record())


def test_the_lean_real_record_refuses_a_half_without_its_real_topic():
    out = a_half().to_record(TopicNames(), 0)
    headers = tuple((n, v) for n, v in out.headers if n != Header.REAL_TOPIC)
    with pytest.raises(MalformedRecordError, match="outbox-real-topic"):
        real_record_of_half(RawRecord("outbox.half", 0, 9, out.key, out.value, headers))


def test_a_requeued_half_keeps_its_identity_and_its_check_count():
    """A half inside its own immunity time is moved to the end unchecked: still the same half."""
    moved = a_half(check_times=2).requeued(11, 4_000)
    assert (moved.identity(50), moved.check_times, moved.origin_stored_ms) == (11, 2, 4_000)


TRACE_HEADERS = [
    ("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
    ("tracestate", b"vendor=abc"),
]


def test_trace_context_headers_ride_every_copy_to_the_real_record():
    """Put-back, check request, discard, resume, relay: the context reaches the real record."""
    half = a_half(user_headers=[("h", b"1"), *TRACE_HEADERS])
    original = stored(half.to_record(TOPICS, 2), offset=10)
    copy = HalfRecord.from_record(original).put_back(10, 1_700_000_001_000)
    stored_copy = stored(copy.to_record(TOPICS, 2), offset=20)
    request = CheckRequest(HalfRecord.from_record(stored_copy), 2, 20, 1_700_000_002_000)
    asked = CheckRequest.from_record(stored(request.to_record(TOPICS), 0, 3))
    assert asked.half.user_headers == [("h", b"1"), *TRACE_HEADERS]
    discard = DiscardRecord.of_half(stored_copy, DiscardReason.CHECK_MAX, 1_700_000_003_000)
    kept = DiscardRecord.from_record(stored(discard.to_record(TOPICS), 0, 4))
    resumed = kept.original_half().resumed(20)
    stored_resumed = stored(resumed.to_record(TOPICS, 2), offset=30)
    _, real = real_record_of_half(stored_resumed)
    assert [h for h in real.headers if not is_reserved(h[0])] == [("h", b"1"), *TRACE_HEADERS]


def test_half_stored_ms_is_the_originals_store_time():
    half = a_half()
    raw = dataclasses.replace(stored(half.to_record(TOPICS, 0)), timestamp_ms=1_700_000_005_000)
    assert half_stored_ms(raw) == 1_700_000_005_000
    copy = half.put_back(41, 1_700_000_005_000)
    later = dataclasses.replace(stored(copy.to_record(TOPICS, 0), offset=50), timestamp_ms=9)
    assert half_stored_ms(later) == 1_700_000_005_000  # not the copy's own store time
    no_store_time = half.put_back(41, None)
    assert half_stored_ms(stored(no_store_time.to_record(TOPICS, 0))) == half.born_ms
    assert half_stored_ms(stored(half.to_record(TOPICS, 0))) == half.born_ms
    assert half_stored_ms(dataclasses.replace(raw, headers=())) == 1_700_000_005_000
    assert half_stored_ms(RawRecord("outbox.half", 0, 1)) is None
