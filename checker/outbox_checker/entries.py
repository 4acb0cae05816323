"""Half and op records as the checker reads them, decoded if they could be.

The rounds decide on them (:mod:`outbox_checker.rules`), the readers make them
(:class:`outbox_checker.kafka_reader.KafkaPartitionReader`), and the checkpoint's loader
and the parked sends' drain read them too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from outbox.protocol import HalfRecord, MalformedRecordError, OpRecord, RawRecord

log = logging.getLogger("outbox_checker.rules")  # where the rounds have always said it


@dataclass(frozen=True)
class HalfEntry:
    """A record of the half partition, decoded if it could be."""

    raw: RawRecord
    stored_ms: int
    half: HalfRecord | None
    error: MalformedRecordError | None = None

    @property
    def offset(self) -> int:
        return self.raw.offset

    @classmethod
    def of(cls, raw: RawRecord) -> HalfEntry:
        stored_ms = raw.timestamp_ms or 0
        try:
            return cls(raw, stored_ms, HalfRecord.read(raw))
        except MalformedRecordError as exc:
            return cls(raw, stored_ms, None, exc)


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
