"""The checker service: one replica, running the rounds and the relay side by side.

Replicas share the half partitions through one consumer group (subscribed to
the half topic, every partition paused: membership and fencing are all it is
for). The owner of half partition p also reads op partition p. Its committed
offset on half partition p is the half checkpoint, with the op checkpoint in
the commit metadata, written in the same Kafka transaction as the round's
records (:mod:`outbox_checker.round_writer`). The rounds' work is
:class:`~outbox_checker.rounds.Rounds`; this module is the replica around it and the
relay (:class:`~outbox_checker.relay.Relay`, a thread of the same process): the
schedule, the group served, the probes' answers.
"""

from __future__ import annotations

import gc
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient
from sqlalchemy.exc import SQLAlchemyError
from tenacity import Retrying, retry_if_exception_type, wait_exponential

from outbox.access import connect
from outbox.durations import format_duration
from outbox.errors import (
    ConnectionSecurityError,
    KafkaUnavailableError,
    OutboxError,
)
from outbox_checker import metrics
from outbox_checker.errors import FencedError
from outbox_checker.membership import process_instance_id
from outbox_checker.names import relay_group, relay_transactional_id
from outbox_checker.ownership import HalfOwnership
from outbox_checker.parked import DrainReport, DrainSchedule, DrainTrigger, ParkedDrain
from outbox_checker.relay import Relay, RelaySettings
from outbox_checker.rounds import ProducerFactory, Resolver, RoundReport, Rounds
from outbox_checker.rules import RoundRules
from outbox_checker.settings import CheckerSettings

log = logging.getLogger(__name__)


class Checker:
    """One checker replica. ``run()`` until ``stop()``; ``run_round()`` for one pass."""

    def __init__(
        self,
        settings: CheckerSettings,
        *,
        clock: Callable[[], float] = time.time,
        resolver: Resolver | None = None,
        rules: RoundRules | None = None,
        producer_factory: ProducerFactory = Producer,
        writer_timeout: float = 30.0,
    ) -> None:
        """``clock``: the checker's wall clock (ages, rounds' timing); ``resolver`` answers due
        halves itself (default: from the transaction log with ``resolve_from_db``).
        ``rules``: what the rounds run by, for knobs that are no setting (a chunk's size;
        default :meth:`RoundRules.from_settings`). ``producer_factory`` makes the round
        writer's transactional producer from its configuration (a wrapped or instrumented
        ``Producer``); ``writer_timeout``: each of the writer's Kafka calls waits this long,
        and a chunk stuck past three is abandoned and its producer fenced."""
        self.settings = settings
        self.topics = settings.topics
        self._clock = clock
        resolver = resolver or _database_resolver(settings, clock)
        self._drain = _parked_drain(settings, clock)
        self._drain_schedule = DrainSchedule(settings.drain_interval_seconds)
        self._stopping = threading.Event()
        self.last_round_at: float | None = None
        self.early_round_at: float | None = None
        """When the last round's stop comes due, if before the next interval's round."""
        self.progress_at = clock()
        """When the loop last had no round due, or completed one (the checker's clock)."""
        client = settings.client_config()
        self._admin = wait_for_cluster(client, settings)
        self._static_id = settings.stable_instance_id
        """Its id if it survives restarts: then a static member (:mod:`.membership`)."""
        self._instance = instance = self._static_id or process_instance_id()
        self.ownership = HalfOwnership(settings, self._static_id, clock)
        """The rounds' group member: the half partitions owned, the group's generation."""
        self.assigned = self.ownership.assigned
        self.relay: Relay | None = None
        self.rounds = Rounds(
            settings,
            self.ownership,
            self._admin,
            instance,
            clock,
            serve_group=self.poll_membership,
            stopping=self._stopping,
            drain=self._drain,
            resolver=resolver,
            rules=rules,
            producer_factory=producer_factory,
            writer_timeout=writer_timeout,
        )
        """The rounds' work: the round writer, the checkpoints, the parked sends' drain."""

    # ----------------------------------------------------------- membership

    def is_ready(self) -> bool:
        """Joined the group (or waits for older replicas to leave it, :class:`JoinRefusals`),
        every owned partition has had a round, and rounds still complete."""
        return (
            (self.assigned.is_set() or self.ownership.refusals.refusing())
            and (self.last_round_at is not None or not self.owned_partitions())
            and self.is_healthy()
        )

    def is_healthy(self) -> bool:
        """Rounds complete when due, and the relay is not wedged.

        A loop that is only backing off (Kafka keeps failing a round) is not
        healthy, however busy: its halves wait. A round may take the
        per-partition budget for each owned partition before it counts as late.
        """
        allowed = self.settings.health_stall_seconds + self.settings.max_process_seconds * max(
            1, len(self.owned_partitions())
        )
        rounds_complete = self._clock() - self.progress_at < allowed
        relay_alive = (
            self.relay is None
            or time.monotonic() - self.relay.last_batch_at < self.settings.health_stall_seconds
        )
        return rounds_complete and relay_alive

    def owned_partitions(self) -> list[int]:
        return self.ownership.partitions()

    def poll_membership(self, timeout: float = 0.0) -> None:
        """Serve rebalances (and keep the group session alive, :class:`HalfOwnership`);
        a relay that failed for good ends the replica here, in its loop's thread."""
        if self.relay is not None and self.relay.failure is not None:
            raise self.relay.failure
        self.ownership.poll(timeout)

    # ----------------------------------------------------------- rounds

    def run(self) -> None:
        """Run rounds every check interval until :meth:`stop`; then close.

        A Kafka outage pauses the loop with exponential backoff and it resumes
        where the committed checkpoints are: nothing unwritten was committed.
        """
        retrying = Retrying(
            retry=retry_if_exception_type((KafkaUnavailableError, KafkaException)),
            wait=wait_exponential(multiplier=0.5, max=30),
            stop=lambda _: self._stopping.is_set(),
            sleep=self._back_off,
            before_sleep=lambda state: log.warning(
                "round interrupted (attempt %d), backing off: %s",
                state.attempt_number,
                state.outcome.exception() if state.outcome else "",
            ),
            reraise=True,
        )
        self.start_relay()
        metrics.measure_with(
            self._now_ms,
            lambda: None if self.last_round_at is None else int(self.last_round_at * 1000),
        )
        try:
            while not self._stopping.is_set():
                self.poll_membership(0.5)
                self._drain_when_due()
                due = self._due_round()
                if due is not None and self.owned_partitions():
                    try:
                        retrying(self.run_round, early=due == "early")
                    except (KafkaUnavailableError, KafkaException) as exc:
                        log.info("stopping during an outage: %s", exc)
                        continue
                self.progress_at = self._clock()
        finally:
            self.close()

    def _drain_when_due(self, *, assigned_only: bool = False) -> None:
        """Publish parked sends when :class:`DrainSchedule` says; a failure waits for the next."""
        if self._drain is None:
            return
        trigger = self._drain_schedule.due(
            self._clock(), generation=self.ownership.generation, assigned_only=assigned_only
        )
        if trigger is None:
            return
        if trigger is DrainTrigger.ASSIGNED:  # after an outage, maybe: as a round does
            self.rounds.writer.renew_for_round()
        try:
            self.drain_parked()
        except (KafkaUnavailableError, KafkaException, FencedError, OutboxError) as exc:
            log.warning("parked sends not drained this time: %s", exc)
        except SQLAlchemyError as exc:
            log.warning("parked sends not drained (the transaction log is unreachable): %s", exc)

    def drain_parked(self) -> list[DrainReport]:
        """Publish the parked sends (``park_when_unavailable``) of every owned half partition,
        through the round writer's transaction, fenced as a round's chunk is
        (:mod:`outbox_checker.parked`); between rounds, in the loop's thread."""
        return self.rounds.drain_parked()

    def _due_round(self) -> str | None:
        """``"interval"``, ``"early"`` (:func:`~outbox_checker.rules.due_again_ms`) or None."""
        now, last = self._clock(), self.last_round_at
        if last is None or now - last >= self.settings.check_interval_seconds:
            return "interval"
        early = self.early_round_at
        if early is not None and now >= max(early, last + EARLY_ROUND_GAP_SECONDS):
            return "early"
        return None

    def _back_off(self, seconds: float) -> None:
        """Wait between attempts, serving the group all the while.

        An outage longer than the session costs this replica its membership;
        only a poll lets it hear that (its partitions are lost) and join again.
        Without one it would retry the round with its old member id forever,
        and every offset commit would fail with UNKNOWN_MEMBER_ID.
        """
        deadline = time.monotonic() + seconds
        while not self._stopping.is_set() and (remaining := deadline - time.monotonic()) > 0:
            self.poll_membership(min(0.5, remaining))
            self._drain_when_due(assigned_only=True)  # partitions back: their parked sends

    def start_relay(self) -> Relay | None:
        """Start this replica's relay thread (unless ``relay`` is off); idempotent."""
        if self.relay is None and self.settings.relay:
            settings = self.settings
            self.relay = Relay(
                settings.client_config(),
                self.topics,
                group_id=relay_group(settings.group_id),
                transactional_id=relay_transactional_id(settings.group_id, self._instance),
                settings=RelaySettings.from_settings(settings),
                now_ms=self._now_ms,
                instance_id=self._static_id,
            )
            self.relay.start()
        return self.relay

    def stop(self) -> None:
        """Ask :meth:`run` to finish the round under way and exit."""
        self._stopping.set()
        if self.relay is not None:
            self.relay.stop()

    def close(self) -> None:
        if self.relay is not None:
            self.relay.close()
        if self._drain is not None:
            self._drain.close()
        for closer in (*self.rounds.closers(), self.ownership.consumer.close):
            try:
                closer()
            except (KafkaException, RuntimeError) as exc:
                log.debug("closing: %s", exc)

    def run_round(self, *, early: bool = False) -> RoundReport:
        """One pass over every owned half partition (:meth:`Rounds.run`).

        ``early``: run before the check interval is up, for halves never asked about;
        put-back copies keep the interval's cadence (:attr:`RoundRules.recheck_after_ms`).
        """
        report = self.rounds.run(early=early)
        if report.partitions:  # else no round: the next one stays due
            self.last_round_at = self._clock()
            due = [p.due_again_ms for p in report.partitions if p.due_again_ms is not None]
            self.early_round_at = min(due) / 1000 if due else None
        return report

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)


EARLY_ROUND_GAP_SECONDS = 1.0
"""Least time between the end of a round and an early one: a backlog whose budget ran
out goes on at once, but no partition's stop can make the rounds spin."""

FIRST_UNREACHABLE_REPORT_SECONDS = 5.0
"""How long a cluster may stay silent at start before the checker says so: a broker
started with it (compose) answers well within it, a wrong address never does."""

_TCP_PROBE_SECONDS = 2.0
"""How long one TCP connection of the diagnosis may take: the report waits for it."""


def wait_for_cluster(client: dict[str, Any], settings: CheckerSettings) -> AdminClient:
    """An admin client of the cluster, once it answers; :func:`~outbox.access.connect`'s
    wait, asked for in slices so that a cluster that does not answer is reported.

    Each slice that ends unanswered is one warning naming the bootstrap servers and what
    a connection to each met (:func:`unreachable_because`): the first after 5 s at most,
    then every ``unreachable_report_seconds``; after ``start_timeout_seconds`` the error.
    A wrong address used to leave the checker silent for the whole start timeout (the
    probe's own log is kept quiet: librdkafka would repeat its failure every second).
    A failed login or TLS handshake still ends the wait at once.
    """
    bootstrap = settings.bootstrap_servers
    started = time.monotonic()
    deadline = started + settings.start_timeout_seconds
    report_at = started + min(FIRST_UNREACHABLE_REPORT_SECONDS, settings.unreachable_report_seconds)
    reported = False
    while True:
        wait = max(0.1, min(deadline, report_at) - time.monotonic())
        try:
            admin = connect(client, settings, bootstrap, wait)
        except ConnectionSecurityError:
            raise
        except KafkaUnavailableError:
            because = unreachable_because(bootstrap, settings.security_protocol)
            if time.monotonic() >= deadline:
                raise KafkaUnavailableError(
                    f"cannot reach Kafka at {bootstrap} within"
                    f" {settings.start_timeout_seconds:g}s: {because}"
                ) from None
            log.warning(
                "cannot reach Kafka at %s (bootstrap servers) for %s: %s; still trying,"
                " exiting after %s without an answer (start_timeout_seconds)",
                bootstrap,
                format_duration(round(time.monotonic() - started)),
                because,
                format_duration(settings.start_timeout_seconds),
            )
            reported = True
            report_at = time.monotonic() + settings.unreachable_report_seconds
            continue
        if reported:
            log.info(
                "reached Kafka at %s after %s",
                bootstrap,
                format_duration(round(time.monotonic() - started)),
            )
        return admin


def unreachable_because(bootstrap: str, protocol: str = "PLAINTEXT") -> str:
    """What a TCP connection to each of the bootstrap servers meets, in words: librdkafka
    keeps it to its log, and its metadata request only says "Broker transport failure"."""
    return "; ".join(_tcp_outcome(address, protocol) for address in bootstrap.split(","))


def _tcp_outcome(address: str, protocol: str) -> str:
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        return f"{address}: host name does not resolve ({_reason(exc)})"
    outcomes: dict[str, list[str]] = {}
    for family, kind, proto, _, sockaddr in found:
        ip = str(sockaddr[0])
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.settimeout(_TCP_PROBE_SECONDS)
                sock.connect(sockaddr)
        except TimeoutError:
            reason = f"no answer to a TCP connection within {_TCP_PROBE_SECONDS:g}s"
        except OSError as exc:
            reason = _reason(exc)
        else:
            return (
                f"{address}: {ip} accepts TCP connections, but no Kafka answer came back (is it"
                f" a Kafka listener for security_protocol {protocol}?)"
            )
        outcomes.setdefault(reason, []).append(ip)
    if len(outcomes) == 1:
        ((reason, ips),) = outcomes.items()
        return f"{address}: {reason}" + ("" if ips == [host] else f" ({', '.join(ips)})")
    return f"{address}: " + ", ".join(f"{', '.join(ips)} {r}" for r, ips in outcomes.items())


def _reason(exc: OSError | UnicodeError) -> str:
    text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    return text[:1].lower() + text[1:]


def freeze_startup_heap() -> None:
    """Put every object alive now out of the garbage collector's sight, for good.

    Called once a checker process has started (imports, settings, clients): those objects
    live as long as the process, yet every full collection walked them all again, and a
    walk's round triggers full collections (each chunk's halves outlive the young
    generations): 0.3 s of a 6.4 s walk of 100 000 halves (bench-checker, 2026-11-24).
    """
    gc.collect()
    gc.freeze()


def _parked_drain(settings: CheckerSettings, clock: Callable[[], float]) -> ParkedDrain | None:
    if not settings.resolve_from_db:
        return None
    return ParkedDrain(
        settings.resolve_from_db, table=settings.db_table, schema=settings.db_schema, clock=clock
    )


def _database_resolver(settings: CheckerSettings, clock: Callable[[], float]) -> Resolver | None:
    if not settings.resolve_from_db:
        return None
    from outbox_checker.db_resolver import DatabaseResolver

    return DatabaseResolver(
        settings.resolve_from_db,
        settings.topics,
        table=settings.db_table,
        schema=settings.db_schema,
        grace_seconds=settings.db_grace_seconds,
        clock=clock,
    )
