"""Writing half records: one idempotent producer shared by every sending thread.

A send must not run its local transaction before its half is stored, so each
caller waits for its own delivery report. A background thread serves the
reports, so many threads' halves share the client's batches instead of each
flushing the whole producer.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from outbox.errors import HalfWriteError
from outbox.protocol import OutgoingRecord

log = logging.getLogger(__name__)


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


class HalfWriter:
    """Idempotent, ``acks=all`` writes whose callers each wait for their own ack."""

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
        self._poller = threading.Thread(target=self._serve_reports, name="outbox-half-acks")
        self._poller.daemon = True
        self._poller.start()

    def _serve_reports(self) -> None:
        while not self._closed.is_set():
            self.producer.poll(0.05)

    def write(self, record: OutgoingRecord, timeout: float) -> tuple[int, int]:
        """Store ``record``; return its (partition, offset) once acknowledged."""
        delivery = _Delivery()
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.producer.produce(**record.produce_kwargs(), on_delivery=delivery)
                break
            except BufferError:
                # The client's queue is full; nothing was enqueued, so trying again is safe.
                if time.monotonic() > deadline:
                    raise HalfWriteError(
                        "the producer queue stayed full; half not written"
                    ) from None
                time.sleep(0.005)
            except KafkaException as exc:
                raise HalfWriteError(f"half record rejected: {exc.args[0]}") from None
        if not delivery.done.wait(max(0.0, deadline - time.monotonic())):
            raise HalfWriteError(f"half record not acknowledged within {timeout:g}s")
        if delivery.error is not None:
            raise HalfWriteError(f"half record not stored: {delivery.error}")
        return delivery.partition, delivery.offset

    def close(self, timeout: float = 10.0) -> None:
        self._closed.set()
        self._poller.join(timeout)
        remaining = self.producer.flush(timeout)
        if remaining:
            log.warning("%d half records were still unacknowledged at close", remaining)
