"""The checker answering checks itself from the SQL transaction log.

With ``--resolve-from-db URL`` a due half is looked up in the producers'
transaction-log table (the same rule their listeners use,
:class:`outbox.sql.TransactionLogCheck`), so a transaction resolves even when
no producer of its group is running. A commit is written as the producer
would write it: the real record and the op record in one Kafka transaction
(the checker's chunk transaction). When the log cannot tell yet (no row and
still inside the grace period, or the database is down), the checker falls
back to asking the producers.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlalchemy.orm import sessionmaker

from outbox.message import LocalTransactionState, checked_message
from outbox.protocol import HalfRecord, OpRecord, OutgoingRecord, Resolution, TopicNames
from outbox.sql import LogTarget, TransactionLogCheck, create_engine

_RESOLUTIONS = {
    LocalTransactionState.COMMIT_MESSAGE: Resolution.COMMIT,
    LocalTransactionState.ROLLBACK_MESSAGE: Resolution.ROLLBACK,
}


class DatabaseResolver:
    """Called by the round writer for each put-back copy; returns the records that end it."""

    def __init__(
        self,
        url: str,
        topics: TopicNames,
        *,
        table: str,
        schema: str | None,
        grace_seconds: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._engine = create_engine(url, pool_pre_ping=True)
        self._topics = topics
        self._clock = clock
        self._check = TransactionLogCheck(
            sessionmaker(self._engine),
            LogTarget(table, schema),
            grace_seconds=grace_seconds,
            clock=clock,
        )

    def __call__(
        self, copy: HalfRecord, half_partition: int, half_offset: int
    ) -> list[OutgoingRecord]:
        message = checked_message(copy, half_partition, half_offset)
        resolution = _RESOLUTIONS.get(self._check.answer(message, copy.producer_group))
        if resolution is None:
            return []  # the log cannot tell yet: ask the producers instead
        op = OpRecord(
            copy.transaction_id,
            copy.producer_group,
            half_partition,
            half_offset,
            resolution,
            int(self._clock() * 1000),
            origin_offset=copy.identity(half_offset),
        )
        # The decision only: the relay publishes the real record, once, as for any commit.
        return [op.to_record(self._topics)]

    def close(self) -> None:
        self._engine.dispose()
