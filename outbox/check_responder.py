"""Answering the checker's questions: the Kafka side of RocketMQ's check-back.

The producers of one group consume ``<prefix>.check.<group>`` as one consumer
group, so exactly one instance gets each request. Requests run on a bounded
executor (RocketMQ's ``checkExecutor``: one thread, 2000 queued). When it is
full the request is not dropped: the consumer seeks back to it and pauses until
there is room, and its offset is only stored once it has been handed over.
A request lost to a crash is harmless: the half is still pending, so the
checker asks again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor, wait
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka import Message as KafkaMessage

from outbox import metrics
from outbox.access import is_authorization_failure, principal_of
from outbox.errors import NotAuthorizedError
from outbox.protocol import CheckRequest, MalformedRecordError, RawRecord

log = logging.getLogger(__name__)


class CheckResponder:
    """Consumes check requests and runs ``answer`` for each on the executor."""

    def __init__(
        self,
        client_config: dict[str, Any],
        *,
        topic: str,
        consumer_group: str,
        producer_group: str,
        answer: Callable[[CheckRequest], None],
        executor: Executor,
        capacity: int,
        ttl_ms: float,
        now_ms: Callable[[], int],
    ) -> None:
        self._topic = topic
        self._group = consumer_group
        self._client_config = client_config
        self._refused: tuple[str, str] | None = None
        self._producer_group = producer_group
        self._answer = answer
        self._executor = executor
        self._slots = threading.BoundedSemaphore(capacity)
        self._ttl_ms = ttl_ms
        self._now_ms = now_ms
        self._consumer = Consumer(
            {
                # A producer that dies while joining its group holds every member's
                # rebalance for the rebalance timeout (max.poll.interval.ms, 5 min by
                # default), and one that dies after joining keeps its partitions for
                # the session: no check is answered meanwhile. The loop below polls
                # every few milliseconds, so both can be short; kafka_properties win.
                "session.timeout.ms": 10_000,
                "heartbeat.interval.ms": 3_000,
                "max.poll.interval.ms": 30_000,
                **client_config,
                "group.id": consumer_group,
                "enable.auto.commit": True,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
            }
        )
        self._stopping = threading.Event()
        self._paused = False
        self._in_flight: set[Any] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="outbox-check-responder")
        self._thread.daemon = True

    def start(self) -> None:
        self._consumer.subscribe([self._topic])
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Stop taking requests, let those handed over finish, commit, close."""
        self._stopping.set()
        self._thread.join(timeout)
        with self._lock:
            pending = list(self._in_flight)
        wait(pending, timeout)
        try:
            self._consumer.commit(asynchronous=False)
        except KafkaException as exc:
            log.debug("no check offsets to commit at stop: %s", exc)
        self._consumer.close()

    def _run(self) -> None:
        while not self._stopping.is_set():
            if self._paused and not self._try_resume():
                self._consumer.poll(0.05)  # keeps group membership alive while paused
                continue
            message = self._consumer.poll(0.1)
            if message is None:
                continue
            if message.error():
                self._report(message.error())
                continue
            self._handle(message)

    def _report(self, error: KafkaError) -> None:
        """A consumer error as a warning; a refusal by the authoriser as one error naming
        the ACL, logged once: no check-back is answered until it is granted."""
        if not is_authorization_failure(error):
            log.warning("check topic %s: %s", self._topic, error)
            return
        refused = (
            ("READ", f"group {self._group!r}")
            if error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED
            else ("READ", f"topic {self._topic!r}")
        )
        if refused != self._refused:
            self._refused = refused
            log.error(
                "no check-back can be answered: %s",
                NotAuthorizedError(*refused, principal_of(self._client_config)),
            )

    def _handle(self, message: KafkaMessage) -> None:
        try:
            request = CheckRequest.read(RawRecord.from_kafka(message))
        except MalformedRecordError as exc:
            log.warning("dropping a malformed check request: %s", exc)
            metrics.CHECKS_DROPPED.labels(self._producer_group, "malformed").inc()
            self._consumer.store_offsets(message)
            return
        age_ms = self._now_ms() - request.requested_ms
        if age_ms > self._ttl_ms:
            log.info(
                "dropping a stale check request transaction_id=%s age_ms=%d (the checker re-asks)",
                request.half.transaction_id,
                age_ms,
            )
            metrics.CHECKS_DROPPED.labels(self._producer_group, "stale").inc()
            self._consumer.store_offsets(message)
            return
        if not self._slots.acquire(blocking=False):
            self._pause_at(message)
            return
        future = self._executor.submit(self._answer, request)
        with self._lock:
            self._in_flight.add(future)
        future.add_done_callback(self._finished)
        self._consumer.store_offsets(message)

    def _finished(self, future: Any) -> None:
        with self._lock:
            self._in_flight.discard(future)
        self._slots.release()
        if future.exception() is not None:
            log.error("answering a check request failed", exc_info=future.exception())

    def _pause_at(self, message: KafkaMessage) -> None:
        """Executor full: come back to this very request once there is room."""
        position = TopicPartition(message.topic(), message.partition(), message.offset())
        assignment = self._consumer.assignment()
        self._consumer.pause(assignment)
        self._consumer.seek(position)
        self._paused = True
        log.info("check executor full; pausing check requests")

    def _try_resume(self) -> bool:
        if not self._slots.acquire(blocking=False):
            self._consumer.pause(self._consumer.assignment())
            return False
        self._slots.release()
        self._consumer.resume(self._consumer.assignment())
        self._paused = False
        return True
