"""Prometheus metrics of the producer, labelled by producer group.

Registered once per process in the default registry, so an application that
already exposes ``/metrics`` shows them with no extra wiring.

Label values come from bounded sets: ``group`` is fixed in the application's
code, ``real_topic`` is one of the cluster's topics (a send to a topic that
does not exist is refused before anything is written), and ``origin``,
``reason`` and ``state`` are the producer's own words. So the series count is
at most groups x real topics x 2 for the commit and rollback counters.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Histogram
from prometheus_client.metrics import MetricWrapperBase

HALVES_WRITTEN = Counter(
    "outbox_halves_written", "Half records written and acknowledged.", ["group"]
)
SENDS_PARKED = Counter(
    "outbox_sends_parked",
    "Sends whose half Kafka did not acknowledge in time, parked in the transaction log"
    " (park_when_unavailable).",
    ["group"],
)
COMMITS = Counter(
    "outbox_commits",
    "Transactions ended with a commit (RocketMQ's commit_messages), by real topic.",
    ["group", "real_topic", "origin"],
)
ROLLBACKS = Counter(
    "outbox_rollbacks",
    "Transactions ended with a rollback (RocketMQ's rollback_messages), by real topic.",
    ["group", "real_topic", "origin"],
)
UNKNOWNS = Counter(
    "outbox_unknowns", "Local transactions or checks that answered UNKNOW.", ["group", "origin"]
)
END_FAILURES = Counter(
    "outbox_end_failures",
    "Decision ops that failed, were refused as late, or (oneway) were never delivered.",
    ["group", "reason"],
)
CHECKS_ANSWERED = Counter(
    "outbox_checks_answered", "Check requests answered by the listener.", ["group", "state"]
)
CHECKS_DROPPED = Counter(
    "outbox_checks_dropped", "Check requests dropped (stale or malformed).", ["group", "reason"]
)
END_LATENCY = Histogram(
    "outbox_end_latency_seconds",
    "From the local transaction's answer to its decision op being acknowledged.",
    ["group"],
    buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10),
)


class GroupMetrics:
    """The metric children of one producer group, resolved once per label set.

    ``labels()`` takes the metric's lock and builds its key on every call; a send
    counts its half and its end, so the children are kept here instead. Label
    values are bounded (see above), so is this cache; a race only ever stores
    the same child twice.
    """

    __slots__ = ("_children", "end_latency", "group", "halves_written", "parked")

    def __init__(self, group: str) -> None:
        self.group = group
        self.halves_written = HALVES_WRITTEN.labels(group)
        self.end_latency = END_LATENCY.labels(group)
        self.parked = SENDS_PARKED.labels(group)
        self._children: dict[tuple[MetricWrapperBase, tuple[str, ...]], Any] = {}

    def child(self, metric: MetricWrapperBase, *labels: str) -> Any:
        """``metric.labels(group, *labels)``, looked up once."""
        key = (metric, labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(self.group, *labels)
        return found
