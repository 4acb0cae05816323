"""The relay's Kafka transaction: real records, discards and op offsets, committed together.

One transactional producer per replica (its ``transactional.id`` the same across
restarts, so a new incarnation fences the old one's open transaction) writes a
batch's records and sends the consumed op offsets, with the decision memories
in their metadata, to the same transaction (consume → produce →
``send_offsets_to_transaction``, fenced by the group's generation: KIP-447).
A transaction that does not finish by its deadline is abandoned and its
producer fenced, so exactly-once does not hang on a lost coordinator.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import KafkaException, Producer, TopicPartition

from outbox.acked_writer import produce_when_room
from outbox.errors import KafkaUnavailableError
from outbox.protocol import OutgoingRecord
from outbox_checker import metrics
from outbox_checker.errors import StuckError
from outbox_checker.watchdog import call_with_deadline

log = logging.getLogger("outbox_checker.relay")  # the relay's one logger, whichever module logs

_PRODUCE = metrics.RELAY_STAGE_SECONDS.labels("produce")
_COMMIT = metrics.RELAY_STAGE_SECONDS.labels("commit")


class RelayTransactions:
    """The relay's transactional producer and the transaction under way, if any."""

    def __init__(self, producer_config: dict[str, Any], timeout: float, deadline: float) -> None:
        """``deadline``: how long a transaction may run before it is abandoned
        (:attr:`~outbox_checker.relay.RelaySettings.transaction_deadline`)."""
        self._config = producer_config
        self._timeout = timeout
        self._deadline = deadline
        self._in_transaction = False
        self._stage = ""
        """The call the transaction under way is in: what a stuck one names."""
        self._batch_topics: list[str] = []
        """Topics the transaction under way writes: what a refused WRITE names."""
        self._renew_producer = False
        """Start the next transaction on a fresh producer: set after a failed batch and a
        revoked or lost assignment (see :meth:`prepare`)."""
        self._producer = self._new_producer()

    @property
    def in_transaction(self) -> bool:
        """Whether a transaction is under way (a refusal then concerns its writes)."""
        return self._in_transaction

    @property
    def topics_written(self) -> list[str]:
        """Topics the transaction under way (or the last one) writes."""
        return list(self._batch_topics)

    def renew(self) -> None:
        """Start the next transaction on a fresh producer (see :meth:`prepare`)."""
        self._renew_producer = True

    def prepare(self) -> None:
        """A fresh producer for the transaction after a failure or a lost assignment.

        After an outage librdkafka can keep a decommissioned broker as the producer's
        group coordinator (a broker missing from one metadata answer, as a restarted one
        is until it has registered: confluentinc/librdkafka#5511), and
        ``send_offsets_to_transaction`` then waits for it past any timeout, until the
        transaction deadline abandons it (5 s of publication). A new producer looks the
        coordinator up again; its ``init_transactions`` also fences the old one's open
        transaction. Raises KafkaUnavailableError while Kafka cannot start one (the batch
        is read again).
        """
        if self._renew_producer:
            self._producer = self._new_producer()
            self._renew_producer = False

    def commit(
        self, outgoing: list[OutgoingRecord], offsets: list[TopicPartition], group: object
    ) -> None:
        """Write ``outgoing`` and commit ``offsets`` for consumer ``group``, in one transaction,
        within the deadline; a stuck one fences its producer and raises KafkaUnavailableError."""
        self._batch_topics = sorted({record.topic for record in outgoing})
        producer = self._producer
        self._in_transaction = True
        try:
            call_with_deadline(
                lambda: self._transact(producer, outgoing, offsets, group),
                self._deadline,
                "outbox-relay-transaction",
            )
        except StuckError as exc:
            log.error(
                "a relay transaction is stuck in %s; fencing its producer: %s", self._stage, exc
            )
            self._in_transaction = False
            self._producer = self._new_producer()
            raise KafkaUnavailableError(f"relay transaction abandoned: {exc}") from None
        self._in_transaction = False

    def abort(self) -> bool:
        """Abort the transaction under way, if any, or start a fresh producer when the abort
        fails; ``False`` while no producer can be started (nothing can resume yet)."""
        try:
            if self._in_transaction:
                # Within the deadline, not the client timeout (30 s): an abort blocks while
                # the transaction's coordinator is frozen or dead, and a fresh producer's
                # init_transactions aborts the transaction as well, at its new coordinator.
                self._producer.abort_transaction(self._deadline)
                self._in_transaction = False
        except KafkaException as exc:
            log.warning("relay abort failed (%s); starting a fresh producer", exc)
            self._in_transaction = False
            try:
                self._producer = self._new_producer()
                self._renew_producer = False
            except KafkaUnavailableError as again:
                log.warning("relay producer not ready yet: %s", again)
                return False
        return True

    def flush(self, timeout: float) -> None:
        """Deliver what the producer still holds (on close)."""
        self._producer.flush(timeout)

    def _new_producer(self) -> Producer:
        producer = Producer(self._config)
        try:
            # Fences an earlier producer with this transactional.id, aborting its open batch.
            producer.init_transactions(self._timeout)
        except KafkaException as exc:
            raise KafkaUnavailableError(f"cannot start the relay's producer: {exc}") from None
        return producer

    def _transact(
        self,
        producer: Producer,
        outgoing: list[OutgoingRecord],
        offsets: list[TopicPartition],
        group: object,
    ) -> None:
        """The batch's Kafka transaction: real records, discards, op offsets with the memory."""
        started = time.monotonic()
        self._stage = "begin_transaction"
        producer.begin_transaction()
        self._stage = "produce"
        for record in outgoing:
            produce_when_room(producer, **record.produce_kwargs())
        produced = time.monotonic()
        _PRODUCE.observe(produced - started)
        self._stage = "send_offsets_to_transaction"
        producer.send_offsets_to_transaction(offsets, group, self._timeout)
        self._stage = "commit_transaction"
        producer.commit_transaction(self._timeout)
        _COMMIT.observe(time.monotonic() - produced)
