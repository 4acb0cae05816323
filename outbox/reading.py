"""Reading a whole topic up to its current end, for commands, the demo and tests.

Stops at the end offsets taken when the read starts, so it neither misses what
was there nor waits for what comes later. Reads with ``read_committed`` by
default: what a downstream consumer would see.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from outbox.errors import KafkaUnavailableError
from outbox.protocol import RawRecord


def read_topic(
    client_config: dict[str, Any],
    topic: str,
    *,
    isolation: str = "read_committed",
    timeout: float = 30.0,
) -> list[RawRecord]:
    """Every record of ``topic`` from the beginning to its end offsets at call time."""
    consumer = Consumer(
        {
            **client_config,
            "group.id": f"outbox-reader-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "enable.partition.eof": False,
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=timeout)
        described = metadata.topics.get(topic)
        if described is None or described.error is not None:
            raise KafkaUnavailableError(f"topic {topic} does not exist or cannot be described")
        ends: dict[int, int] = {}
        for partition in described.partitions:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=timeout
            )
            if high > low:
                ends[partition] = high
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        records: list[RawRecord] = []
        deadline = time.monotonic() + timeout
        while ends:
            if time.monotonic() > deadline:
                raise KafkaUnavailableError(
                    f"reading {topic} did not reach its end offsets within {timeout:g}s "
                    f"(an open Kafka transaction holds back read_committed readers)"
                )
            for message in consumer.consume(num_messages=500, timeout=0.5):
                if message.error():
                    raise KafkaUnavailableError(f"reading {topic}: {message.error()}")
                records.append(RawRecord.from_kafka(message))
            for partition in list(ends):
                position = consumer.position([TopicPartition(topic, partition)])[0].offset
                if position >= ends[partition]:
                    del ends[partition]
        return records
    except KafkaException as exc:
        raise KafkaUnavailableError(f"reading {topic}: {exc}") from None
    finally:
        consumer.close()
