"""Errors the outbox raises to its callers, one type per thing that can go wrong.

Each message names the problem and, where there is one, the fix.
"""

from __future__ import annotations


class OutboxError(Exception):
    """Base of every error the outbox raises on purpose."""


class ConfigurationError(OutboxError, ValueError):
    """A setting is missing or invalid."""


class KafkaUnavailableError(OutboxError):
    """The Kafka cluster did not answer in time."""


class TopicAdminError(OutboxError):
    """Creating or checking the outbox topics failed."""


class TopicMismatchError(TopicAdminError):
    """Existing topics disagree with what the outbox needs (e.g. partition counts)."""


class ListenerMissingError(OutboxError, TypeError):
    """A TransactionProducer needs a listener (RocketMQ: "TransactionListener is null")."""


class InvalidMessageError(OutboxError, ValueError):
    """The message cannot be sent as given; nothing was written."""


class MessageTooLargeError(InvalidMessageError):
    """The message is larger than the topic (or broker) accepts."""


class ProducerStateError(OutboxError):
    """The producer is not in a state to do that."""


class ProducerNotStartedError(ProducerStateError):
    """``start()`` has not been called (or did not succeed)."""


class ProducerClosedError(ProducerStateError):
    """``shutdown()`` has been called."""


class HalfWriteError(OutboxError):
    """The half record was not acknowledged; the local transaction did not run."""


class EndTransactionError(OutboxError):
    """Writing the decision op of a transaction failed; the checker will ask."""


class LateEndRefusedError(EndTransactionError):
    """Too late to end the transaction directly: it is left to the check-back.

    RocketMQ 5.1.1 refuses a producer's own end that arrives after
    max(immunity, transaction timeout), as this producer does before writing
    the op: by then a check-back may have answered already, and the relay
    keeps the first decision for a half, so a late own COMMIT after a ROLLBACK
    answer would be silently ignored. Refusing it tells the caller instead.
    """
