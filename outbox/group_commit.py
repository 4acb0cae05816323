"""Group commit: the ends of concurrent transactions share one Kafka transaction.

A Kafka transactional producer runs one transaction at a time, and committing
one costs a few round trips. Serialising every outbox end through it would cap a
service at a few hundred ends per second; instead one thread takes every end
waiting (up to a batch size, lingering a moment for more) and writes them all in
one Kafka transaction. Ends stay in submission order, so one producer's commits
for one key reach the real topic in commit order.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from outbox.errors import EndTransactionError, LateEndRefusedError, ProducerClosedError
from outbox.protocol import OutgoingRecord

log = logging.getLogger(__name__)

_ATTEMPTS = 2


@dataclass
class EndRequest:
    """Records that must become visible together, and the caller waiting for them."""

    records: Sequence[OutgoingRecord]
    start_before: float | None = None
    """Monotonic time after which writing them would be too late (late-end rule)."""
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def finish(self, error: BaseException | None = None) -> None:
        self.error = error
        self.done.set()


class GroupCommitter:
    """Owns the transactional producer; writes queued ends in shared Kafka transactions."""

    def __init__(
        self,
        client_config: dict[str, Any],
        transactional_id: str,
        *,
        max_batch: int,
        max_wait_seconds: float,
        transaction_timeout_ms: int,
        operation_timeout: float,
    ) -> None:
        self._config = {
            **client_config,
            "transactional.id": transactional_id,
            "enable.idempotence": True,
            "acks": "all",
            "transaction.timeout.ms": transaction_timeout_ms,
            "linger.ms": 0,
        }
        self._max_batch = max_batch
        self._max_wait = max_wait_seconds
        self._timeout = operation_timeout
        self._queue: queue.SimpleQueue[EndRequest] = queue.SimpleQueue()
        self._closing = threading.Event()
        self._producer = self._new_producer()
        self._thread = threading.Thread(target=self._run, name="outbox-group-commit", daemon=True)

    def _new_producer(self) -> Producer:
        producer = Producer(self._config)
        # Fences any earlier instance with this transactional.id and aborts its open transaction.
        producer.init_transactions(self._timeout)
        return producer

    def start(self) -> None:
        self._thread.start()

    def submit(self, records: Sequence[OutgoingRecord], start_before: float | None) -> EndRequest:
        if self._closing.is_set():
            raise ProducerClosedError("the producer is shutting down; end not written")
        request = EndRequest(records, start_before)
        self._queue.put(request)
        return request

    def close(self, timeout: float) -> None:
        """Write every end already queued, then stop."""
        self._closing.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("group commit thread still busy after %.1fs", timeout)
        while True:
            try:
                self._queue.get_nowait().finish(ProducerClosedError("producer closed"))
            except queue.Empty:
                break
        self._producer.flush(timeout)

    def _run(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=0.05)
            except queue.Empty:
                if self._closing.is_set():
                    return
                continue
            batch = self._collect(first)
            try:
                self._commit(batch)
            except Exception as exc:  # never let the thread die: fail the batch instead
                log.exception("group commit failed unexpectedly")
                for request in batch:
                    if not request.done.is_set():
                        request.finish(EndTransactionError(f"group commit failed: {exc}"))

    def _collect(self, first: EndRequest) -> list[EndRequest]:
        batch = [first]
        deadline = time.monotonic() + self._max_wait
        while len(batch) < self._max_batch:
            remaining = deadline - time.monotonic()
            try:
                if remaining > 0:
                    batch.append(self._queue.get(timeout=remaining))
                else:
                    batch.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _commit(self, batch: list[EndRequest]) -> None:
        now = time.monotonic()
        live = []
        for request in batch:
            if request.start_before is not None and now > request.start_before:
                request.finish(LateEndRefusedError("end waited too long in the queue"))
            else:
                live.append(request)
        if not live:
            return
        error: BaseException | None = None
        for _ in range(_ATTEMPTS):
            error = self._try_transaction(live)
            if error is None:
                for request in live:
                    request.finish()
                return
        for request in live:
            request.finish(EndTransactionError(f"Kafka transaction failed: {error}"))

    def _try_transaction(self, batch: list[EndRequest]) -> BaseException | None:
        """One Kafka transaction for the whole batch; the error if it did not commit.

        Retrying after a failure is safe: an aborted Kafka transaction leaves
        nothing visible to ``read_committed`` readers.
        """
        producer = self._producer
        try:
            producer.begin_transaction()
            for request in batch:
                for record in request.records:
                    self._produce(producer, record)
            self._commit_transaction(producer)
            return None
        except KafkaException as exc:
            kafka_error: KafkaError = exc.args[0]
            log.warning("Kafka transaction of %d ends failed: %s", len(batch), kafka_error)
            self._recover(kafka_error)
            return exc

    def _produce(self, producer: Producer, record: OutgoingRecord) -> None:
        while True:
            try:
                producer.produce(**record.produce_kwargs())
                return
            except BufferError:
                producer.poll(0.01)

    def _commit_transaction(self, producer: Producer) -> None:
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                producer.commit_transaction(max(1.0, deadline - time.monotonic()))
                return
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                # A retriable commit error (e.g. a timeout) may be retried as is.
                if not error.retriable() or time.monotonic() > deadline:
                    raise

    def _recover(self, error: KafkaError) -> None:
        try:
            if error.fatal():
                log.error("transactional producer hit a fatal error; re-initialising: %s", error)
                self._producer = self._new_producer()
            else:
                self._producer.abort_transaction(self._timeout)
        except KafkaException as exc:
            log.error("could not recover the transactional producer: %s", exc)
            self._producer = self._new_producer()
