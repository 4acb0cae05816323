"""The producer's settings: one typed object, every field an ``OUTBOX_*`` variable.

Defaults follow RocketMQ where it has one (transaction timeout 6 s, one check
thread with a queue of 2000, ends acknowledged unless ``end_oneway``).
"""

from __future__ import annotations

from pydantic import Field

from outbox.config import KafkaSettings
from outbox.durations import Seconds
from outbox.protocol import TRANSACTION_TIMEOUT_SECONDS


class ProducerSettings(KafkaSettings):
    """Everything a :class:`~outbox.producer.TransactionProducer` can be tuned with."""

    transaction_timeout_seconds: Seconds = Field(
        TRANSACTION_TIMEOUT_SECONDS,
        gt=0,
        description="how long this producer may end its own transaction (RocketMQ"
        " transactionTimeOut), less late_end_margin_seconds; carried on each half, so the"
        " checker never asks about a half sooner",
    )
    late_end_margin_seconds: Seconds = Field(
        1.0, ge=0, description="safety margin before the transaction timeout for own ends"
    )
    end_oneway: bool = Field(
        False,
        description="hand the decision op to the client and return without waiting for its ack"
        " (RocketMQ endTransactionOneway); a lost op is logged and left to the check-back",
    )
    check_threads: int = Field(1, ge=1, description="check executor threads (RocketMQ: 1)")
    check_queue_size: int = Field(
        2000, ge=1, description="check requests waiting for a thread (RocketMQ: 2000)"
    )
    check_request_ttl_seconds: Seconds = Field(
        60.0, gt=0, description="check requests older than this are dropped; the checker re-asks"
    )
    start_timeout_seconds: Seconds = Field(
        10.0, gt=0, description="how long start() waits for the cluster to answer"
    )
    send_timeout_seconds: Seconds = Field(
        30.0,
        gt=0,
        description="how long a send waits for its half ack, and again for its decision op",
    )
    park_when_unavailable: bool = Field(
        False,
        description="when Kafka does not acknowledge a half within park_after_seconds, run the"
        " local transaction anyway and keep the event in its transaction-log row, for the"
        " checker to publish once Kafka takes writes again (needs a SQL listener and a checker"
        " with resolve_from_db)",
    )
    park_after_seconds: Seconds = Field(
        0.5,
        gt=0,
        description="with park_when_unavailable: how long a send waits for its half's"
        " acknowledgement before it parks the event instead (and for its decision op's, which"
        " the check-back stands in for when it is late)",
    )
