"""Errors the outbox raises to its callers, one type per thing that can go wrong.

Each message names the problem and, where there is one, the fix.
"""

from __future__ import annotations


class OutboxError(Exception):
    """Base of every error the outbox raises on purpose."""

    retriable: bool = False
    """Whether the same call may succeed if tried again (as confluent-kafka's
    ``KafkaError.retriable()``): Kafka away or slow, not bad input or a refusal."""


class ConfigurationError(OutboxError, ValueError):
    """A setting is missing or invalid."""


class DuplicateInstanceError(ConfigurationError):
    """Another running checker replica has this one's instance id: they would fence each
    other for ever (its consumer groups and Kafka transactions are claimed by that id)."""

    def __init__(self, instance: str, detail: str = "") -> None:
        self.instance = instance
        super().__init__(
            f"another checker replica runs with instance id {instance!r}"
            f"{f' ({detail})' if detail else ''}; give each replica its own OUTBOX_INSTANCE_ID"
        )


class CallerTransactionError(OutboxError):
    """``producer.transaction(...)`` cannot be used so: join outside the block, twice, a
    listener that keeps no transaction log. Base of every error of that form, so one
    ``except`` catches them all (:class:`outbox.sql.JoinError`: the session cannot take
    the row)."""


class KafkaUnavailableError(OutboxError):
    """The Kafka cluster did not answer in time."""


class ConnectionSecurityError(KafkaUnavailableError):
    """Kafka refused the login or the TLS handshake; the message says what to check."""


class NotAuthorizedError(OutboxError):
    """The broker's authoriser refused an operation: an ACL is missing.

    Raised where the refusal happens, which knows the operation and the
    resource; the component that knows its principal names it with
    :meth:`by`.
    """

    def __init__(self, operation: str, resource: str, principal: str | None = None) -> None:
        self.operation = operation
        self.resource = resource
        self.principal = principal
        who = f" as {principal}" if principal else ""
        super().__init__(
            f"not authorised to {operation} {resource}{who}; grant it (`outbox acls print"
            " --producer-group GROUP` lists the ACLs each component needs)"
        )

    def by(self, principal: str | None) -> NotAuthorizedError:
        """The same refusal, naming the principal that was refused."""
        if principal is None or self.principal is not None:
            return self
        return NotAuthorizedError(self.operation, self.resource, principal)


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


class QueueFullError(OutboxError):
    """The Kafka client's queue had no room; nothing was enqueued, so trying again is safe."""


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
