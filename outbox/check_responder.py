"""Answering the checker's questions: the Kafka side of RocketMQ's check-back.

The producers of one group consume ``<prefix>.check.<group>`` as one consumer
group, so exactly one instance gets each request. Requests run on a bounded
executor (RocketMQ's ``checkExecutor``: one thread, 2000 queued). When it is
full the request is not dropped: the consumer seeks back to it and pauses until
there is room, and its offset is only stored once it has been handed over.
A request lost to a crash is harmless: the half is still pending, so the
checker asks again.

Requests are taken in batches (what the consumer holds, up to ``_BATCH``, never
more than the executor has room for), each decoded once, and answered by up to
``tasks`` drain tasks (one per check thread): a drain answers a share of the
waiting requests and awaits their ops' acknowledgements together, rather than a
thread waiting for each op in turn.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
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

_BATCH = 500
"""Most requests taken from the consumer at once."""
_SHARE = 100
"""Most requests a drain task answers at once."""
_FULL_PATIENCE = 1.0
"""Seconds a full executor is waited for before the consumer pauses. Pausing drops what
the client fetched ahead, to be fetched again after a back-off, so a short wait for
room (well inside ``max.poll.interval.ms``) costs less."""


class CheckResponder:
    """Consumes check requests and runs ``answer`` for each on the executor."""

    def __init__(
        self,
        client_config: dict[str, Any],
        *,
        topic: str,
        consumer_group: str,
        producer_group: str,
        answer: Callable[[list[CheckRequest]], None],
        executor: Executor,
        capacity: int,
        tasks: int = 1,
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
        self._tasks = max(1, tasks)
        """Executor tasks a batch is split into: its threads, so all of them answer."""
        self._free = capacity
        """Requests the executor can still take (guarded by ``_lock``)."""
        self._waiting: deque[CheckRequest] = deque()
        """Requests handed over, not yet taken by a drain (guarded by ``_lock``)."""
        self._drains = 0
        """Drain tasks submitted and not finished (guarded by ``_lock``)."""
        self._room = max(1, min(_BATCH, capacity // 2))
        """Free places a paused consumer waits for: resuming for one request at a time
        would fetch the requests after it again and again."""
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
        self._room_made = threading.Condition(self._lock)
        self._thread = threading.Thread(target=self._run, name="outbox-check-responder")
        self._thread.daemon = True

    def start(self) -> None:
        self._consumer.subscribe([self._topic])
        self._thread.start()

    def assignment(self) -> list[TopicPartition]:
        """The check partitions this responder's consumer holds now."""
        return self._consumer.assignment()  # type: ignore[no-any-return]

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
        full_since: float | None = None
        while not self._stopping.is_set():
            free = self._wait_for_room()
            if free == 0:
                full_since = full_since or time.monotonic()
                if self._paused or time.monotonic() - full_since > _FULL_PATIENCE:
                    self._hold()
                continue
            full_since = None
            if self._paused:
                self._consumer.resume(self._consumer.assignment())
                self._paused = False
            messages = self._arrived(min(_BATCH, free))
            if messages:
                self._handle(messages)

    def _wait_for_room(self) -> int:
        """Places free in the executor, after a short wait when there are none (a paused
        consumer waits for ``_room`` of them); 0 while it stays full."""
        with self._room_made:
            needed = self._room if self._paused else 1
            if self._free < needed:
                self._room_made.wait(0.05)
            return self._free if self._free >= needed else 0

    def _hold(self) -> None:
        """Executor full: pause the assignment (new partitions too) and serve the group."""
        if not self._paused:
            log.info("check executor full; pausing check requests")
            self._paused = True
        self._consumer.pause(self._consumer.assignment())
        message = self._consumer.poll(0.05)  # keeps group membership alive while paused
        if message is not None:  # from a partition assigned since the pause: not taken
            if message.error() is not None:
                self._report(message.error())
            else:
                self._pause_at([message])

    def _arrived(self, most: int) -> list[KafkaMessage]:
        """Up to ``most`` requests the consumer holds now, else the first to arrive within
        0.1 s; never more than the executor has room for, so none has to be given back.

        ``consume(n, timeout)`` would wait for ``n`` requests or the whole
        timeout, delaying a lone check by it.
        """
        messages = self._consumer.consume(most, timeout=0)
        if messages:
            return messages
        first = self._consumer.poll(0.1)
        if first is None:
            return []
        return [first, *self._consumer.consume(most - 1, timeout=0)] if most > 1 else [first]

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

    def _handle(self, messages: list[KafkaMessage]) -> None:
        """Decode, drop or take each request in order; hand the taken ones over; store offsets.

        Once the executor is full the consumer goes back to the first request
        not taken (on each partition) and pauses: nothing after it is handled now.
        """
        taken: list[CheckRequest] = []
        handled: list[KafkaMessage] = []
        for at, message in enumerate(messages):
            error = message.error()
            if error is not None:
                self._report(error)
                continue
            request = self._request(message)
            if request is not None:
                if not self._take_slot():
                    self._pause_at(messages[at:])
                    break
                taken.append(request)
            handled.append(message)
        self._hand_over(taken)
        for message in handled:
            self._consumer.store_offsets(message)

    def _request(self, message: KafkaMessage) -> CheckRequest | None:
        """The request ``message`` holds; None for one dropped (malformed, or stale)."""
        try:
            request = CheckRequest.read(RawRecord.from_kafka(message))
        except MalformedRecordError as exc:
            log.warning("dropping a malformed check request: %s", exc)
            metrics.CHECKS_DROPPED.labels(self._producer_group, "malformed").inc()
            return None
        age_ms = self._now_ms() - request.requested_ms
        if age_ms > self._ttl_ms:
            log.info(
                "dropping a stale check request transaction_id=%s age_ms=%d (the checker re-asks)",
                request.half.transaction_id,
                age_ms,
            )
            metrics.CHECKS_DROPPED.labels(self._producer_group, "stale").inc()
            return None
        return request

    def _hand_over(self, requests: list[CheckRequest]) -> None:
        """Queue ``requests`` for the drain tasks, starting more (up to ``tasks``) if need be.

        A drain answers a share of what waits, then the next share, until none
        waits: when the threads lag, each share grows, so a thread answers many
        checks per wait for acknowledgements; when they keep up, every thread
        gets one, so a slow listener is still asked in parallel.
        """
        if not requests:
            return
        with self._lock:
            self._waiting.extend(requests)
            starting = min(self._tasks - self._drains, len(self._waiting))
            self._drains += max(0, starting)
        for _ in range(starting):
            future = self._executor.submit(self._drain)
            with self._lock:
                self._in_flight.add(future)
            future.add_done_callback(self._finished)

    def _drain(self) -> None:
        """On the executor: answer shares of the waiting requests until none waits."""
        while True:
            with self._lock:
                if not self._waiting:
                    self._drains -= 1
                    return
                size = min(_SHARE, -(-len(self._waiting) // self._drains))
                share = [self._waiting.popleft() for _ in range(size)]
            try:
                self._answer(share)
            except Exception:
                log.exception("answering a check request failed")
            finally:
                with self._room_made:
                    self._free += len(share)
                    self._room_made.notify()

    def _finished(self, future: Any) -> None:
        with self._lock:
            self._in_flight.discard(future)
        if future.exception() is not None:
            log.error("answering a check request failed", exc_info=future.exception())

    def _pause_at(self, messages: list[KafkaMessage]) -> None:
        """No room for ``messages``: come back to the first of them on each partition once
        there is (the consumer has moved past them all)."""
        self._consumer.pause(self._consumer.assignment())
        seen: set[tuple[str, int]] = set()
        for message in messages:
            where = (message.topic(), message.partition())
            if message.error() is None and where not in seen:
                seen.add(where)
                self._consumer.seek(TopicPartition(*where, message.offset()))
        if not self._paused:
            log.info("check executor full; pausing check requests")
            self._paused = True

    def _take_slot(self) -> bool:
        with self._lock:
            if self._free <= 0:
                return False
            self._free -= 1
            return True
