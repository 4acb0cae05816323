"""Whether a committed half's real record can be published now: one test, two programs.

The relay asks it before it publishes a commit (:mod:`outbox_checker.relay_records`),
and ``outbox discard resume`` before it publishes an unpublishable discard once its cause
is fixed (:mod:`outbox_checker.discard`): one test, so the two never disagree on what
"fixed" means.
"""

from __future__ import annotations

from outbox.errors import InvalidMessageError
from outbox.protocol import OutgoingRecord
from outbox.size_limits import SizeLimits
from outbox.topic_catalog import TopicCatalog


def real_record_problem(
    catalog: TopicCatalog, limits: SizeLimits, record: OutgoingRecord
) -> str | None:
    """Why the real record of a committed half cannot be written now; None when it can:
    its topic is gone, its partition does not exist, or it is over a size limit."""
    try:
        facts = catalog.get(record.topic)
    except InvalidMessageError as exc:
        return str(exc)
    if record.partition is not None and record.partition >= facts.partitions:
        return f"partition {record.partition} of {record.topic!r} does not exist"
    return limits.problem("real record", record)
