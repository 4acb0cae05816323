"""The real records of a batch's commits, restored from their halves; discards for the rest.

For each first commit the relay restores the real record from its half (topic,
key, value, user headers, transaction id and producer group), as RocketMQ's
``EndTransactionProcessor`` does from the commit log. A half whose real record
cannot be written (its topic is gone, it is larger than the topic or the client
allows, it no longer exists) would otherwise stop its partition for good; it
goes to the discard topic with the reason and the relay moves on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from outbox.protocol import (
    Decision,
    DiscardReason,
    DiscardRecord,
    Header,
    MalformedRecordError,
    OutgoingRecord,
    RawRecord,
    TopicNames,
    half_stored_ms,
    real_record_of_half,
)
from outbox.protocol.headers import int_header, text_header
from outbox.size_limits import SizeLimits
from outbox.topic_catalog import TopicCatalog
from outbox_checker import metrics
from outbox_checker.half_lookup import HalfLookup
from outbox_checker.publishable import real_record_problem
from outbox_checker.relay_batch import BatchReport

log = logging.getLogger("outbox_checker.relay")  # the relay's one logger, whichever module logs

_PRODUCER_GROUP = Header.PRODUCER_GROUP.value
_TRANSACTION_ID = Header.TRANSACTION_ID.value
_HALF_LOOKUP = metrics.RELAY_STAGE_SECONDS.labels("half_lookup")


class RealRecords:
    """Restores the real records of commits from their halves (read by a :class:`HalfLookup`)."""

    def __init__(
        self,
        halves: HalfLookup,
        catalog: TopicCatalog,
        limits: SizeLimits,
        topics: TopicNames,
        now_ms: Callable[[], int],
    ) -> None:
        self._halves = halves
        self._catalog = catalog
        self._limits = limits
        self._topics = topics
        self._now_ms = now_ms

    def of_commits(
        self, commits: Mapping[int, list[Decision]], report: BatchReport
    ) -> list[OutgoingRecord]:
        """The real records of the commits, in op order; discards for those that cannot be."""
        outgoing: list[OutgoingRecord] = []
        for partition, ops in commits.items():
            started = time.monotonic()
            halves = self._halves.fetch(partition, (op.half_offset for op in ops))
            _HALF_LOOKUP.observe(time.monotonic() - started)
            for op in ops:
                record, problem = self._real_record(op, halves.get(op.half_offset))
                if record is not None:
                    outgoing.append(record)
                    report.published += 1
                    report.by_partition[partition] = report.by_partition.get(partition, 0) + 1
                    _note_finish(report, record, halves[op.half_offset])
                    continue
                report.unpublishable += 1
                log.error(
                    "committed transaction %s cannot be published (%s); kept on %s",
                    op.transaction_id,
                    problem,
                    self._topics.discard,
                )
                raw = halves.get(op.half_offset)
                if raw is None or raw.header_text(_TRANSACTION_ID) != op.transaction_id:
                    # Never another transaction's half: `outbox discard resume` publishes
                    # what an unpublishable discard holds, as the committed transaction's.
                    raw = _stand_in_half(self._topics, op)
                discard = DiscardRecord.of_half(
                    raw, DiscardReason.UNPUBLISHABLE, self._now_ms(), problem
                )
                outgoing.append(discard.to_record(self._topics))
        return outgoing

    def _real_record(
        self, op: Decision, raw: RawRecord | None
    ) -> tuple[OutgoingRecord | None, str]:
        if raw is None:
            return None, f"its half {op.half_partition}:{op.half_offset} is not in the half topic"
        try:
            transaction_id, record = real_record_of_half(raw)
        except MalformedRecordError as exc:
            return None, f"its half does not decode: {exc}"
        if transaction_id != op.transaction_id:
            return None, (
                f"the op names half {op.half_partition}:{op.half_offset}, which belongs to "
                f"transaction {transaction_id}"
            )
        problem = real_record_problem(self._catalog, self._limits, record)
        if problem is not None:
            return None, problem
        return record, ""


def _note_finish(report: BatchReport, record: OutgoingRecord, raw: RawRecord) -> None:
    stored_ms = half_stored_ms(raw)
    # The real record names its producer group last (``real_record_of_half``).
    group = next((v for n, v in reversed(record.headers) if n == _PRODUCER_GROUP), None)
    if stored_ms is not None and group:
        report.finished.append((record.topic, group.decode("utf-8", "replace"), stored_ms))


def _stand_in_half(topics: TopicNames, op: Decision) -> RawRecord:
    """What a discard can say of a half that is gone: the op's own facts."""
    return RawRecord(
        topic=topics.half,
        partition=op.half_partition,
        offset=op.half_offset,
        headers=(
            text_header(Header.TRANSACTION_ID, op.transaction_id),
            int_header(Header.ORIGIN_OFFSET, op.identity),
        ),
    )
