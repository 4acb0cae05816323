"""Acknowledged writes: one idempotent producer shared by every sending thread.

Halves and decision ops both go through it. A send must not run its local
transaction before its half is stored, and by default must not report a
decision before its op is stored, so each caller waits for its own delivery
report. A background thread serves the reports, so many threads' records share
the client's batches instead of each flushing the whole producer. A oneway op
(``end_oneway``) is handed to the client instead; its report comes later.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from outbox.errors import OutboxError
from outbox.protocol import OutgoingRecord

log = logging.getLogger(__name__)

DeliveryReport = Callable[[KafkaError | None], None]
"""Told the outcome of a oneway write: None once stored, else the client's error."""


class _Delivery:
    __slots__ = ("done", "error", "offset", "partition")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: KafkaError | None = None
        self.partition = -1
        self.offset = -1

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        self.error = error
        if error is None:
            self.partition = message.partition() or 0
            self.offset = message.offset() or 0
        self.done.set()


class AckedWriter:
    """Idempotent, ``acks=all`` writes: each caller waits for its own ack, or hands it off."""

    def __init__(self, client_config: dict[str, Any]) -> None:
        self.producer = Producer(
            {
                **client_config,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 1,
            }
        )
        self._closed = threading.Event()
        self._poller = threading.Thread(target=self._serve_reports, name="outbox-acks")
        self._poller.daemon = True
        self._poller.start()

    def _serve_reports(self) -> None:
        while not self._closed.is_set():
            self.producer.poll(0.05)

    def write(
        self, record: OutgoingRecord, timeout: float, failure: type[OutboxError]
    ) -> tuple[int, int]:
        """Store ``record``; return its (partition, offset) once acknowledged.

        Raises ``failure`` when it was refused or not acknowledged in time. A
        timed-out record may still be stored later: both kinds written here are
        safe to find late (a half is then checked, an op says what the caller decided).
        """
        delivery = _Delivery()
        deadline = time.monotonic() + timeout
        self._enqueue(record, delivery, deadline, failure)
        if not delivery.done.wait(max(0.0, deadline - time.monotonic())):
            raise failure(f"{record.topic} record not acknowledged within {timeout:g}s")
        if delivery.error is not None:
            raise failure(f"{record.topic} record not stored: {delivery.error}")
        return delivery.partition, delivery.offset

    def send(
        self,
        record: OutgoingRecord,
        timeout: float,
        failure: type[OutboxError],
        report: DeliveryReport,
    ) -> None:
        """Hand ``record`` to the client and return; ``report`` learns whether it was stored.

        Raises ``failure`` only if the client would not take it (queue full for
        ``timeout``, or refused outright); ``report`` is then never called.
        """
        self._enqueue(
            record, lambda error, _message: report(error), time.monotonic() + timeout, failure
        )

    def _enqueue(
        self,
        record: OutgoingRecord,
        on_delivery: Callable[[KafkaError | None, Message], None],
        deadline: float,
        failure: type[OutboxError],
    ) -> None:
        while True:
            try:
                self.producer.produce(**record.produce_kwargs(), on_delivery=on_delivery)
                return
            except BufferError:
                # The client's queue is full; nothing was enqueued, so trying again is safe.
                if time.monotonic() > deadline:
                    raise failure(
                        f"the producer queue stayed full; {record.topic} record not written"
                    ) from None
                time.sleep(0.005)
            except KafkaException as exc:
                raise failure(f"{record.topic} record rejected: {exc.args[0]}") from None

    def close(self, timeout: float = 10.0) -> None:
        """Deliver what is still queued (oneway ops included, whose reports then run)."""
        self._closed.set()
        self._poller.join(timeout)
        remaining = self.producer.flush(timeout)
        if remaining:
            log.warning("%d records were still unacknowledged at close", remaining)


def produce_when_room(producer: Producer, **kwargs: Any) -> None:
    """``producer.produce(**kwargs)``, serving delivery reports while the client's queue is full.

    A full queue (``BufferError``) enqueued nothing, so trying again is safe; for
    writers that may wait as long as the broker needs (their own deadline is
    elsewhere: a transaction timeout, a flush).
    """
    while True:
        try:
            producer.produce(**kwargs)
            return
        except BufferError:
            producer.poll(0.01)
