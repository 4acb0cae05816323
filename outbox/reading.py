"""Reading a whole topic up to its current end, for commands, the demo and tests.

Stops at the end offsets taken when the read starts, so it neither misses what
was there nor waits for what comes later. Reads with ``read_committed`` by
default: what a downstream consumer would see.
"""

from __future__ import annotations

import logging
import time
import uuid
from contextlib import suppress
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from outbox.errors import KafkaUnavailableError
from outbox.protocol import RawRecord

log = logging.getLogger(__name__)


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
    deadline = time.monotonic() + timeout  # the whole read, its metadata question included
    try:
        metadata = consumer.list_topics(topic, timeout=timeout)
        described = metadata.topics.get(topic)
        if described is None or described.error is not None:
            raise KafkaUnavailableError(f"topic {topic} does not exist or cannot be described")
        ends: dict[int, int] = {}
        for partition in described.partitions:
            # A partition whose leader is down or moving waits for the next one (a node
            # restarting), as long as the read's timeout allows.
            low, high = watermarks(
                consumer,
                TopicPartition(topic, partition),
                timeout=max(0.1, deadline - time.monotonic()),
                exists=True,
            )
            if high > low:
                ends[partition] = high
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        records: list[RawRecord] = []
        while ends:
            if time.monotonic() > deadline:
                raise KafkaUnavailableError(
                    f"reading {topic} did not reach its end offsets within {timeout:g}s "
                    f"(a partition without a leader, or an open Kafka transaction holding "
                    f"back read_committed readers)"
                )
            for message in consumer.consume(num_messages=500, timeout=0.5):
                error = message.error()
                if error is not None and error.code() in NO_LEADER_ERRORS:
                    continue  # the consumer finds the new leader itself; the deadline bounds it
                if error is not None:
                    raise KafkaUnavailableError(f"reading {topic}: {error}")
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


LEADER_PATIENCE = 2.0
"""How long one watermark question waits on a partition's leader before the client is made
to look the leader up again."""
NO_LEADER_ERRORS = (
    KafkaError._TIMED_OUT,
    KafkaError._TRANSPORT,
    KafkaError._DESTROY_BROKER,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
)


def watermarks(
    consumer: Consumer, partition: TopicPartition, timeout: float, *, exists: bool = False
) -> tuple[int, int]:
    """A partition's low and high watermarks, asked of its leader.

    librdkafka sends the question to the leader it knows and waits for that node: after
    the leader was killed or frozen, for the whole ``timeout`` (30 s) or until the node
    came back, though the controller elected a new leader within its broker session
    (5-9 s); a three-node chaos run stalled publication 15 s on one such call. And after
    a node came back, a long-lived consumer could answer ``_UNKNOWN_PARTITION`` for a
    partition the cluster has, round after round, for minutes. So each question waits
    :data:`LEADER_PATIENCE` at most; one unanswered (or answered by no leader) refreshes
    the topic's metadata, which names the new leader, and is asked again until ``timeout``
    (an unknown partition once only: a partition a topic lacks is no outage; until
    ``timeout`` if the caller saw it in the topic's metadata, ``exists``: a partition whose
    only replica's node is down drops out of the client's metadata).
    """
    deadline = time.monotonic() + timeout
    unknown_once = False
    while True:
        remaining = deadline - time.monotonic()
        try:
            low, high = consumer.get_watermark_offsets(
                partition, timeout=max(0.1, min(LEADER_PATIENCE, remaining))
            )
            return int(low), int(high)
        except KafkaException as exc:
            code = exc.args[0].code()
            unknown = code == KafkaError._UNKNOWN_PARTITION and (exists or not unknown_once)
            if not (code in NO_LEADER_ERRORS or unknown) or time.monotonic() >= deadline:
                raise
            unknown_once = unknown_once or unknown
            log.info(
                "%s[%d] unanswered by the leader the client knows (%s): refreshing its metadata",
                partition.topic,
                partition.partition,
                exc.args[0].str(),
            )
        with suppress(KafkaException):
            consumer.list_topics(
                partition.topic,
                timeout=max(0.1, min(LEADER_PATIENCE, deadline - time.monotonic())),
            )
