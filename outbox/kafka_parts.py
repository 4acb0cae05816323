"""A producer's parts on Kafka: what its start connects and checks, and its shutdown closes.

The :class:`~outbox.seams.PartsSource` of a producer that sends to a cluster (the
in-memory producers of :mod:`outbox.testing` have their own): an admin connection
that checks the outbox topics (the half and op topics exist with as many
partitions; the group's check topic is made, and readable), the topic catalog and
size limits of the sends, the acknowledged writer (:mod:`outbox.acked_writer`) and
the check responder (:mod:`outbox.check_responder`) with its executor. A shutdown
closes them in the order it needs: no more requests taken, the answers under way
finished, then the writer flushed.
"""

from __future__ import annotations

from concurrent.futures import Executor, ThreadPoolExecutor

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from outbox.access import connect, raise_if_group_refused
from outbox.acked_writer import AckedWriter
from outbox.admin import TopicSpec, ensure_topics, read_topic_states
from outbox.check_responder import CheckResponder
from outbox.errors import (
    KafkaUnavailableError,
    NotAuthorizedError,
    TopicAdminError,
    TopicMismatchError,
)
from outbox.protocol import TopicNames
from outbox.seams import SendingCore, SendParts
from outbox.send_flow import half_timeout
from outbox.settings import ProducerSettings
from outbox.size_limits import SizeLimits
from outbox.topic_catalog import TopicCatalog

PARKING_LOOKUP_SECONDS = 1.0
"""The least a parking producer waits for a topic's facts (the first send to a topic).

A cluster that answers tells them in milliseconds, so a park deadline below that (a
race a test sets up) still learns them; a frozen one parks such a send after this."""


class KafkaParts:
    """The parts of one producer on the cluster of its settings.

    Check requests are answered on ``check_executor``, or on an executor of the
    producer's own (``check_threads`` threads, shut down with it).
    """

    def __init__(
        self, settings: ProducerSettings, group: str, check_executor: Executor | None = None
    ) -> None:
        self._own_executor = check_executor is None
        self._check_executor = check_executor or ThreadPoolExecutor(
            settings.check_threads, thread_name_prefix=f"outbox-check-{group}"
        )
        self._writer: AckedWriter | None = None
        self.responder: CheckResponder | None = None
        """The check responder, once opened."""

    def open(self, core: SendingCore) -> SendParts:
        """Connect, check the outbox topics, and start answering check requests."""
        settings = core.settings
        timeout = settings.start_timeout_seconds
        client_config = settings.client_config()
        admin = connect(client_config, settings, settings.bootstrap_servers, timeout)
        try:
            half_partitions = _inspect_topics(admin, core.topics, core.group, timeout)
        except NotAuthorizedError as exc:
            raise exc.by(settings.principal) from None
        lookup_timeout = timeout
        if settings.park_when_unavailable:  # a lookup Kafka does not answer: the send parks
            lookup_timeout = min(timeout, max(half_timeout(settings), PARKING_LOOKUP_SECONDS))
        catalog = TopicCatalog(admin, lookup_timeout, settings.principal)
        limits = SizeLimits(catalog, client_config)
        try:
            self._writer = AckedWriter(client_config)
            self.responder = CheckResponder(
                client_config,
                topic=core.topics.check(core.group),
                consumer_group=core.topics.check(core.group),
                producer_group=core.group,
                answer=core.answer_checks,
                executor=self._check_executor,
                capacity=settings.check_threads + settings.check_queue_size,
                tasks=settings.check_threads,
                ttl_ms=settings.check_request_ttl_seconds * 1000,
                now_ms=core.now_ms,
            )
            self.responder.start()
        except KafkaException as exc:
            self.close(timeout)
            raise KafkaUnavailableError(f"could not start the producer: {exc}") from None
        except BaseException:
            self.close(timeout)
            raise
        return SendParts(catalog, limits, self._writer, half_partitions)

    def close(self, timeout: float) -> None:
        """Stop taking check requests, finish the answers under way, deliver what is queued."""
        if self.responder is not None:
            self.responder.stop(timeout)
        if self._own_executor:
            self._check_executor.shutdown(wait=True)
        if self._writer is not None:
            self._writer.close(timeout)


def _inspect_topics(admin: AdminClient, topics: TopicNames, group: str, timeout: float) -> int:
    """The half topic's partitions, once the outbox topics are found fit to send to."""
    half, op = topics.half, topics.op
    states = read_topic_states(admin, [half, op], timeout=timeout)
    missing = [name for name, state in states.items() if not state.exists]
    if missing:
        raise TopicAdminError(
            f"outbox topic(s) {', '.join(missing)} do not exist: run "
            f"`outbox topics create --prefix {topics.prefix} --partitions N` first"
        )
    if states[half].partitions != states[op].partitions:
        raise TopicMismatchError(
            f"{half} has {states[half].partitions} partitions but {op} has "
            f"{states[op].partitions}; they must match"
        )
    half_partitions = states[half].partitions
    check = TopicSpec(topics.check(group), half_partitions)
    ensure_topics(admin, [check], timeout=timeout)
    raise_if_group_refused(admin, check.name, timeout)
    return half_partitions
