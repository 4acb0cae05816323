"""The checker's gauges are worked out when scraped, so a stalled replica's figures keep moving."""

from __future__ import annotations

from collections import Counter

from prometheus_client import REGISTRY

from outbox_checker import metrics
from outbox_checker.rules import RoundChunk


class _Clock:
    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def _sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_the_oldest_pending_age_grows_between_rounds():
    clock = _Clock(100_000)
    metrics.measure_with(clock, lambda: 90_000)
    chunk = RoundChunk(97, pending_by_topic=Counter({"orders": 2}), oldest_pending_born_ms=40_000)
    metrics.record_pending(97, chunk)
    assert _sample("outbox_checker_oldest_pending_age_seconds", partition="97") == 60
    assert _sample("outbox_checker_pending_halves", real_topic="orders", partition="97") == 2
    clock.now_ms += 120_000  # no round completes meanwhile
    assert _sample("outbox_checker_oldest_pending_age_seconds", partition="97") == 180
    assert _sample("outbox_checker_seconds_since_last_round") == 130


def test_a_partition_with_nothing_pending_reports_age_zero():
    clock = _Clock(100_000)
    metrics.measure_with(clock, lambda: None)
    metrics.record_pending(98, RoundChunk(98, oldest_pending_born_ms=50_000))
    metrics.record_pending(98, RoundChunk(98))
    clock.now_ms += 60_000
    assert _sample("outbox_checker_oldest_pending_age_seconds", partition="98") == 0
    assert _sample("outbox_checker_seconds_since_last_round") == 0
