"""The chaos controller: start everything, inject the seeded faults, settle, judge.

Phases, each shown as it runs:

1. a local Kafka broker (or a cluster, ``--brokers 3``), a local PostgreSQL
   with the outbox migrations, the topics, the checker replicas, the Spark sink
   (continuous) and the producer processes;
2. sending: the producers place orders while the faults of
   :func:`~outbox_devtools.chaos.plan.fault_plan` fire at their share of the run; a
   killed process comes back after its down time, as a supervisor would
   restart it;
3. settling: sending stops, everything is up again, and the checker gets until
   no half is pending;
4. landing: the sink gets until every committed order is in its table;
5. the verdict (:mod:`outbox_devtools.chaos.verdict`), a table, the last line.
"""

from __future__ import annotations

import contextlib
import logging
import math
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import sqlalchemy as sa
from confluent_kafka.admin import AdminClient
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from outbox.admin import TopicSpec, ensure_topics, plan_topics
from outbox.config import kafka_client_config
from outbox.errors import KafkaUnavailableError
from outbox.producer import TransactionProducer
from outbox.protocol import TopicNames
from outbox.sql import create_engine
from outbox.sql.log import DEFAULT_TABLE, transaction_log_table
from outbox_checker.names import relay_group, relay_transactional_id
from outbox_checker.parked import read_parked
from outbox_devtools.chaos.database import ChaosDatabase
from outbox_devtools.chaos.discard_cycle import MUTE_GROUP, DiscardCycle
from outbox_devtools.chaos.network import ChaosNetwork, Cut, unavailable_reason
from outbox_devtools.chaos.plan import Fault, FaultKind, fault_plan
from outbox_devtools.chaos.processes import (
    CLIENT_TIMEOUTS,
    CheckerProcess,
    Pause,
    ProducerProcess,
    SendCounts,
)
from outbox_devtools.chaos.settings import ChaosSettings
from outbox_devtools.chaos.verdict import (
    Interval,
    Verdict,
    judge,
    longest_gap_seconds,
    publication_stalls,
    read_topic_state,
)
from outbox_devtools.chaos.worker import GROUP, ORDERS_TABLE, WorkerConfig
from outbox_devtools.chaos.writability import WritabilityMonitor
from outbox_devtools.kafka import (
    NAMESPACED_PORTS,
    LocalKafka,
    LocalKafkaCluster,
    ensure_kafka_jars,
    replication_properties,
)

log = logging.getLogger(__name__)

PREFIX = "chaos"
REAL_TOPIC = "chaos.orders"
CHECKER_GROUP = f"{PREFIX}.checker"
"""Given to the checker replicas, so the controller can name their relays' transactional ids."""
GRACE_SECONDS = 20.0
"""The SQL listener's grace: a half with no log row is rolled back once this old.
The checker asks every CHECK_INTERVAL for CHECK_MAX rounds, well past it."""
CHECK_INTERVAL_SECONDS = 2.0
TICK_SECONDS = 0.2
BROKER_FAULT_WAIT_SECONDS = 180.0
"""How long a broker fault waits for the cluster to be whole and in sync before it is skipped
(a run whose replicas never recover must end, and say so, rather than wait for ever)."""
NODE_START_TIMEOUT_SECONDS = 240.0
"""How long a node the run killed may take to come back. A node killed mid-write recovers
every log it holds on start, and on a machine the run itself loads (2 cores, every
process of the run, the suite's other worker) a restart took 50 s where an idle start
takes 13 s; the library's 90 s default then ended a whole run on a slow start."""
AWAY_MARGIN_SECONDS = 5.0
"""A send that fails this soon after a Kafka fault ended is counted as failed while Kafka was
away: reports come every half second, and a send started during the fault ends after it."""
CHECK_WAIT_SECONDS = 120.0
"""How long an armed producer may take to receive a check-back before the fault gives up
(recorded as ``no check seen``). A half is only checked once past the transaction timeout
and a checker outage can delay the first round: in a short run whose every checker and
broker went down in its first seconds, the first checks came 55 s in (the restarted
replicas' first round took 40 s). With 2 % of orders answering UNKNOW the checks then
come within seconds. With --resolve-from-db no producer is ever asked."""
DRAIN_WAIT_SECONDS = 180.0
"""How long armed replicas may take to start a parked drain (recorded as ``no drain seen``):
armed as Kafka goes away, they drain once it is back (20-30 s), their group rejoined and the
next drain due."""


@dataclass
class FaultEvent:
    """A fault as it happened: when, what, and when its targets came back."""

    fault: Fault
    at_seconds: float
    target: str
    restart_at: float
    processes: Sequence[ProducerProcess | CheckerProcess] = ()
    """The killed processes, started again when the down time is over."""
    nodes: tuple[LocalKafka, ...] = ()
    """The Kafka nodes stopped, killed or frozen (the broker itself with one node)."""
    frozen: bool = False
    """Paused (SIGSTOP): resumed with SIGCONT when the down time is over, not restarted."""
    steps: Iterator[str] | None = None
    """A rolling restart under way, advanced a step per tick until it is over."""
    outcome: str | None = None
    """Set when the fault could not strike (nothing went down), e.g. ``no check seen``."""
    back_after: float | None = None
    began_wall: float = field(default_factory=time.time)
    ended_wall: float | None = None
    """Epoch seconds of the fault and of its target's return, for the stall time."""
    stall: float | None = None
    """Longest pause in publication on the real topic overlapping the fault."""
    possible_stall: float | None = None
    """Longest of the run's publication stalls (while publication was possible) touching it."""
    writable_stall: float | None = None
    """The same, counted only while Kafka could also take the relay's writes."""
    owned_stall: float | None = None
    """The same, with Kafka writable on the partitions the relay's transactions concern."""
    cut: Cut | None = None
    """A network partition under way: healed, not restarted, when the down time is over."""
    cut_nodes: tuple[int, ...] = ()
    """Kafka nodes cut from the others: a broker fault (one at a time), and down for writes."""


@dataclass
class ArmedCheck:
    """Producers told to pause in their next check-back answer; the first to pause is killed.

    Every producer is armed, not only the fault's target: a check request reaches
    whichever producer owns its check-topic partition, and with 2 % of orders
    answering UNKNOW a short run may send none to one given producer.
    """

    fault: Fault
    producers: list[int]
    deadline: float


@dataclass
class ArmedChunk:
    """A checker replica told to pause inside its next chunk with put-backs, to be killed."""

    fault: Fault
    checker: int
    deadline: float


@dataclass
class ArmedDrain:
    """Checker replicas told to pause inside their next parked drain; the first caught is
    frozen. Every replica is armed: the drain is the work of whichever owns the partition."""

    fault: Fault
    checkers: list[int]
    deadline: float


class Blocker(NamedTuple):
    """Why a broker fault cannot fire yet."""

    reason: str
    patience_runs: bool
    """Whether this wait counts against :data:`BROKER_FAULT_WAIT_SECONDS`. Waiting for
    another of the run's own faults to be over does not: on a loaded machine a rolling
    restart took 180 s, and the broker faults queued behind it were skipped."""


@dataclass
class Cluster:
    """The broker, the checker replicas and the producer processes of one run."""

    kafka: LocalKafka | LocalKafkaCluster
    checkers: list[CheckerProcess]
    producers: list[ProducerProcess]
    events: list[FaultEvent] = field(default_factory=list)
    armed: list[ArmedCheck] = field(default_factory=list)
    armed_chunks: list[ArmedChunk] = field(default_factory=list)
    armed_drains: list[ArmedDrain] = field(default_factory=list)
    cycles: list[tuple[FaultEvent, DiscardCycle]] = field(default_factory=list)
    answering: list[TransactionProducer] = field(default_factory=list)
    """Producers of the discard cycles' group, answering once a cycle is over."""
    producers_answer_checks: bool = True
    """False with --resolve-from-db: the checker reads the transaction log instead."""
    database_url: str = ""
    network: ChaosNetwork | None = None
    """The hosts in namespaces, with --network-partitions (see :mod:`.network`)."""
    started: float = field(default_factory=time.monotonic)
    started_wall: float = field(default_factory=time.time)
    """Epoch seconds of :attr:`started`, to place the run's stalls (epoch) on its clock."""

    @property
    def sent(self) -> int:
        return sum(p.sent for p in self.producers)

    @property
    def counts(self) -> SendCounts:
        """Every producer's sends, failures and parked sends, as last reported."""
        return sum((p.counts for p in self.producers), SendCounts())

    def failed_while_kafka_away(self) -> int:
        """Sends that failed while a Kafka fault was under way (a node down, frozen or cut, a
        producer cut) or within :data:`AWAY_MARGIN_SECONDS` of its end."""
        windows = [
            (event.began_wall, (event.ended_wall or math.inf) + AWAY_MARGIN_SECONDS)
            for event in self.events
            if event.outcome is None and (event.fault.kind.hits_a_broker or event.fault.kind.cuts)
        ]
        return sum(
            failed
            for producer in self.producers
            for reported, failed in producer.failures
            if any(start <= reported <= end for start, end in windows)
        )

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @property
    def down(self) -> bool:
        """A fault's target is not back yet: sending goes on, so every fault ends under load."""
        return any(e.back_after is None and e.outcome is None for e in self.events)

    def node(self, node_id: int) -> LocalKafka:
        """The single broker, or node ``node_id`` of the cluster."""
        if isinstance(self.kafka, LocalKafka):
            return self.kafka
        return self.kafka.node(node_id)

    def waits_for(self, fault: Fault, queued: Sequence[Fault] = ()) -> Blocker | None:
        """What ``fault`` waits for before it may fire (None: nothing); ``queued``: the
        faults not fired yet.

        In a cluster, a broker fault waits until the last one is over and all are in
        sync. Three nodes tolerate one down: a second fault on top would stop every
        acks=all write (min.insync.replicas=2) and, with two controllers gone, the
        quorum, a different experiment. One broker has no such choice to make.
        A drain freeze waits until the Kafka outage drawn with it has struck (or was
        skipped): armed before, it would catch a drain of rows another fault parked.
        """
        if fault.kind is FaultKind.FREEZE_DRAINING_CHECKER:
            for outage in queued:
                if outage.kind is FaultKind.KAFKA_AWAY and outage.at_share <= fault.at_share:
                    return Blocker(f"{outage.describe()} has not struck", patience_runs=False)
            return None
        if isinstance(self.kafka, LocalKafka) or not (
            fault.kind.hits_a_broker or fault.kind.cuts_nodes
        ):
            return None
        for event in self.events:
            if event.back_after is None and (event.nodes or event.steps or event.cut_nodes):
                reason = f"{event.target} is not back from {event.fault.describe()}"
                return Blocker(reason, patience_runs=False)
        if not self.kafka.is_running():
            return Blocker("a node is not running", patience_runs=True)
        if behind := self.kafka.under_replicated():
            shown = ", ".join(behind[:4]) + (f" and {len(behind) - 4} more" if behind[4:] else "")
            return Blocker(f"not in sync: {shown}", patience_runs=True)
        return None


def _step(console: Console, text: str) -> None:
    console.print(f"[bold cyan]==>[/] {text}", highlight=False)


SLOW_COMMIT_SECONDS = GRACE_SECONDS + 5.0
"""A slow order's COMMIT blocks past the grace, so a check-back past it races the COMMIT."""


def _committed_in_database(url: str) -> set[str]:
    table = transaction_log_table()
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                sa.select(table.c.transaction_id).where(
                    table.c.producer_group.in_((GROUP, MUTE_GROUP)),
                    ~table.c.rolled_back,  # a ROLLBACK check answer's row is no commit
                )
            )
            return {row.transaction_id for row in rows}
    finally:
        engine.dispose()


def _checker_env(bootstrap: str, database_url: str | None) -> dict[str, str]:
    env = {
        "OUTBOX_BOOTSTRAP_SERVERS": bootstrap,
        "OUTBOX_TOPIC_PREFIX": PREFIX,
        "OUTBOX_CHECKER_GROUP": CHECKER_GROUP,
        "OUTBOX_CHECK_INTERVAL_SECONDS": str(CHECK_INTERVAL_SECONDS),
        "OUTBOX_KAFKA_TRANSACTION_TIMEOUT_MS": "10000",
        "OUTBOX_HTTP_ADDRESS": "",
    }
    if database_url is not None:
        env["OUTBOX_RESOLVE_FROM_DB"] = database_url
        env["OUTBOX_DB_GRACE_SECONDS"] = str(GRACE_SECONDS)
    return env


# ----------------------------------------------------------------- faults


def fire(cluster: Cluster, fault: Fault, console: Console) -> None:
    """Strike (or arm) ``fault`` now: the controller's one entry for every kind."""
    if fault.kind.cuts:
        _fire_cut(cluster, fault, console)
        return
    if fault.kind.hits_a_broker:
        _fire_at_kafka(cluster, fault, console)
        return
    if fault.kind is FaultKind.KILL_ALL_CHECKERS:
        if not any(checker.alive for checker in cluster.checkers):
            console.print(f"    [yellow]skipped[/] {fault.describe()}: no checker is up")
            return
        for checker in cluster.checkers:
            if checker.alive:
                checker.kill()
        _record(cluster, fault, "all checkers", cluster.checkers, console)
        return
    if fault.kind is FaultKind.DISCARD_RESUME_CYCLE:
        _start_cycle(cluster, fault, console)
        return
    if fault.kind is FaultKind.KILL_CHECKER_MID_CHUNK:
        # Armed whether it runs now or not: a replica down now is armed when it is back.
        cluster.checkers[fault.target].arm(Pause.CHUNK)
        deadline = time.monotonic() + CHECK_WAIT_SECONDS
        cluster.armed_chunks.append(ArmedChunk(fault, fault.target, deadline))
        console.print(
            f"    [red]{cluster.elapsed():6.1f}s[/] armed checker {fault.target}: kill -9 it "
            f"inside its next chunk with put-backs (waiting up to {CHECK_WAIT_SECONDS:.0f}s)",
            highlight=False,
        )
        return
    if fault.kind is FaultKind.FREEZE_DRAINING_CHECKER:
        # Every replica, up or not: one down now (another fault) is armed when it is back, and
        # the drain is the work of whichever owns the partition by then.
        armed = list(range(len(cluster.checkers)))
        for n in armed:
            cluster.checkers[n].arm(Pause.DRAIN)
        deadline = time.monotonic() + DRAIN_WAIT_SECONDS
        cluster.armed_drains.append(ArmedDrain(fault, armed, deadline))
        console.print(
            f"    [red]{cluster.elapsed():6.1f}s[/] armed checkers {armed}: freeze the first "
            f"caught inside a parked drain (waiting up to {DRAIN_WAIT_SECONDS:.0f}s)",
            highlight=False,
        )
        return
    role, slots = (
        ("checker", cluster.checkers)
        if fault.kind in (FaultKind.KILL_CHECKER, FaultKind.FREEZE_CHECKER)
        else ("producer", cluster.producers)
    )
    target = _first_alive(slots, fault.target)
    if target is None:
        console.print(f"    [yellow]skipped[/] {fault.describe()}: no {role} is up")
        return
    if fault.kind is FaultKind.KILL_ANSWERING_PRODUCER:
        if not cluster.producers_answer_checks:
            _record_miss(
                cluster, fault, target, "no check asked (answered from the database)", console
            )
            return
        armed = [n for n, producer in enumerate(cluster.producers) if producer.alive]
        for n in armed:
            cluster.producers[n].arm_check()
        cluster.armed.append(ArmedCheck(fault, armed, time.monotonic() + CHECK_WAIT_SECONDS))
        console.print(
            f"    [red]{cluster.elapsed():6.1f}s[/] armed producers {armed}: kill -9 the first "
            f"that answers a check (waiting up to {CHECK_WAIT_SECONDS:.0f}s)",
            highlight=False,
        )
        return
    if fault.kind is FaultKind.FREEZE_CHECKER:
        cluster.checkers[target].freeze()
        _record(cluster, fault, f"{role} {target}", [slots[target]], console, frozen=True)
        return
    slots[target].kill()
    _record(cluster, fault, f"{role} {target}", [slots[target]], console)


def _fire_at_kafka(cluster: Cluster, fault: Fault, console: Console) -> None:
    """Stop, kill, freeze or restart a Kafka node; in a cluster the fault names which."""
    kafka = cluster.kafka
    if fault.kind is FaultKind.ROLLING_RESTART:
        assert isinstance(kafka, LocalKafkaCluster)
        event = FaultEvent(
            fault, cluster.elapsed(), "every node", math.inf, steps=kafka.rolling_restart_steps()
        )
        cluster.events.append(event)
        console.print(
            f"    [red]{event.at_seconds:6.1f}s[/] rolling restart of every node at "
            f"{cluster.sent} transactions",
            highlight=False,
        )
        return
    if fault.kind is FaultKind.KILL_HALF_LEADER:
        assert isinstance(kafka, LocalKafkaCluster)
        half = TopicNames(PREFIX).half
        node = kafka.leader_of(half, fault.target)
        name = f"node {node.node_id} (leader of {half}[{fault.target}])"
    elif fault.kind is FaultKind.KAFKA_AWAY:
        nodes = tuple(cluster.node(node_id) for node_id in fault.nodes(_node_count(kafka)))
        for node in nodes:
            node.kill()
        name = (
            "broker"
            if isinstance(kafka, LocalKafka)
            else f"nodes {', '.join(str(node.node_id) for node in nodes)} (a majority)"
        )
        _record(cluster, fault, name, [], console, nodes=nodes)
        return
    elif fault.kind is FaultKind.KILL_RELAY_COORDINATOR:
        assert isinstance(kafka, LocalKafkaCluster)
        checker = cluster.checkers[fault.target]
        transactional_id = relay_transactional_id(CHECKER_GROUP, checker.instance_id)
        node = kafka.transaction_coordinator_of(transactional_id)
        name = f"node {node.node_id} (coordinator of {transactional_id})"
    else:
        node = cluster.node(fault.target)
        name = "broker" if isinstance(kafka, LocalKafka) else f"node {node.node_id}"
    if not node.is_running():  # on one broker another fault has it down (a long Kafka away)
        _record_miss(cluster, fault, name, "the broker is already down", console)
        return
    if fault.kind is FaultKind.FREEZE_BROKER:
        node.freeze()
    elif fault.kind is FaultKind.STOP_BROKER:
        node.stop()
    else:
        node.kill()
    _record(cluster, fault, name, [], console, nodes=(node,), frozen=fault.kind.freezes)


def _fire_cut(cluster: Cluster, fault: Fault, console: Console) -> None:
    """Cut a host's links; its processes keep running on both sides until the cut heals.

    A checker or a producer is cut from every broker (the machine, the database and
    the other replicas still reach it); a node from the other nodes only, so clients
    still reach the minority node, which is what makes it dangerous.
    """
    network = cluster.network
    assert network is not None, "the plan has cuts only with --network-partitions"
    kafka = cluster.kafka
    nodes = kafka.nodes if isinstance(kafka, LocalKafkaCluster) else [kafka]
    brokers = [f"b{node.node_id}" for node in nodes]
    if fault.kind is FaultKind.CUT_CHECKER:
        cut = network.cut(f"c{fault.target}", brokers)
        checker = cluster.checkers[fault.target]
        # Counted as a checker down: with every replica cut or down nothing can publish.
        name, processes, detail = f"checker {fault.target}", [checker], " from every broker"
        _record(cluster, fault, name, processes, console, cut=cut, detail=detail)
        return
    if fault.kind is FaultKind.CUT_PRODUCER:
        cut = network.cut(f"p{fault.target}", brokers)
        name = f"producer {fault.target}"
        _record(cluster, fault, name, [], console, cut=cut, detail=" from every broker")
        return
    assert isinstance(kafka, LocalKafkaCluster)
    if fault.kind is FaultKind.CUT_HALF_LEADER:
        half = TopicNames(PREFIX).half
        node = kafka.leader_of(half, fault.target)
        name = f"node {node.node_id} (leader of {half}[{fault.target}])"
        detail = " from its followers"
    else:
        node = kafka.node(fault.target)
        name, detail = f"node {node.node_id}", " from the other nodes"
    cut = network.cut(f"b{node.node_id}", brokers)
    _record(cluster, fault, name, [], console, cut=cut, cut_nodes=(node.node_id,), detail=detail)


def _strike_armed(cluster: Cluster, console: Console) -> None:
    """Kill the first armed producer caught answering a check, and an armed checker caught
    inside a chunk; give up past the wait."""
    for armed in list(cluster.armed):
        caught = next(
            (
                n
                for n in armed.producers
                if cluster.producers[n].answering.is_set() and cluster.producers[n].alive
            ),
            None,
        )
        if caught is None and time.monotonic() < armed.deadline:
            continue
        for n in armed.producers:
            cluster.producers[n].disarm_check()  # the next incarnations answer normally
        if caught is not None:
            cluster.producers[caught].kill()
            _record(
                cluster,
                armed.fault,
                f"producer {caught}",
                [cluster.producers[caught]],
                console,
                detail=" while it answered a check",
            )
        else:
            _record_miss(cluster, armed.fault, armed.fault.target, "no check seen", console)
        cluster.armed.remove(armed)
    for chunk in list(cluster.armed_chunks):
        checker = cluster.checkers[chunk.checker]
        caught = checker.paused_at(Pause.CHUNK)
        if not caught and time.monotonic() < chunk.deadline:
            continue
        checker.disarm(Pause.CHUNK)
        if caught:
            checker.kill()
            _record(
                cluster,
                chunk.fault,
                f"checker {chunk.checker}",
                [checker],
                console,
                detail=" inside a chunk's transaction",
            )
        else:
            _record_miss(cluster, chunk.fault, chunk.checker, "no chunk seen", console)
        cluster.armed_chunks.remove(chunk)
    for drain in list(cluster.armed_drains):
        checkers = [cluster.checkers[n] for n in drain.checkers]
        caught = next((c for c in checkers if c.paused_at(Pause.DRAIN)), None)
        if caught is None and time.monotonic() < drain.deadline:
            continue
        for checker in checkers:
            checker.disarm(Pause.DRAIN)
        if caught is not None:
            caught.freeze()
            name = f"checker {caught.index}"
            detail = " inside a parked drain's transaction"
            _record(cluster, drain.fault, name, [caught], console, frozen=True, detail=detail)
        else:
            _record_miss(cluster, drain.fault, "checkers", "no drain seen", console)
        cluster.armed_drains.remove(drain)


def _start_cycle(cluster: Cluster, fault: Fault, console: Console) -> None:
    """Send a discard cycle's orders; the loop steps it (:func:`_step_cycles`) until done."""
    name = f"group {MUTE_GROUP}"
    if not cluster.producers_answer_checks:
        _record_miss(
            cluster, fault, name, "nothing discarded (answered from the database)", console
        )
        return
    bootstrap = cluster.kafka.bootstrap_servers
    cycle = DiscardCycle(
        len(cluster.cycles),
        bootstrap,
        PREFIX,
        REAL_TOPIC,
        cluster.database_url,
        GRACE_SECONDS,
        CLIENT_TIMEOUTS,
        answering=cluster.answering,
    )
    event = FaultEvent(fault, cluster.elapsed(), name, math.inf, outcome="under way")
    cluster.events.append(event)
    cycle.start()
    cluster.cycles.append((event, cycle))


def _step_cycles(cluster: Cluster, console: Console) -> None:
    """Print what the discard cycles did; a cycle over gives its fault row its outcome."""
    for event, cycle in cluster.cycles:
        while not cycle.news.empty():
            said = cycle.news.get()
            console.print(f"    [red]{cluster.elapsed():6.1f}s[/] {said}", highlight=False)
        if cycle.done:
            event.outcome = cycle.describe()


def _record_miss(
    cluster: Cluster, fault: Fault, target: int | str, outcome: str, console: Console
) -> None:
    """Log a fault that found nothing to strike: the run goes on, the table says why."""
    role = "checker" if fault.kind is FaultKind.KILL_CHECKER_MID_CHUNK else "producer"
    name = target if isinstance(target, str) else f"{role} {target}"
    event = FaultEvent(fault, cluster.elapsed(), name, time.monotonic(), outcome=outcome)
    cluster.events.append(event)
    console.print(
        f"    [yellow]{event.at_seconds:6.1f}s[/] {fault.kind} {name}: {outcome}, nothing killed",
        highlight=False,
    )


def _record(
    cluster: Cluster,
    fault: Fault,
    name: str,
    processes: Sequence[ProducerProcess | CheckerProcess],
    console: Console,
    *,
    nodes: tuple[LocalKafka, ...] = (),
    frozen: bool = False,
    detail: str = "",
    cut: Cut | None = None,
    cut_nodes: tuple[int, ...] = (),
) -> None:
    """Log a fault that struck; its targets come back (or its cut heals) after its down time."""
    restart_at = time.monotonic() + fault.down_seconds
    event = FaultEvent(fault, cluster.elapsed(), name, restart_at, processes, nodes, frozen)
    event.cut, event.cut_nodes = cut, cut_nodes
    cluster.events.append(event)
    console.print(
        f"    [red]{event.at_seconds:6.1f}s[/] {fault.kind.verb} {name}{detail} at "
        f"{cluster.sent} transactions, back in {fault.down_seconds:.1f}s",
        highlight=False,
    )


def _first_alive(processes: list[Any], preferred: int) -> int | None:
    """``preferred`` if it is up, else the next one that is (a down target cannot die again)."""
    for step in range(len(processes)):
        index = (preferred + step) % len(processes)
        if processes[index].alive:
            return index
    return None


def _restart_due(cluster: Cluster, console: Console, *, all_now: bool = False) -> None:
    """Bring back every target whose down time is over (or all of them)."""
    now = time.monotonic()
    for event in cluster.events:
        if event.back_after is not None or event.outcome is not None:
            continue
        if event.steps is not None:
            if not _advance_rolling_restart(event, console, to_the_end=all_now):
                continue
        elif now < event.restart_at and not all_now:
            continue
        elif event.cut is not None:  # a cut kills nothing: a process another fault killed
            assert cluster.network is not None  # meanwhile comes back with that fault
            cluster.network.heal(event.cut)
        elif event.frozen:
            for node in event.nodes:
                node.thaw()
            for process in event.processes:
                process.thaw()
        else:
            for node in event.nodes:
                node.start()
            for process in event.processes:
                if not process.alive:
                    process.start()
        event.ended_wall = time.time()
        event.back_after = event.ended_wall - event.began_wall
        back = "healed" if event.cut is not None else "back"
        console.print(
            f"    [green]{cluster.elapsed():6.1f}s[/] {event.target} {back} "
            f"({event.back_after:.1f}s after the fault)",
            highlight=False,
        )


def _advance_rolling_restart(event: FaultEvent, console: Console, *, to_the_end: bool) -> bool:
    """One step of a rolling restart (every step when ``to_the_end``); True once it is over."""
    assert event.steps is not None
    for line in event.steps:
        if line:
            console.print(f"    [yellow]{event.fault.kind}[/]: {line}", highlight=False)
        if not to_the_end:
            return False
    return True


# ----------------------------------------------------------------- phases


def _send_with_faults(
    cluster: Cluster,
    settings: ChaosSettings,
    faults: list[Fault],
    console: Console,
    on_tick: Callable[[], None],
) -> None:
    queue = list(faults)
    stopped = False
    waiting: dict[Fault, float] = {}  # since when each due fault waits for the cluster alone
    columns = (
        TextColumn("    transactions"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("sent", total=settings.transactions)
        while (
            cluster.sent < settings.transactions
            or queue
            or cluster.armed
            or cluster.armed_chunks
            or cluster.armed_drains
            or cluster.down
            or not all(cycle.done for _, cycle in cluster.cycles)
        ):
            for fault in [f for f in queue if cluster.sent >= f.at_share * settings.transactions]:
                blocker = cluster.waits_for(fault, queue)  # a broker fault holds up no other
                now = time.monotonic()
                if blocker is None:
                    queue.remove(fault)
                    fire(cluster, fault, console)
                elif not blocker.patience_runs:
                    waiting[fault] = now
                elif now - waiting.setdefault(fault, now) > BROKER_FAULT_WAIT_SECONDS:
                    queue.remove(fault)
                    console.print(
                        f"    [yellow]skipped[/] {fault.describe()}: the cluster was not whole and"
                        f" in sync for {BROKER_FAULT_WAIT_SECONDS:.0f}s after the run's last fault"
                        f" (last: {blocker.reason})",
                        highlight=False,
                    )
            _strike_armed(cluster, console)
            _step_cycles(cluster, console)
            _restart_due(cluster, console)
            armed = cluster.armed or cluster.armed_chunks or cluster.armed_drains
            only_cycles_left = not (queue or armed or cluster.down)
            if cluster.sent >= settings.transactions and only_cycles_left and not stopped:
                for producer in cluster.producers:  # a discard cycle needs no load, only time
                    producer.stop_sending()
                stopped = True
            on_tick()
            progress.update(task, completed=min(cluster.sent, settings.transactions))
            time.sleep(TICK_SECONDS)
        progress.update(task, completed=settings.transactions)
    _step_cycles(cluster, console)  # what a cycle said as it ended
    _restart_due(cluster, console, all_now=True)
    for producer in cluster.producers:
        producer.stop_sending()


def _settle(
    cluster: Cluster, settings: ChaosSettings, console: Console, on_tick: Callable[[], None]
) -> None:
    """Read the topics until no half is pending and no send is parked in the transaction
    log (or the settle time is over)."""
    deadline = time.monotonic() + settings.settle_seconds
    with console.status("    settling") as status:
        while time.monotonic() < deadline:
            on_tick()
            parked = _parked_rows(cluster.database_url) if settings.park_when_unavailable else 0
            try:
                state = read_topic_state(
                    cluster.kafka.bootstrap_servers, TopicNames(PREFIX), (REAL_TOPIC,)
                )
            except KafkaUnavailableError as exc:
                log.warning("reading the topics: %s", exc)
            else:
                status.update(
                    f"    settling: {len(state.transactions)} transactions, "
                    f"{len(state.pending)} pending, {len(state.discarded)} discarded, "
                    f"{parked} parked"
                )
                if not state.pending and not parked:
                    return
            time.sleep(3)


def _parked_rows(url: str) -> int:
    """Sends parked in the transaction log and not yet published by a checker replica."""
    return read_parked(url, table=DEFAULT_TABLE, schema=None, now=time.time()).rows


class Sink:
    """The Spark sink in continuous mode, restarted from its checkpoint if its query fails."""

    def __init__(self, bootstrap: str, work: Path, table_format: str = "parquet") -> None:
        from spark_sink.settings import SinkSettings

        self.settings = SinkSettings(
            format=table_format,
            bootstrap_servers=bootstrap,
            topics=(REAL_TOPIC,),
            topic_prefix=PREFIX,
            output=str(work / "table"),
            checkpoint=str(work / "checkpoint"),
            trigger=2.0,
            master="local[2]",
            shuffle_partitions=2,
            kafka_options={"session.timeout.ms": "10000"},
        )
        self.restarts = 0
        self.failures: list[str] = []
        self.spark: Any = None
        self.run: Any = None

    def start(self) -> None:
        from spark_sink.job import new_session, start_sink

        if self.spark is None:
            self.spark = new_session(self.settings)
        self.run = start_sink(self.settings, self.spark)

    def check(self) -> None:
        """Report progress; a failed query is logged and started again, as a supervisor would."""
        from spark_sink.errors import SinkError

        try:
            self.run.wait(timeout=0)
        except SinkError as exc:
            self.failures.append(str(exc).splitlines()[0])
            log.warning("sink query failed, restarting it: %s", exc)
            self.restarts += 1
            self.start()

    def rows(self) -> Counter[str]:
        """The transaction ids in the table; none before its first batch with rows.

        A Parquet sink's first batch may commit no file (the query started while
        Kafka was away): Spark then cannot infer the table's schema and says so."""
        from pyspark.errors import AnalysisException

        path = self.settings.output
        if not Path(path).exists():
            return Counter()
        try:
            frame = self.spark.read.format(self.settings.format).load(path)
        except AnalysisException as exc:
            if exc.getCondition() == "UNABLE_TO_INFER_SCHEMA":
                return Counter()
            raise
        return Counter(row.transaction_id for row in frame.select("transaction_id").collect())

    def wait_for(self, committed: set[str], timeout: float, console: Console) -> Counter[str]:
        deadline = time.monotonic() + timeout
        rows: Counter[str] = Counter()
        with console.status("    landing") as status:
            while time.monotonic() < deadline:
                self.check()
                rows = self.rows()
                missing = len(committed - set(rows))
                status.update(f"    landing: {len(rows)} rows in the table, {missing} to come")
                if not missing:
                    break
                time.sleep(2)
        return rows

    def stop(self) -> None:
        if self.run is not None:
            self.run.stop()
        if self.spark is not None:
            self.spark.stop()


def run(console: Console, settings: ChaosSettings) -> int:
    started = time.monotonic()
    if settings.network_partitions and (reason := unavailable_reason()) is not None:
        line = f"chaos: refused: {reason}; run without --network-partitions"
        console.print(line, markup=False, highlight=False, soft_wrap=True)
        return 2
    cuts = settings.network_partitions
    faults = fault_plan(
        settings.seed,
        producers=settings.producers,
        checkers=settings.checkers,
        producer_kills=settings.producer_kills,
        checker_kills=settings.checker_kills,
        broker_restarts=settings.broker_restarts,
        answering_producer_kills=settings.answering_producer_kills,
        checker_outages=settings.checker_outages,
        broker_freezes=settings.broker_freezes,
        checker_freezes=settings.checker_freezes,
        brokers=settings.brokers,
        partitions=settings.partitions,
        rolling_restarts=settings.rolling_restarts,
        half_leader_kills=settings.half_leader_kills,
        coordinator_kills=settings.coordinator_kills,
        mid_chunk_kills=settings.mid_chunk_kills,
        discard_cycles=settings.discard_cycles,
        checker_cuts=settings.checker_cuts if cuts else 0,
        producer_cuts=settings.producer_cuts if cuts else 0,
        node_cuts=settings.node_cuts if cuts else 0,
        half_leader_cuts=settings.half_leader_cuts if cuts else 0,
        kafka_outages=settings.kafka_outages if settings.park_when_unavailable else 0,
        drain_freezes=settings.drain_freezes if settings.park_when_unavailable else 0,
    )
    _step(console, f"seed {settings.seed}: {len(faults)} faults planned")
    for fault in faults:
        console.print(
            f"    at {fault.at_share:6.1%} of {settings.transactions}: {fault.describe()}",
            highlight=False,
        )
    _step(console, "resolving the Kafka and Spark connector jars (cached after the first run)")
    ensure_kafka_jars()
    from spark_sink.jars import ensure_delta_jars, ensure_spark_kafka_jars

    ensure_spark_kafka_jars()
    if settings.sink_format == "delta":
        ensure_delta_jars()
    work = Path(settings.work_dir or tempfile.mkdtemp(prefix="outbox-chaos-"))
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    console.print(f"    work dir {work} (logs in {logs})", highlight=False)
    network = ChaosNetwork(_hosts(settings)) if settings.network_partitions else None
    with (
        contextlib.closing(network.create()) if network else contextlib.nullcontext(),
        _library_logs_to(logs / "controller.log"),
        ChaosDatabase(settings.database) as database,
        _kafka_runtime(settings, work, network) as kafka,
    ):
        bootstrap = kafka.bootstrap_servers
        if network is not None:
            console.print(
                f"    network {network.subnet}.0/24: hosts {', '.join(network.hosts)} in"
                f" namespaces {network.namespace('*')}",
                highlight=False,
            )
        console.print(
            f"    Kafka {bootstrap} (started in {kafka.last_start_seconds:.1f}s); "
            f"{database.label} {database.url}",
            highlight=False,
        )
        database.prepare(SLOW_COMMIT_SECONDS)
        names = TopicNames(PREFIX)
        resolve_url = database.url if settings.resolve_from_db else None
        copies = min(3, settings.brokers)
        real_config = {"min.insync.replicas": "2"} if copies > 1 else {}
        ensure_topics(
            AdminClient(kafka_client_config(bootstrap)),
            [
                *plan_topics(names, settings.partitions, copies, (GROUP, MUTE_GROUP)),
                TopicSpec(REAL_TOPIC, settings.partitions, copies, real_config),
            ],
        )
        # Hosts in namespaces reach the database through its socket, never across a cut.
        hosted_url = database.socket_url() if network is not None else database.url
        if resolve_url is not None:
            resolve_url = hosted_url

        def launcher(host: str) -> list[str]:
            return network.launcher(host) if network is not None else []

        cluster = Cluster(
            kafka,
            [
                CheckerProcess(i, _checker_env(bootstrap, resolve_url), logs, launcher(f"c{i}"))
                for i in range(settings.checkers)
            ],
            [
                ProducerProcess(
                    _worker_config(settings, bootstrap, hosted_url, i, database.blocks_commits),
                    logs,
                    launcher(f"p{i}"),
                )
                for i in range(settings.producers)
            ],
            producers_answer_checks=not settings.resolve_from_db,
            database_url=database.url,
            network=network,
        )
        sink = Sink(bootstrap, work, settings.sink_format)
        try:
            verdict = _run_phases(console, settings, cluster, sink, faults, database.url)
        finally:
            for producer in cluster.producers:
                producer.finish(timeout=30)
            for _, cycle in cluster.cycles:
                cycle.stop()
            for answering in cluster.answering:
                answering.shutdown()
            for checker in cluster.checkers:
                checker.stop(timeout=30)
            sink.stop()
        if verdict.failures:
            database.keep(console, work / "database.sql")
    _report(console, verdict, cluster, sink, time.monotonic() - started)
    if not verdict.failures and not settings.work_dir:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if verdict.failures else 0


def _node_count(kafka: LocalKafka | LocalKafkaCluster) -> int:
    return 1 if isinstance(kafka, LocalKafka) else len(kafka.nodes)


def _hosts(settings: ChaosSettings) -> list[str]:
    """The chaos network's hosts: each broker, checker replica and producer on its own."""
    return [
        *(f"b{node}" for node in range(1, settings.brokers + 1)),
        *(f"c{index}" for index in range(settings.checkers)),
        *(f"p{index}" for index in range(settings.producers)),
    ]


def _kafka_runtime(
    settings: ChaosSettings, work: Path, network: ChaosNetwork | None
) -> LocalKafka | LocalKafkaCluster:
    """One broker or a cluster; with a network, each node on its own host (namespace)."""
    timeout = NODE_START_TIMEOUT_SECONDS
    if network is None:
        if settings.brokers == 1:
            return LocalKafka(work / "kafka", start_timeout=timeout)
        return LocalKafkaCluster(work / "kafka", nodes=settings.brokers, start_timeout=timeout)
    hosts = [f"b{node}" for node in range(1, settings.brokers + 1)]
    if settings.brokers == 1:
        port, controller_port = NAMESPACED_PORTS
        return LocalKafka(
            work / "kafka",
            host=network.address("b1"),
            port=port,
            controller_port=controller_port,
            launcher=network.launcher("b1"),
            start_timeout=timeout,
        )
    return LocalKafkaCluster(
        work / "kafka",
        nodes=settings.brokers,
        hosts=[network.address(host) for host in hosts],
        launchers=[network.launcher(host) for host in hosts],
        start_timeout=timeout,
    )


@contextmanager
def _library_logs_to(path: Path) -> Iterator[None]:
    """The outbox's own clients in this process (the discard cycles' producers) log to a file,
    as the producer and checker processes do, not over the progress display."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    loggers = [logging.getLogger(name) for name in ("outbox", "outbox_checker")]
    for logger in loggers:
        logger.addHandler(handler)
        logger.propagate = False
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
            logger.propagate = True
        handler.close()


def _worker_config(
    settings: ChaosSettings, bootstrap: str, url: str, index: int, blocks_commits: bool
) -> WorkerConfig:
    """A producer process's orders; no slow commit where the database cannot block one."""
    return WorkerConfig(
        bootstrap_servers=bootstrap,
        topic_prefix=PREFIX,
        real_topic=REAL_TOPIC,
        database_url=url,
        worker=index,
        incarnation=0,
        threads=settings.threads,
        seed=settings.seed,
        rollback_share=settings.rollback_share,
        unknown_share=settings.unknown_share,
        reused_key_share=settings.reused_key_share,
        slow_commit_share=settings.slow_commit_share if blocks_commits else 0.0,
        grace_seconds=GRACE_SECONDS,
        kafka_properties=CLIENT_TIMEOUTS,
        park_when_unavailable=settings.park_when_unavailable,
    )


def _run_phases(
    console: Console,
    settings: ChaosSettings,
    cluster: Cluster,
    sink: Sink,
    faults: list[Fault],
    url: str,
) -> Verdict:
    _step(
        console,
        f"{settings.checkers} checker replicas, the Spark sink "
        f"(continuous, {settings.sink_format})",
    )
    for checker in cluster.checkers:
        checker.start()
    sink.start()
    _step(console, f"{settings.producers} producer processes x {settings.threads} threads")
    for producer in cluster.producers:
        producer.start()
    for producer in cluster.producers:
        if not producer.wait_ready(120):
            raise RuntimeError(f"producer {producer.config.worker} did not start; see its log")
    cluster.started, cluster.started_wall = time.monotonic(), time.time()
    _step(console, f"sending {settings.transactions} transactions under faults")
    with _writability_monitor(cluster, settings) as monitor:
        _send_with_faults(cluster, settings, faults, console, sink.check)
        _step(console, "faults over: waiting for the checker to settle every half")
        _settle(cluster, settings, console, sink.check)
    committed = _committed_in_database(url)
    _step(console, "waiting for the sink to land every committed order")
    rows = sink.wait_for(committed, settings.settle_seconds, console)
    state = read_topic_state(cluster.kafka.bootstrap_servers, TopicNames(PREFIX), (REAL_TOPIC,))
    for event in cluster.events:
        if event.ended_wall is not None:
            event.stall = longest_gap_seconds(
                state.real_timestamps_ms, event.began_wall, event.ended_wall
            )
    blocked = _publication_blocked(cluster)
    stalls = publication_stalls(state, blocked)
    writable_stalls = publication_stalls(state, blocked + monitor.unwritable())
    owned_stalls = publication_stalls(state, blocked + monitor.unwritable(concerned_only=True))
    for event in cluster.events:
        if event.outcome is None:
            event.possible_stall = _longest_touching(event, stalls)
            event.writable_stall = _longest_touching(event, writable_stalls)
            event.owned_stall = _longest_touching(event, owned_stalls)
    verdict = judge(settings.seed, committed, state, rows)
    verdict.publication_stall_s = max((e - s for s, e in stalls), default=0.0)
    verdict.writable_stall_s = max((e - s for s, e in writable_stalls), default=0.0)
    verdict.owned_stall_s = max((e - s for s, e in owned_stalls), default=0.0)
    verdict.owned_stall_span = max(owned_stalls, key=lambda span: span[1] - span[0], default=None)
    verdict.orphaned_attempts = state.orphaned_attempts
    verdict.slow_commits = _slow_commits(url)
    counts = cluster.counts
    verdict.failed_sends = counts.failed
    if settings.park_when_unavailable:
        verdict.parked_sends = counts.parked
        verdict.failed_sends_kafka_away = cluster.failed_while_kafka_away()
    return verdict


def _writability_monitor(cluster: Cluster, settings: ChaosSettings) -> WritabilityMonitor:
    """Samples when Kafka could take the relay's transactions (see :mod:`.writability`)."""
    names = TopicNames(PREFIX)

    def down_nodes() -> frozenset[int]:
        """Killed, stopped or frozen nodes, and nodes cut from the others (no replication)."""
        under_way = [
            event
            for event in list(cluster.events)
            if event.ended_wall is None and event.outcome is None
        ]
        return frozenset(node.node_id for event in under_way for node in event.nodes) | frozenset(
            node for event in under_way for node in event.cut_nodes
        )

    return WritabilityMonitor(
        cluster.kafka.bootstrap_servers,
        read_topics=(names.op, names.half),
        written_topics=(REAL_TOPIC,),
        min_in_sync=int(replication_properties(settings.brokers)["min.insync.replicas"]),
        down_nodes=down_nodes,
        coordinator_keys={
            "__consumer_offsets": (relay_group(CHECKER_GROUP),),
            "__transaction_state": tuple(
                relay_transactional_id(CHECKER_GROUP, checker.instance_id)
                for checker in cluster.checkers
            ),
        },
    )


def _longest_touching(event: FaultEvent, stalls: list[Interval]) -> float:
    """The longest of ``stalls`` that overlaps the fault, from its start to its target's return."""
    ended = event.ended_wall if event.ended_wall is not None else float("inf")
    return max((e - s for s, e in stalls if s <= ended and e >= event.began_wall), default=0.0)


def _slow_commits(url: str) -> int:
    """Orders committed through the slow trigger: COMMITs that blocked past the grace."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            query = sa.text(f"SELECT count(*) FROM {ORDERS_TABLE} WHERE slow")
            return int(connection.execute(query).scalar_one())
    finally:
        engine.dispose()


def _publication_blocked(cluster: Cluster) -> list[Interval]:
    """When no publication could happen (epoch s): the single broker or a majority of the
    nodes away, or every checker replica killed or frozen. A node of three away leaves a
    quorum and a leader for every partition, so it blocks nothing: what follows it is the
    outbox's to win."""
    blocked: list[Interval] = []
    down: list[tuple[float, int, int]] = []
    """(time, checker index, +1 going down / -1 back)"""
    for event in cluster.events:
        if event.outcome is not None:
            continue
        ended = event.ended_wall if event.ended_wall is not None else float("inf")
        if 2 * len(event.nodes) > _node_count(cluster.kafka):
            blocked.append((event.began_wall, ended))
        for process in event.processes:
            if isinstance(process, CheckerProcess):
                down += [(event.began_wall, process.index, 1), (ended, process.index, -1)]
    downs: Counter[int] = Counter()
    since: float | None = None
    for moment, index, delta in sorted(down, key=lambda change: (change[0], -change[2])):
        downs[index] += delta
        all_down = sum(1 for n in downs.values() if n > 0) == len(cluster.checkers)
        if all_down and since is None:
            since = moment
        elif not all_down and since is not None:
            blocked.append((since, moment))
            since = None
    return blocked


def _report(
    console: Console, verdict: Verdict, cluster: Cluster, sink: Sink, seconds: float
) -> None:
    faults = Table(title="faults injected")
    columns = (
        "at",
        "fault",
        "target",
        "back after",
        "publication stalled",
        "while possible",
        "while writable",
        "ours",
    )
    for column in columns:
        faults.add_column(column, justify="right")
    for event in cluster.events:
        faults.add_row(
            f"{event.at_seconds:.1f}s",
            str(event.fault.kind),
            event.target,
            event.outcome or (f"{event.back_after:.1f}s" if event.back_after is not None else "-"),
            f"{event.stall:.1f}s" if event.stall is not None else "-",
            f"{event.possible_stall:.1f}s" if event.possible_stall is not None else "-",
            f"{event.writable_stall:.1f}s" if event.writable_stall is not None else "-",
            f"{event.owned_stall:.1f}s" if event.owned_stall is not None else "-",
        )
    console.print(faults)
    if verdict.owned_stall_span is not None:
        began, ended = (moment - cluster.started_wall for moment in verdict.owned_stall_span)
        console.print(
            f"the longest pause that was ours: {ended - began:.1f}s, "
            f"from {began:.1f}s to {ended:.1f}s of the run"
        )
    table = Table(title=f"chaos run, seed {verdict.seed} ({seconds:.0f}s)")
    table.add_column("what")
    table.add_column("count", justify="right")
    rows = [
        ("transactions (halves stored)", verdict.transactions),
        ("committed in the database", verdict.committed),
        ("rolled back (or never committed)", verdict.rolled_back),
        ("rows in the sink", verdict.sink_rows),
        ("lost (committed, not in the sink)", verdict.lost),
        ("  of which not on the real topic", verdict.unpublished),
        ("phantom (visible, not committed)", verdict.phantom),
        ("duplicates in the sink", verdict.duplicates_in_sink),
        ("raw duplicates on the real topic", verdict.raw_duplicates),
        ("pending halves", verdict.pending),
        ("orphaned attempts of reused ids (halves)", verdict.orphaned_attempts),
        ("  of which published", verdict.orphans_published),
        ("slow commits (blocked past the grace)", verdict.slow_commits),
        ("sends that failed (raised)", verdict.failed_sends),
        *(
            [
                ("  of which while Kafka was away", verdict.failed_sends_kafka_away),
                ("sends parked in the transaction log", verdict.parked_sends),
            ]
            if verdict.parked_sends is not None
            else []
        ),
        ("discarded halves", verdict.discarded),
        *(
            (f"discard cycle {n}: {cycle.describe()}", len(cycle.transaction_ids))
            for n, (_, cycle) in enumerate(cluster.cycles)
        ),
        ("sink query restarts", sink.restarts),
    ]
    for name, count in rows:
        table.add_row(name, str(count))
    for cause, count in verdict.causes.most_common():
        table.add_row(f"  raw duplicates: {cause}", str(count))
    console.print(table)
    for failure in sink.failures:
        console.print(f"[yellow]sink query failed and was restarted:[/] {failure}")
    for failure in verdict.failures:
        console.print(f"[red]invariant failed:[/] {failure}")
    console.print(verdict.line(), highlight=False, markup=False, soft_wrap=True)
