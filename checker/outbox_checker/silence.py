"""Noticing a consumer that hears nothing when it should.

After a broker froze (SIGSTOP, a stalled VM, a long pause) a librdkafka 2.x
consumer can stay silent for good once the broker is back: polls return
nothing, and neither a re-assign nor a seek revives it; a new client does. A
consumer that is merely idle looks the same from inside, so the one who owns
it asks the cluster, now and then, whether records wait past its position.
The checker's consumers are the ones it watches (the relay's, the rounds' reader).
"""

from __future__ import annotations

import logging
import threading

from confluent_kafka import Consumer, KafkaException, TopicPartition

log = logging.getLogger(__name__)


class SilenceWatch:
    """Says when a consumer has been silent long enough to ask the cluster about it."""

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._since: float | None = None

    def heard(self) -> None:
        """The consumer delivered something: it is not wedged."""
        self._since = None

    def time_to_ask(self, now: float) -> bool:
        """True once every ``seconds`` of unbroken silence."""
        if self._since is None:
            self._since = now
            return False
        if now - self._since < self._seconds:
            return False
        self._since = now
        return True


def partitions_behind(consumer: Consumer, timeout: float) -> list[TopicPartition]:
    """Assigned partitions whose high watermark lies past the consumer's position.

    Raises ``KafkaException`` when the cluster cannot be asked. For a
    ``read_committed`` consumer an open transaction also leaves the watermark
    past the position; replacing the consumer then costs a reconnection only.
    """
    assignment = consumer.assignment()
    if not assignment:
        return []
    behind = []
    for position in consumer.position(assignment):
        if position.offset < 0:
            continue  # nothing fetched yet: no position to be behind from
        _, high = consumer.get_watermark_offsets(position, timeout=timeout, cached=False)
        if high > position.offset:
            behind.append(position)
    return behind


def close_in_background(consumer: Consumer) -> None:
    """Close a replaced consumer off the caller's thread: a wedged one may take its time."""

    def close() -> None:
        try:
            consumer.close()
        except (KafkaException, RuntimeError) as exc:
            log.debug("closing a replaced consumer: %s", exc)

    threading.Thread(target=close, name="outbox-close-consumer", daemon=True).start()
