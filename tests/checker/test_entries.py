"""A half is copied out of the client and decoded only when a round looks past its offset.

Under traffic a round meets mostly halves an op has decided already, and skips them
by offset (RocketMQ's check service does not even read them); copying each one's
headers out of the client and decoding it was most of a round's CPU.
"""

from __future__ import annotations

from outbox.protocol import MalformedRecordError, RawRecord, Resolution
from outbox_checker.entries import HalfEntry
from outbox_checker.rules import StopReason
from tests.checker.memory_log import TOPICS, MemoryLog, a_half, stored_raw
from tests.checker.test_rules import run


class CountingMessage:
    """A client message (what ``RawRecord.from_kafka`` reads) counting its header copies."""

    def __init__(self, raw: RawRecord) -> None:
        self._raw = raw
        self.header_copies = 0

    def topic(self) -> str | None:
        return self._raw.topic

    def partition(self) -> int | None:
        return self._raw.partition

    def offset(self) -> int | None:
        return self._raw.offset

    def key(self) -> bytes | None:
        return self._raw.key

    def value(self) -> bytes | None:
        return self._raw.value

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        self.header_copies += 1
        return list(self._raw.headers)

    def timestamp(self) -> tuple[int, int]:
        return (1, self._raw.timestamp_ms or 0)


def a_message(transaction_id: str, offset: int) -> CountingMessage:
    half = a_half(transaction_id)
    raw = stored_raw(half.to_record(TOPICS, 0).headers, half, offset, None)
    return CountingMessage(raw)


def test_an_entry_knows_its_offset_without_copying_the_message() -> None:
    message = a_message("a", 7)
    entry = HalfEntry.of_message(message)

    assert entry.offset == 7
    assert message.header_copies == 0


def test_an_entry_is_copied_out_and_decoded_once_when_looked_at() -> None:
    message = a_message("a", 7)
    entry = HalfEntry.of_message(message)

    assert entry.half is not None and entry.half.transaction_id == "a"
    assert entry.error is None
    assert entry.raw.offset == 7 and entry.stored_ms == entry.raw.timestamp_ms
    assert message.header_copies == 1
    assert entry == HalfEntry(entry.raw, entry.stored_ms, entry.half)


def test_an_undecodable_half_says_why_when_looked_at() -> None:
    entry = HalfEntry.of(RawRecord(TOPICS.half, 0, 3, b"k", b"v", (("outbox-kind", b"half"),)))

    assert entry.half is None
    assert isinstance(entry.error, MalformedRecordError)


def test_a_round_skips_decided_halves_without_copying_them() -> None:
    log = MemoryLog()
    messages = [a_message(f"t{offset}", offset) for offset in range(10)]
    for message in messages:
        log.half_entries.append(HalfEntry.of_message(message))
    for offset in range(8):  # two left undecided: the round must look at those
        log.add_op(f"t{offset}", offset, resolution=Resolution.COMMIT)

    plan = run(log)

    assert plan.skipped_ended == 8
    assert [e.half.transaction_id for e in plan.to_check if e.half] == ["t8", "t9"]
    assert plan.stop_reason is StopReason.END
    assert [m.header_copies for m in messages] == [0] * 8 + [1, 1]
