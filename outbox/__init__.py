"""A Kafka-backed transactional outbox: RocketMQ's transactional messages for Python.

The producer API mirrors RocketMQ's ``TransactionMQProducer``; the wire protocol
shared by every component is in :mod:`outbox.protocol`.
"""

from importlib.metadata import PackageNotFoundError, version

from outbox.async_producer import AsyncTransactionListener, AsyncTransactionProducer
from outbox.caller_transaction import CallerTransactionError
from outbox.errors import (
    EndTransactionError,
    HalfWriteError,
    InvalidMessageError,
    KafkaUnavailableError,
    LateEndRefusedError,
    ListenerMissingError,
    MessageTooLargeError,
    OutboxError,
    ProducerClosedError,
    ProducerNotStartedError,
    ProducerStateError,
)
from outbox.message import (
    EndStatus,
    LocalTransactionState,
    Message,
    SendStatus,
    TransactionSendResult,
)
from outbox.producer import TransactionListener, TransactionProducer
from outbox.serialization import MessageSerializationError
from outbox.settings import ProducerSettings

try:
    __version__ = version("kafka-outbox")
except PackageNotFoundError:  # a source tree on sys.path, never installed
    __version__ = "0+unknown"

__all__ = [
    "AsyncTransactionListener",
    "AsyncTransactionProducer",
    "CallerTransactionError",
    "EndStatus",
    "EndTransactionError",
    "HalfWriteError",
    "InvalidMessageError",
    "KafkaUnavailableError",
    "LateEndRefusedError",
    "ListenerMissingError",
    "LocalTransactionState",
    "Message",
    "MessageSerializationError",
    "MessageTooLargeError",
    "OutboxError",
    "ProducerClosedError",
    "ProducerNotStartedError",
    "ProducerSettings",
    "ProducerStateError",
    "SendStatus",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
    "__version__",
]
