"""When the cluster itself could take the relay's work: the stall metric's second view.

"Possible" in :func:`~outbox_devtools.chaos.verdict.publication_stalls` means a
quorum of nodes up and a checker replica running. That is not yet enough for Kafka
to accept a relay transaction: a node killed or frozen stays the leader of its
partitions until the controller fences it (``broker.session.timeout.ms``), and a
partition whose in-sync replicas fell under ``min.insync.replicas`` refuses every
acks=all write until a returning node has caught up. Those seconds are Kafka's, not
the outbox's; this monitor samples the metadata so the run can tell them apart.

It keeps two views. The first (``writable_stall_s``) asks every partition of the internal
topics; the second (``owned_stall_s``) only the partitions the relay's transactions
concern: of ``__consumer_offsets`` and ``__transaction_state`` those whose leaders
coordinate the relay's group and transactional ids. A leaderless coordinator partition of
somebody else's group takes none of the relay's writes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
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


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode()``: ``31 * h + c`` over the UTF-16 code units, as an int."""
    value = 0
    encoded = text.encode("utf-16-be")
    for index in range(0, len(encoded), 2):
        value = (31 * value + int.from_bytes(encoded[index : index + 2], "big")) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def coordinator_partition(key: str, partitions: int) -> int:
    """The partition of an internal topic whose leader coordinates ``key`` (a group id in
    ``__consumer_offsets``, a transactional id in ``__transaction_state``): Kafka's
    ``Utils.abs(key.hashCode()) % partitions``, where ``Utils.abs`` maps ``MIN_VALUE`` to 0."""
    hashed = java_string_hash(key)
    return (0 if hashed == -(1 << 31) else abs(hashed)) % partitions


def concerned_partitions(
    partitions: Iterable[PartitionState],
    coordinator_keys: Mapping[str, Iterable[str]],
    partition_counts: Mapping[str, int],
) -> list[PartitionState]:
    """``partitions`` without those of a topic in ``coordinator_keys`` that coordinate none
    of its keys (hashed over the topic's ``partition_counts``); a topic not named there, or
    of no known count, is concerned whole."""
    kept = {
        topic: {coordinator_partition(key, partition_counts[topic]) for key in keys}
        for topic, keys in coordinator_keys.items()
        if partition_counts.get(topic)
    }
    return [s for s in partitions if s.topic not in kept or s.partition in kept[s.topic]]


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
        coordinator_keys: Mapping[str, Iterable[str]] | None = None,
    ) -> None:
        """``coordinator_keys``: the relay's group ids and transactional ids by internal topic,
        for the second view (every partition of those topics concerns it when not given)."""
        self._admin = AdminClient(kafka_client_config(bootstrap))
        self._written = frozenset((*written_topics, *WRITTEN_INTERNAL_TOPICS))
        self._topics = frozenset(read_topics) | self._written
        self._min_in_sync = min_in_sync
        self._down_nodes = down_nodes
        self._coordinator_keys = {
            topic: tuple(keys) for topic, keys in (coordinator_keys or {}).items()
        }
        self._samples: list[tuple[float, bool, bool]] = []
        """(epoch s, every partition writable, the concerned ones writable)"""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-writability", daemon=True)

    def __enter__(self) -> WritabilityMonitor:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def unwritable(self, concerned_only: bool = False) -> list[Interval]:
        """When the relay's partitions could not take its transactions (epoch s): any
        partition of the internal topics, or with ``concerned_only`` its coordinators'."""
        view = 2 if concerned_only else 1
        return unwritable_intervals([(sample[0], sample[view]) for sample in self._samples])

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            moment = time.time()
            every, concerned = self._sample()
            self._samples.append((moment, every is None, concerned is None))

    def _sample(self) -> tuple[str | None, str | None]:
        """Why the relay could not work now (or None), over every partition and over the
        concerned ones."""
        down = self._down_nodes()
        try:
            metadata = self._admin.list_topics(timeout=2)
        except Exception as exc:  # KafkaException: no node answered in time
            reason = f"no metadata ({exc})"
            return reason, reason
        partitions = [
            PartitionState(name, partition.id, partition.leader, frozenset(partition.isrs))
            for name, topic in metadata.topics.items()
            if name in self._topics
            for partition in topic.partitions.values()
        ]
        every = unwritable_reason(partitions, self._written, self._min_in_sync, down)
        concerned = unwritable_reason(
            concerned_partitions(
                partitions,
                self._coordinator_keys,
                {name: len(topic.partitions) for name, topic in metadata.topics.items()},
            ),
            self._written,
            self._min_in_sync,
            down,
        )
        if every:
            log.debug("not writable: %s (concerned: %s)", every, concerned)
        return every, concerned
