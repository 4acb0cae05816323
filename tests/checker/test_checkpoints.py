"""The checkpoint loader asks again what Kafka refused for a moment, and only that."""

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from outbox.errors import KafkaUnavailableError
from outbox.protocol import TopicNames
from outbox_checker.checkpoints import RETRIABLE_ATTEMPTS, CheckpointLoader
from outbox_checker.ended import EndedTransactions


class RefusingConsumer:
    """Refuses ``offsets_for_times`` with ``error`` ``times`` times, then answers 42.

    Stands in for the group consumer: what is claimed is how the loader answers a refusal,
    which a real broker gives only in the instant after its restart (a stale leader epoch).
    """

    def __init__(self, error: KafkaError, times: int) -> None:
        self.error, self.times, self.asked = error, times, 0

    def offsets_for_times(self, partitions: list[TopicPartition], timeout: float):
        self.asked += 1
        if self.asked <= self.times:
            raise KafkaException(self.error)
        (asked,) = partitions
        return [TopicPartition(asked.topic, asked.partition, 42)]


def loader(consumer: RefusingConsumer) -> CheckpointLoader:
    topics = TopicNames("t")
    return CheckpointLoader(lambda: consumer, topics, None, None, EndedTransactions(8), 60.0)  # type: ignore[arg-type]


STALE_EPOCH = KafkaError(KafkaError.FENCED_LEADER_EPOCH, "Leader epoch is older")  # not "retriable"


def test_a_stale_leader_epoch_after_a_restart_is_asked_again():
    consumer = RefusingConsumer(STALE_EPOCH, times=2)
    assert loader(consumer).offset_for_time("t.op", 0, 1_000) == 42
    assert consumer.asked == 3


def test_a_refusal_that_lasts_is_kafka_unavailable_after_a_few_attempts():
    consumer = RefusingConsumer(STALE_EPOCH, times=100)
    with pytest.raises(KafkaUnavailableError, match=r"offsets for time in t\.op"):
        loader(consumer).offset_for_time("t.op", 0, 1_000)
    assert consumer.asked == RETRIABLE_ATTEMPTS


def test_a_refusal_kafka_does_not_call_retriable_is_not_asked_again():
    denied = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "denied", retriable=False)
    consumer = RefusingConsumer(denied, times=1)
    with pytest.raises(KafkaUnavailableError):
        loader(consumer).offset_for_time("t.op", 0, 1_000)
    assert consumer.asked == 1
