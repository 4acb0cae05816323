"""The producer's settings: one typed object, every field an ``OUTBOX_*`` variable.

Defaults follow RocketMQ where it has one (transaction timeout 6 s, one check
thread with a queue of 2000), and keep Kafka transactions short: an open Kafka
transaction holds back every ``read_committed`` reader downstream.
"""

from __future__ import annotations

from pydantic import Field

from outbox.config import KafkaSettings


class ProducerSettings(KafkaSettings):
    """Everything a :class:`~outbox.producer.TransactionProducer` can be tuned with."""

    transaction_timeout_seconds: float = Field(
        6.0,
        gt=0,
        description="age before the checker may check a half (RocketMQ transactionTimeOut);"
        " the producer stops ending its own transactions shortly before it",
    )
    late_end_margin_seconds: float = Field(
        1.0, ge=0, description="safety margin before the transaction timeout for own ends"
    )
    group_commit_max_batch: int = Field(
        500, ge=1, description="most transaction ends written in one Kafka transaction"
    )
    group_commit_max_wait_ms: float = Field(
        2.0, ge=0, description="how long a group commit waits for more ends to join it"
    )
    kafka_transaction_timeout_ms: int = Field(
        10_000, ge=1000, description="Kafka transaction.timeout.ms of the end producer"
    )
    check_threads: int = Field(1, ge=1, description="check executor threads (RocketMQ: 1)")
    check_queue_size: int = Field(
        2000, ge=1, description="check requests waiting for a thread (RocketMQ: 2000)"
    )
    check_request_ttl_seconds: float = Field(
        60.0, gt=0, description="check requests older than this are dropped; the checker re-asks"
    )
    start_timeout_seconds: float = Field(
        10.0, gt=0, description="how long start() waits for the cluster to answer"
    )
    send_timeout_seconds: float = Field(
        30.0, gt=0, description="how long a send waits for its half ack, and again for its end"
    )
    instance_id: str | None = Field(
        None,
        description="stable id of this producer instance, for its Kafka transactional.id;"
        " a restarted instance with the same id fences its predecessor at once",
    )
