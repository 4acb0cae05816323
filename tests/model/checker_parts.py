"""The checker's Kafka-facing parts, over the model's partitions, so its real code runs.

:class:`ModelProducer` is the round writer's transactional producer: the real
:class:`~outbox_checker.round_writer.RoundWriter` writes each chunk through it, so the
copies, check requests, discards and checkpoint the model sees are exactly what
the writer builds, in one :class:`~tests.model.kafka_lists.Transaction`. It can
be told to fail (a Kafka error the writer recovers from) or to die (the process
goes; its open transaction is aborted when the next writer fences it).

:class:`CheckerProcess` is the state one checker process keeps, with the real
:class:`~outbox_checker.checkpoints.CheckpointLoader` that loads a checkpoint and
rebuilds the ended set over the model's partitions: a restart is a new process, run
by the real code.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException, TopicPartition

from outbox.protocol import OutgoingRecord, TopicNames
from outbox.topic_catalog import TopicFacts
from outbox_checker.checkpoints import Checkpoint, CheckpointLoader
from outbox_checker.ended import EndedTransactions
from outbox_checker.entries import HalfEntry, OpEntry
from outbox_checker.names import decode_checkpoint
from tests.model.kafka_lists import Partition, Transaction


class WriterDied(Exception):
    """The checker process died mid-chunk."""


@dataclass
class Cluster:
    """The model's topics, one partition each, and the checker group's committed offset."""

    topics: TopicNames
    group: str
    clock_ms: Callable[[], int]

    def __post_init__(self) -> None:
        self.half = Partition(self.topics.half)
        self.op = Partition(self.topics.op)
        self.check = Partition(self.topics.check(self.group))
        self.discard = Partition(self.topics.discard)
        self.checkpoint: tuple[int, str] | None = None
        """The checker group's committed offset on the half partition, with its metadata."""
        self.open_transaction: Transaction | None = None
        """The round writer's transaction under way (one writer id: the next one fences it)."""

    def partition(self, topic: str) -> Partition:
        for partition in (self.half, self.op, self.check, self.discard):
            if partition.topic == topic:
                return partition
        raise AssertionError(f"the model has no topic {topic}")

    def fence(self) -> None:
        """``init_transactions`` of the writer's id: the previous one's transaction is aborted."""
        if self.open_transaction is not None:
            self.open_transaction.abort()
            self.open_transaction = None

    def committed_checkpoint(self) -> Checkpoint | None:
        if self.checkpoint is None:
            return None
        op = decode_checkpoint(self.checkpoint[1])
        assert op is not None
        return Checkpoint(self.checkpoint[0], op)


class _Delivered:
    def __init__(self, offset: int) -> None:
        self._offset = offset

    def offset(self) -> int:
        return self._offset


class ModelProducer:
    """A transactional producer of the round writer's id, over the cluster's partitions."""

    def __init__(self, cluster: Cluster, faults: list[tuple[str, int]]) -> None:
        self._cluster = cluster
        self._faults = faults
        """(kind, calls before it): the next fault, shared by every producer of the writer."""
        self._deliveries: list[tuple[Callable[[Any, Any], None], int]] = []
        self._offsets: list[TopicPartition] = []

    def _call(self) -> None:
        if not self._faults:
            return
        kind, calls = self._faults[0]
        if calls > 0:
            self._faults[0] = (kind, calls - 1)
            return
        del self._faults[0]
        if kind == "dies":
            raise WriterDied("the checker died mid-chunk")
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "the model failed the chunk"))

    def init_transactions(self, timeout: float) -> None:
        self._cluster.fence()

    def begin_transaction(self) -> None:
        self._cluster.fence()
        self._cluster.open_transaction = Transaction()
        self._deliveries, self._offsets = [], []

    def produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes | None]],
        partition: int | None = None,
        on_delivery: Callable[[Any, Any], None] | None = None,
    ) -> None:
        self._call()
        transaction = self._cluster.open_transaction
        assert transaction is not None, "produced outside a transaction"
        record = OutgoingRecord(topic, key, value, headers, partition)
        offset = transaction.produce(
            self._cluster.partition(topic), record, self._cluster.clock_ms()
        )
        if on_delivery is not None:
            self._deliveries.append((on_delivery, offset))

    def flush(self, timeout: float) -> int:
        self._call()
        for delivered, offset in self._deliveries:
            delivered(None, _Delivered(offset))
        self._deliveries = []
        return 0

    def send_offsets_to_transaction(
        self, offsets: list[TopicPartition], group_metadata: object, timeout: float
    ) -> None:
        self._call()
        self._offsets = offsets

    def commit_transaction(self, timeout: float) -> None:
        self._call()
        transaction = self._cluster.open_transaction
        assert transaction is not None and len(self._offsets) == 1
        transaction.commit()
        self._cluster.open_transaction = None
        (checkpoint,) = self._offsets
        self._cluster.checkpoint = (checkpoint.offset, checkpoint.metadata)

    def abort_transaction(self, timeout: float) -> None:
        self._cluster.fence()


class ModelCatalog:
    """Every topic exists, with Kafka's default size limit."""

    def get(self, topic: str) -> TopicFacts:
        return TopicFacts(topic, 1, 1_048_588)


class ModelReader:
    """A :class:`~outbox_checker.rules.PartitionReader` over the cluster: committed data only."""

    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster

    def ops(self, start: int, limit: int) -> list[OpEntry]:
        entries = []
        for raw in self._cluster.op.read(start):
            if len(entries) >= limit:
                break
            entries.append(OpEntry.of(raw))
        return entries

    def halves(self, start: int) -> Iterator[HalfEntry]:
        return (HalfEntry.of(raw) for raw in self._cluster.half.read(start))

    def ops_settled(self) -> bool:
        return True  # ops are written by idempotent producers, outside Kafka transactions

    def half_end(self) -> int:
        return self._cluster.half.end


class _GroupConsumer:
    """What the checker asks of its group consumer when it loads a checkpoint."""

    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        (asked,) = partitions
        found = self._cluster.checkpoint
        if found is None:
            return [TopicPartition(asked.topic, asked.partition, OFFSET_INVALID)]
        return [TopicPartition(asked.topic, asked.partition, found[0], metadata=found[1])]

    def get_watermark_offsets(self, partition: TopicPartition, timeout: float) -> tuple[int, int]:
        return 0, self._cluster.partition(partition.topic).end

    def offsets_for_times(
        self, partitions: list[TopicPartition], timeout: float
    ) -> list[TopicPartition]:
        (asked,) = partitions
        stored = self._cluster.partition(asked.topic)
        found = stored.offset_for_time(asked.offset)
        return [TopicPartition(asked.topic, asked.partition, -1 if found >= stored.end else found)]


class _HalfCursor:
    def __init__(self, cluster: Cluster) -> None:
        self._cluster = cluster

    def read(self, partition: int, start: int, limit: int) -> list[HalfEntry]:
        found: list[HalfEntry] = []
        for raw in self._cluster.half.read(start):
            if len(found) >= limit:
                break
            found.append(HalfEntry.of(raw))
        return found


class CheckerProcess:
    """One checker process owning the model's partition: its memory, and the real loader."""

    def __init__(self, cluster: Cluster, ended_capacity: int, margin_seconds: float) -> None:
        self.topics = cluster.topics
        self._ended = EndedTransactions(ended_capacity)
        self._checkpoint: Checkpoint | None = None
        consumer = _GroupConsumer(cluster)
        self._loader = CheckpointLoader(
            lambda: consumer,
            cluster.topics,
            _HalfCursor(cluster),
            lambda partition: ModelReader(cluster),
            self._ended,
            margin_seconds,
        )

    def checkpoint(self) -> Checkpoint:
        """The checkpoint a round starts from: remembered, or loaded as the service does."""
        if self._checkpoint is None:
            self._checkpoint = self._loader.load(0)
        return self._checkpoint

    def remember(self, checkpoint: Checkpoint) -> None:
        self._checkpoint = checkpoint

    @property
    def ended(self) -> EndedTransactions:
        return self._ended
