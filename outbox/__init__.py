"""A Kafka-backed transactional outbox: RocketMQ's transactional messages for Python.

The producer API mirrors RocketMQ's ``TransactionMQProducer``; the wire protocol
shared by every component is in :mod:`outbox.protocol`.
"""

from importlib.metadata import PackageNotFoundError, version

from outbox.async_producer import AsyncTransactionListener, AsyncTransactionProducer
from outbox.caller_transaction import AsyncCallerTransaction, CallerTransaction
from outbox.durations import DurationError
from outbox.errors import (
    CallerTransactionError,
    ConfigurationError,
    ConnectionSecurityError,
    DuplicateInstanceError,
    EndTransactionError,
    HalfWriteError,
    InvalidMessageError,
    KafkaUnavailableError,
    LateEndRefusedError,
    ListenerMissingError,
    MessageTooLargeError,
    NotAuthorizedError,
    OutboxError,
    ProducerClosedError,
    ProducerNotStartedError,
    ProducerStateError,
    QueueFullError,
    TopicAdminError,
    TopicMismatchError,
)
from outbox.message import (
    EndStatus,
    LocalTransactionState,
    Message,
    SendStatus,
    TransactionSendResult,
)
from outbox.producer import TransactionListener, TransactionProducer
from outbox.protocol.errors import InvalidNameError, MalformedRecordError, ProtocolError
from outbox.serialization import MessageSerializationError
from outbox.settings import ProducerSettings
from outbox.sql.errors import (
    CommitOutcomeUnknownError,
    DatabaseUnavailableError,
    JoinError,
    LocalTransactionMisuseError,
    LocalTransactionRolledBackByCheckError,
    LocalTransactionTooSlowError,
    MigrationError,
    TransactionLogError,
    TransactionLogMissingError,
    TransactionLogPrivilegeError,
)

try:
    __version__ = version("kafka-outbox")
except PackageNotFoundError:  # a source tree on sys.path, never installed
    __version__ = "0+unknown"

# Grouped as a reader looks for them; every error a public call raises derives from
# OutboxError (the checker's and the sink's own errors too, in their packages).
__all__ = [  # noqa: RUF022
    "__version__",
    # producing
    "AsyncCallerTransaction",
    "AsyncTransactionListener",
    "AsyncTransactionProducer",
    "CallerTransaction",
    "CallerTransactionError",
    "EndStatus",
    "LocalTransactionState",
    "Message",
    "ProducerSettings",
    "SendStatus",
    "TransactionListener",
    "TransactionProducer",
    "TransactionSendResult",
    # errors: the root, and settings and the cluster
    "OutboxError",
    "ConfigurationError",
    "DurationError",
    "DuplicateInstanceError",
    "KafkaUnavailableError",
    "ConnectionSecurityError",
    "NotAuthorizedError",
    "TopicAdminError",
    "TopicMismatchError",
    # errors of a send
    "ListenerMissingError",
    "InvalidMessageError",
    "MessageTooLargeError",
    "MessageSerializationError",
    "ProducerStateError",
    "ProducerNotStartedError",
    "ProducerClosedError",
    "QueueFullError",
    "HalfWriteError",
    "EndTransactionError",
    "LateEndRefusedError",
    # errors of the wire protocol (also ValueErrors)
    "ProtocolError",
    "InvalidNameError",
    "MalformedRecordError",
    # errors of the SQL transaction log (outbox.sql)
    "TransactionLogError",
    "DatabaseUnavailableError",
    "TransactionLogMissingError",
    "TransactionLogPrivilegeError",
    "MigrationError",
    "CommitOutcomeUnknownError",
    "LocalTransactionMisuseError",
    "LocalTransactionTooSlowError",
    "LocalTransactionRolledBackByCheckError",
    "JoinError",
]
