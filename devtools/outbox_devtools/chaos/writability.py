"""When the cluster itself could take the relay's work: the stall metric's second view.

"Possible" in :func:`~outbox_devtools.chaos.verdict.publication_stalls` means a
quorum of nodes up and a checker replica running. That is not yet enough for Kafka
to accept a relay transaction: a node killed or frozen stays the leader of its
partitions until the controller fences it (``broker.session.timeout.ms``), and a
partition whose in-sync replicas fell under ``min.insync.replicas`` refuses every
acks=all write until a returning node has caught up. Those seconds are Kafka's, not
the outbox's; this monitor samples the metadata so the run can tell them apart.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from confluent_kafka.admin import AdminClient

from outbox.config import kafka_client_config
from outbox_devtools.chaos.verdict import Interval

log = logging.getLogger(__name__)

WRITTEN_INTERNAL_TOPICS = ("__consumer_offsets", "__transaction_state")
"""A relay transaction writes its offsets and its markers there (acks=all)."""
SAMPLE_SECONDS = 0.25


@dataclass(frozen=True)
class PartitionState:
    """One partition as the metadata shows it."""

    topic: str
    partition: int
    leader: int
    in_sync: frozenset[int]


def unwritable_reason(
    partitions: Iterable[PartitionState],
    written: frozenset[str],
    min_in_sync: int,
    down: frozenset[int],
) -> str | None:
    """Why the relay could not work now, or None: a leader away, or too few in sync.

    ``down`` are the nodes the run knows are killed or frozen, which the metadata
    may still show as leaders and in sync until the controller fences them. Topics
    in ``written`` need ``min_in_sync`` live replicas in sync and no downed one
    listed there (an acks=all write waits for every replica in sync); the others
    are only read and need a live leader.
    """
    for state in partitions:
        if state.leader < 0 or state.leader in down:
            return f"{state.topic}[{state.partition}] has no live leader"
        if state.topic not in written:
            continue
        live = state.in_sync - down
        if len(live) < min_in_sync:
            return f"{state.topic}[{state.partition}] has {len(live)} of {min_in_sync} in sync"
        if waited_for := sorted(state.in_sync & down):
            nodes = ", ".join(str(node) for node in waited_for)
            return f"{state.topic}[{state.partition}] waits for node {nodes}, down but in sync"
    return None


def unwritable_intervals(samples: Iterable[tuple[float, bool]]) -> list[Interval]:
    """Stretches from the first unwritable sample to the next writable one (or the last)."""
    intervals: list[Interval] = []
    since: float | None = None
    moment: float | None = None
    for moment, writable in samples:
        if not writable and since is None:
            since = moment
        elif writable and since is not None:
            intervals.append((since, moment))
            since = None
    if since is not None and moment is not None:
        intervals.append((since, max(moment, since)))
    return intervals


class WritabilityMonitor:
    """Samples the cluster's metadata in a thread while the run goes on."""

    def __init__(
        self,
        bootstrap: str,
        read_topics: Iterable[str],
        written_topics: Iterable[str],
        min_in_sync: int,
        down_nodes: Callable[[], frozenset[int]],
    ) -> None:
        self._admin = AdminClient(kafka_client_config(bootstrap))
        self._written = frozenset((*written_topics, *WRITTEN_INTERNAL_TOPICS))
        self._topics = frozenset(read_topics) | self._written
        self._min_in_sync = min_in_sync
        self._down_nodes = down_nodes
        self._samples: list[tuple[float, bool]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-writability", daemon=True)

    def __enter__(self) -> WritabilityMonitor:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def unwritable(self) -> list[Interval]:
        """When the relay's partitions could not take its transactions (epoch s)."""
        return unwritable_intervals(list(self._samples))

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            moment = time.time()
            self._samples.append((moment, self._sample() is None))

    def _sample(self) -> str | None:
        down = self._down_nodes()
        try:
            metadata = self._admin.list_topics(timeout=2)
        except Exception as exc:  # KafkaException: no node answered in time
            return f"no metadata ({exc})"
        partitions = [
            PartitionState(name, partition.id, partition.leader, frozenset(partition.isrs))
            for name, topic in metadata.topics.items()
            if name in self._topics
            for partition in topic.partitions.values()
        ]
        reason = unwritable_reason(partitions, self._written, self._min_in_sync, down)
        if reason:
            log.debug("not writable: %s", reason)
        return reason
