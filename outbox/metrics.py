"""Prometheus metrics of the producer, labelled by producer group.

Registered once per process in the default registry, so an application that
already exposes ``/metrics`` shows them with no extra wiring.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

HALVES_WRITTEN = Counter(
    "outbox_halves_written", "Half records written and acknowledged.", ["group"]
)
COMMITS = Counter("outbox_commits", "Transactions ended with a commit.", ["group", "origin"])
ROLLBACKS = Counter("outbox_rollbacks", "Transactions ended with a rollback.", ["group", "origin"])
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
