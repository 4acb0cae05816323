"""The settings of the checker's transactional producers (the relay's, the round's, a resume's).

The relay and the round commit one Kafka transaction after another on one transactional id. The
coordinator answers a transaction's first request with
``CONCURRENT_TRANSACTIONS`` until the previous commit's markers are written, a
few milliseconds after ``commit_transaction`` returned, and librdkafka asks
again after ``retry.backoff.ms``. At its default (100 ms), plain Kafka's own
consume → produce → commit loop (``bench.eos_copy``) waited those 100 ms in
``send_offsets_to_transaction`` at about every other commit, and so did every
record of the batch: 100 to 190 ms old at commit, against 11 to 16 ms with a
first back-off of 1 to 5 ms; the relay's commit-to-visible p99 at 1 000 tx/s
went from 139 ms to 38-63 ms (``docs/benchmarks.md``). The cost: a few small
requests to a coordinator busy writing its markers; librdkafka's produce
retries grow their back-off exponentially from it (KIP-580, up to
``retry.backoff.max.ms``), so a leader that is gone is not stormed either.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError

from outbox.size_limits import CHECKER_MESSAGE_MAX_BYTES

RETRY_BACKOFF_MS = 2
"""librdkafka's first back-off before asking again (``retry.backoff.ms``, default 100)."""


def transactional_config(
    client_config: dict[str, Any],
    transactional_id: str,
    *,
    linger_ms: int,
    transaction_timeout_ms: int,
) -> dict[str, Any]:
    """A transactional producer's librdkafka settings; ``client_config`` (the user's
    pass-through properties among them) may change the back-off and the record size, not
    what exactly-once needs."""
    return {
        "message.max.bytes": CHECKER_MESSAGE_MAX_BYTES,
        "retry.backoff.ms": RETRY_BACKOFF_MS,
        **client_config,
        "transactional.id": transactional_id,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": linger_ms,
        "transaction.timeout.ms": transaction_timeout_ms,
    }


def remember_offset(into: list[int]) -> Callable[[KafkaError | None, Any], None]:
    """A delivery callback appending the record's offset to ``into`` once it is stored there.

    Nothing is appended for a record stored at an offset the client does not
    know (librdkafka's report of a write retried and answered as a duplicate
    carries none): a record named later by its offset (a put-back copy in its
    check request, a resumed half in its marker) must be named rightly or not at
    all, so the caller finds ``into`` empty and aborts its transaction.
    """

    def delivered(error: KafkaError | None, message: Any) -> None:
        if error is not None:
            return  # (a fenced producer's report: reading its message can raise SystemError)
        offset = message.offset()
        if offset is not None:
            into.append(offset)

    return delivered
