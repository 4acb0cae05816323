"""Prometheus metrics of the checker (RocketMQ's RIP-46 set, where it applies)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Protocol

from prometheus_client import Counter, Gauge, Histogram

PENDING = Gauge(
    "outbox_checker_pending_halves",
    "Halves without an outcome left after the last round, by real topic and half partition.",
    ["real_topic", "partition"],
)
OLDEST_PENDING_AGE = Gauge(
    "outbox_checker_oldest_pending_age_seconds",
    "Age now of the oldest half pending after the last round, by half partition: it keeps"
    " growing while rounds fail.",
    ["partition"],
)
SECONDS_SINCE_LAST_ROUND = Gauge(
    "outbox_checker_seconds_since_last_round",
    "Time since this replica last completed a round over its half partitions.",
)
PARKED_DRAINED = Counter(
    "outbox_checker_parked_drained",
    "Parked sends (park_when_unavailable) written to Kafka from the transaction log, with"
    " their COMMIT op.",
)
PARKED_ROWS = Gauge(
    "outbox_checker_parked_rows",
    "Parked sends waiting in the transaction log at the last look, by half partition.",
    ["partition"],
)
OLDEST_PARKED_AGE = Gauge(
    "outbox_checker_oldest_parked_age_seconds",
    "Age of the oldest parked send still in the transaction log at the last look, by half"
    " partition (0: none).",
    ["partition"],
)
CHECKS_SENT = Counter("outbox_checker_checks_sent", "Check requests sent to producer groups.")
PUT_BACKS = Counter("outbox_checker_put_backs", "Halves put back at the end of their partition.")
DISCARDS = Counter("outbox_checker_discards", "Halves given up on, by reason.", ["reason"])
ROUND_SECONDS = Histogram(
    "outbox_checker_round_duration_seconds",
    "Duration of one round over every owned partition.",
    buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120),
)
HALVES_LOST_TO_RETENTION = Counter(
    "outbox_checker_halves_lost_to_retention",
    "Half records deleted by the half topic's retention before any check round read them "
    "(the checker was away longer than the retention): some may have had no decision.",
    ["partition"],
)
CHECKPOINT_LAG = Gauge(
    "outbox_checker_checkpoint_lag",
    "Records between the half checkpoint and the end of the half partition.",
    ["partition"],
)

RELAY_PUBLISHED = Counter(
    "outbox_checker_relay_published", "Committed halves re-published to their real topics."
)
RELAY_SECOND_DECISIONS = Counter(
    "outbox_checker_relay_second_decisions",
    "Decisions for halves that already had one (late own ends, second answers): not published.",
)
RELAY_UNPUBLISHABLE = Counter(
    "outbox_checker_relay_unpublishable",
    "Committed halves whose real record could not be written: sent to the discard topic.",
)
RELAY_BATCH_SECONDS = Histogram(
    "outbox_checker_relay_batch_seconds",
    "Duration of one relay transaction (decisions read, records written, offsets committed).",
    buckets=(0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 5),
)
RELAY_STAGE_SECONDS = Histogram(
    "outbox_checker_relay_stage_seconds",
    "Where a commit's time goes in the relay, per batch: op_wait (the batch's oldest op"
    " stored to consumed), half_end (the readable ends of half partitions asked, for halves"
    " newer than the relay knew), half_lookup (its halves in hand), produce (its records"
    " handed to the producer) and commit (offsets sent and the transaction committed).",
    ["stage"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 5, 30),
)
RELAY_STAGES = ("op_wait", "half_end", "half_lookup", "produce", "commit")

RELAY_LAG = Gauge(
    "outbox_checker_relay_lag",
    "Op records this replica's relay has not relayed yet, by op partition it owns.",
    ["partition"],
)
FINISH_LATENCY = Histogram(
    "outbox_finish_message_latency_seconds",
    "RocketMQ's finish_message_latency (RIP-46): from the broker storing a half to the relay "
    "publishing its commit on the real topic, by real topic and producer group.",
    ["real_topic", "group"],
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
)
"""Label values are bounded: a real topic is one the relay could write to (one of the
cluster's topics) and a group one the applications named in their code."""

_topics_by_partition: dict[int, set[str]] = {}
_oldest_born_ms: dict[int, int | None] = {}


def _wall_clock_ms() -> int:
    return int(time.time() * 1000)


_clock_ms: Callable[[], int] = _wall_clock_ms


def measure_with(now_ms: Callable[[], int], last_round_ms: Callable[[], int | None]) -> None:
    """Ages are worked out when scraped, on the checker's clock, so they never freeze."""
    global _clock_ms
    _clock_ms = now_ms

    def since_last_round() -> float:
        last = last_round_ms()
        return 0.0 if last is None else max(0, now_ms() - last) / 1000

    SECONDS_SINCE_LAST_ROUND.set_function(since_last_round)


class PendingCounts(Protocol):
    """What a round's last chunk (:class:`outbox_checker.rules.RoundChunk`) says is pending."""

    @property
    def pending_by_topic(self) -> Mapping[str, int]: ...

    @property
    def oldest_pending_born_ms(self) -> int | None: ...


def record_pending(partition: int, chunk: PendingCounts) -> None:
    """Publish the pending counts of a round's last chunk, zeroing topics now clear."""
    label = str(partition)
    for topic in _topics_by_partition.get(partition, set()) - set(chunk.pending_by_topic):
        PENDING.labels(topic, label).set(0)
    for topic, count in chunk.pending_by_topic.items():
        PENDING.labels(topic, label).set(count)
    _topics_by_partition[partition] = set(chunk.pending_by_topic)
    if partition not in _oldest_born_ms:
        OLDEST_PENDING_AGE.labels(label).set_function(lambda: _pending_age(partition))
    _oldest_born_ms[partition] = chunk.oldest_pending_born_ms


def _pending_age(partition: int) -> float:
    oldest = _oldest_born_ms.get(partition)
    return 0.0 if oldest is None else max(0, _clock_ms() - oldest) / 1000
