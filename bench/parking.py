"""``python -m bench.parking``: a send's latency across a broker fault, without and with
``park_when_unavailable``, and how soon the parked sends are visible after it (issue 38).

The bench freezes (SIGSTOP) or stops the broker it measures, so it starts a fresh
one of its own and shares it with nothing (there is no ``--bootstrap-servers``).
Two phases run on it in turn, each with its own topics, producer and checker:
parking off, then parking on.

A phase is a service taking orders at a fixed offered rate (``--rate`` a second,
spread over ``--senders`` threads on a schedule: requests come whether or not the
ones before are done). Each order is a ``send_message_in_transaction`` whose local
transaction inserts the order's row in the database of the outbox's transaction
log (a SQLite file, or ``--database-url``); one order in ten is declined (the
local transaction rolls back). The checker is a real ``outbox checker
--resolve-from-db`` process with an instance id, as the checker guide asks of every
replica (``--dynamic-member``: without one), and a ``read_committed`` reader of the real topic
notes when each transaction id first shows (assigned every partition, in no
group: its own rejoin after the fault is not what is measured). After a warm-up
(a first send seen on the real topic: the checker relays), ``--before-seconds`` of
steady sends, then the fault for ``--down-seconds``, ``--after-seconds`` of sends
with the broker back, and a bounded wait until every committed order is visible.

The figures: each send call's latency, over the phase and over the sends that
started while the broker was away; each request's latency from when it was due
(a sender blocked on a frozen broker holds up the requests behind it, which the
call's latency alone hides); with parking, the sends parked and their delay to
visible, counted from the broker's return and from the moment Kafka first
acknowledged a send again (the issue's aim: at most 2 s after that); and the
exactly-once checks against the orders table: every committed order visible once,
no declined one visible. A check that fails is a line naming it, and exit code 1.

Each phase's checker log is kept (``--log-dir``) and its moments around the fault
are read from it: an outage longer than its group session (6 s) costs it its half
partitions, and it publishes the parked sends only once it has them back.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka import Message as KafkaMessage
from confluent_kafka.admin import AdminClient
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from sqlalchemy.orm import Session, sessionmaker

from bench.common import (
    bench_main,
    figure,
    host_cpu_seconds,
    percentile_ms,
    print_last_line,
    process_cpu_seconds,
    save_results,
    warn_if_noisy,
)
from bench.parking_table import (
    FAULTS,
    Options,
    PhaseResult,
    phase_line,
    ratio,
    results_table,
)
from bench.visible import stop_process
from outbox import LocalTransactionState, Message, SendStatus, TransactionProducer
from outbox.admin import TopicSpec, ensure_topics, plan_topics
from outbox.config import kafka_client_config
from outbox.protocol import Header, TopicNames
from outbox.settings import ProducerSettings
from outbox.sql import LogTarget, SqlTransactionListener, create_engine, upgrade
from outbox.sql.log import transaction_log_table
from outbox_devtools.kafka import KAFKA_VERSION, LocalKafka, ensure_kafka_jars
from outbox_devtools.processes import free_port

GROUP = "bench-parking"
LOG_TABLE = "bench_parking_log"
"""The bench's own transaction-log table: a ``--database-url`` a service uses keeps its log."""
ORDERS_TABLE = "bench_parking_orders"
RESULTS_PATH = Path(__file__).resolve().parent / "results" / "parking.json"
LOG_DIR = Path(__file__).resolve().parent / "results" / "parking"
DECLINED_EVERY = 10
VALUE = b"o" * 100
PRIMER_TIMEOUT = 90.0
_TXN_HEADER = Header.TRANSACTION_ID.value

FULL = {
    "down_seconds": 20.0,
    "before_seconds": 5.0,
    "after_seconds": 10.0,
    "warmup": 3.0,
    "visible_timeout": 180.0,
    "settle_seconds": 5.0,
}
QUICK = {
    "down_seconds": 5.0,
    "before_seconds": 2.0,
    "after_seconds": 3.0,
    "warmup": 1.0,
    "visible_timeout": 90.0,
    "settle_seconds": 2.0,
}
"""``--quick``: one short fault per phase, a smoke run of about a minute and a half."""


# --------------------------------------------------------------------------- the service


class Orders:
    """The service's table and business function: what committed is read back from it,
    the ground truth the real topic is checked against."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self.table = sa.Table(
            ORDERS_TABLE,
            sa.MetaData(),
            sa.Column("transaction_id", sa.String(64), primary_key=True),
            sa.Column("phase", sa.String(8), nullable=False),
            sa.Column("seq", sa.Integer, nullable=False),
        )
        self.table.create(engine, checkfirst=True)
        with engine.begin() as connection:
            connection.execute(self.table.delete())
            connection.execute(transaction_log_table(LOG_TABLE).delete())
        self.attempted: dict[str, set[str]] = {}
        """Phase -> the transaction ids whose local transaction ran (committed or declined)."""

    def business(self, session: Session, message: Message, arg: tuple[str, int]) -> object:
        phase, seq = arg
        self.attempted.setdefault(phase, set()).add(message.transaction_id or "")
        if seq % DECLINED_EVERY == DECLINED_EVERY - 1:
            return LocalTransactionState.ROLLBACK_MESSAGE  # declined: nothing may show
        session.execute(
            self.table.insert().values(transaction_id=message.transaction_id, phase=phase, seq=seq)
        )
        return None

    def committed(self, phase: str) -> set[str]:
        with self.engine.connect() as connection:
            query = sa.select(self.table.c.transaction_id).where(self.table.c.phase == phase)
            return set(connection.execute(query).scalars())


def transaction_id_of(message: KafkaMessage) -> str | None:
    """The transaction id a real record carries in its headers."""
    for key, value in message.headers() or ():
        if key == _TXN_HEADER and value is not None:
            return value.decode()
    return None


class Reader:
    """A ``read_committed`` reader of the real topic: how often, and first when, each
    transaction id (or what ``key`` reads off a record) showed. Assigned every partition,
    in no group, so the broker's fault costs it no rejoin of its own."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        key: Callable[[KafkaMessage], str | None] = transaction_id_of,
    ) -> None:
        self._key = key
        self.seen: Counter[str] = Counter()
        self.first: dict[str, float] = {}
        self._stop = threading.Event()
        self._consumer = Consumer(
            {
                **kafka_client_config(bootstrap),
                "group.id": f"bench-parking-reader-{uuid.uuid4().hex[:6]}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 5,
            }
        )
        self._consumer.assign(
            [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)]
        )
        self._thread = threading.Thread(target=self._run, name="bench-parking-reader", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            message = self._consumer.poll(0.05)
            if message is None or message.error() is not None:
                continue
            now = time.monotonic()
            key = self._key(message)
            if key is not None:
                self.seen[key] += 1
                self.first.setdefault(key, now)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()


@dataclass
class Sample:
    """One send: when it was due, began and returned (monotonic), and what came of it."""

    seq: int
    due: float
    began: float
    ended: float
    transaction_id: str | None
    status: str
    """``sent`` (its half acknowledged), ``parked`` or ``failed`` (it raised)."""
    end_status: str | None = None
    error: str | None = None


class Senders:
    """``count`` threads sending on one fixed schedule, ``rate`` sends a second in all.

    Send ``seq`` (from 1) is due at ``t0 + (seq - 1) / rate`` and belongs to thread
    ``(seq - 1) % count``; a thread behind its schedule sends at once, as a service's
    worker takes the next queued request. After :meth:`stop`, sends due before it still
    go out (they were asked for); none due later does.
    """

    def __init__(self, send: Callable[[int, float], Sample], rate: float, count: int) -> None:
        self._send = send
        self._rate = rate
        self._count = count
        self._t0 = 0.0
        self._stop_at: float | None = None
        self._stopping = threading.Event()
        self._samples: list[list[Sample]] = [[] for _ in range(count)]
        self._threads = [
            threading.Thread(target=self._loop, args=(i,), name=f"bench-parking-{i}", daemon=True)
            for i in range(count)
        ]

    def start(self, t0: float) -> None:
        self._t0 = t0
        for thread in self._threads:
            thread.start()

    def _loop(self, index: int) -> None:
        seq = index + 1
        while True:
            due = self._t0 + (seq - 1) / self._rate
            if self._stop_at is not None and due >= self._stop_at:
                return
            delay = due - time.monotonic()
            if delay > 0 and self._stopping.wait(delay):
                continue  # stopped meanwhile: was this send due before the stop?
            self._samples[index].append(self._send(seq, due))
            seq += self._count

    def stop(self, join_seconds: float) -> None:
        self._stop_at = time.monotonic()
        self._stopping.set()
        for thread in self._threads:
            thread.join(join_seconds)

    @property
    def samples(self) -> list[Sample]:
        return sorted((s for mine in self._samples for s in list(mine)), key=lambda s: s.seq)

    def counts(self) -> Counter[str]:
        return Counter(s.status for mine in self._samples for s in list(mine))


class ClientLog(logging.Handler):
    """Counts what the bench's clients log at WARNING and above, and keeps it off the
    console: during a fault librdkafka and the producer log every refused connection
    and every parked send, and the table says what happened."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records = 0
        self._logger = logging.getLogger("outbox")

    def emit(self, record: logging.LogRecord) -> None:
        self.records += 1

    @contextmanager
    def installed(self) -> Iterator[ClientLog]:
        propagate = self._logger.propagate
        self._logger.addHandler(self)
        self._logger.propagate = False
        try:
            yield self
        finally:
            self._logger.removeHandler(self)
            self._logger.propagate = propagate


# --------------------------------------------------------------------------- the checker


def start_checker(
    bootstrap: str, prefix: str, database_url: str, options: Options, log_path: Path
) -> subprocess.Popen[bytes]:
    """``outbox checker --resolve-from-db`` as its own process, as deployed; its log
    (stdout and stderr) to ``log_path``, a file: a pipe nobody reads would stop it."""
    env = {
        **os.environ,
        "OUTBOX_BOOTSTRAP_SERVERS": bootstrap,
        "OUTBOX_HTTP_ADDRESS": f"127.0.0.1:{free_port()}",
    }
    command = [sys.executable, "-m", "outbox", "checker", "--topic-prefix", prefix]
    command += ["--resolve-from-db", database_url, "--db-table", LOG_TABLE]
    if not options.dynamic_member:
        # As the checker guide asks of every replica: a static member rejoins at once
        # after an outage past its session, a dynamic one once the broker expired it.
        command += ["--instance-id", f"{prefix}-checker"]
    if options.check_interval is not None:
        command += ["--check-interval", f"{options.check_interval:g}s"]
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)


_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (\w+) (\S+) (.*)$")
_PUBLISHED = re.compile(r"published (\d+) parked sends")
_ROUTINE = ("relay resumes at",)
"""Lines left out of the timeline: four a rebalance, saying nothing about time."""


def checker_moments(log_path: Path, since: float, returned: float) -> dict[str, Any]:
    """The checker's log from ``since`` on (monotonic), as seconds after ``returned``:
    when it lost and regained its half partitions, when it published parked sends,
    and its other lines (librdkafka's own and the relay's resume points left out)."""
    to_monotonic = time.monotonic() - time.time()
    timeline: list[tuple[float, str, str, str]] = []
    for line in log_path.read_text(errors="replace").splitlines():
        match = _LOG_LINE.match(line)
        if match is None or match[3] == "outbox.kafka" or match[2] == "DEBUG":
            continue
        stamp = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp() + to_monotonic
        if stamp >= since - 0.5 and not any(routine in match[4] for routine in _ROUTINE):
            timeline.append((round(stamp - returned, 2), match[2], match[3], match[4][:200]))

    def first(text: str, after: float = float("-inf")) -> float | None:
        return next((t for t, _, _, m in timeline if text in m and t >= after), None)

    drains = [(t, int(found[1])) for t, _, _, m in timeline if (found := _PUBLISHED.search(m))]
    refused = [t for t, _, _, m in timeline if "parked sends not drained" in m]
    revoked = first("revoked half partitions")
    assigned = first("assigned half partitions", revoked if revoked is not None else -1e9)
    drained = drains[0][0] if drains else None
    rounds = [
        t
        for t, _, _, m in timeline
        if m.startswith("round on partition")
        and (assigned is None or t >= assigned)
        and (drained is None or t <= drained)
    ]
    return {
        "drain_refused": len(refused),
        "first_drain_refused_after_return_s": refused[0] if refused else None,
        "revoked_after_return_s": revoked,
        "assigned_after_return_s": assigned,
        # The drain runs after a round on each partition it owns: the last of those.
        "last_round_before_drain_s": rounds[-1] if rounds and drained is not None else None,
        "first_drain_after_return_s": drained,
        "last_drain_after_return_s": drains[-1][0] if drains else None,
        "parked_published": sum(n for _, n in drains),
        "warnings": sum(1 for _, level, _, _ in timeline if level in ("WARNING", "ERROR")),
        "timeline": timeline[:100],
    }


def moments_line(moments: dict[str, Any]) -> str:
    """The checker's recovery in one line, seconds from the broker's return."""
    parts = [
        f"{what} {moments[key]:+.1f}s"
        for what, key in (
            ("a drain refused", "first_drain_refused_after_return_s"),
            ("lost its half partitions", "revoked_after_return_s"),
            ("had them back", "assigned_after_return_s"),
            ("rounds on them until", "last_round_before_drain_s"),
            ("first parked published", "first_drain_after_return_s"),
            ("last", "last_drain_after_return_s"),
        )
        if moments.get(key) is not None
    ]
    return "    checker (its log, from the broker's return): " + (
        ", ".join(parts) + f"; {moments.get('warnings', 0)} warnings" if parts else "nothing noted"
    )


# --------------------------------------------------------------------------- a phase


@dataclass
class Marks:
    """The phase's moments (monotonic)."""

    measure_from: float = 0.0
    fault_start: float = 0.0
    returned: float = 0.0
    return_took: float | None = None
    sends_end: float = 0.0


class BrokerCpu:
    """The broker's CPU seconds over a phase, across a stop and start (a new JVM)."""

    def __init__(self, broker: LocalKafka) -> None:
        self._broker = broker
        self._spent = 0.0
        self._base = process_cpu_seconds(broker.pid) if broker.pid else None

    def before_stop(self) -> None:
        now = process_cpu_seconds(self._broker.pid) if self._broker.pid else None
        if now is not None and self._base is not None:
            self._spent += now - self._base
        self._base = 0.0  # the next JVM's whole CPU is the phase's

    def total(self) -> float | None:
        now = process_cpu_seconds(self._broker.pid) if self._broker.pid else None
        return None if now is None or self._base is None else self._spent + now - self._base


class Phase:
    """One phase around one broker fault: parking ``parking``, on ``broker``."""

    def __init__(
        self,
        console: Console,
        options: Options,
        broker: LocalKafka,
        database_url: str,
        orders: Orders,
        parking: bool,
    ) -> None:
        self.console = console
        self.options = options
        self.broker = broker
        self.database_url = database_url
        self.orders = orders
        self.parking = parking
        self.tag = "on" if parking else "off"
        self.prefix = f"bench-parking-{self.tag}-{uuid.uuid4().hex[:6]}"
        self.topic = f"{self.prefix}.orders"
        self.marks = Marks()
        self.log_path = options.log_dir / f"checker-{self.tag}.log"

    def _say(self, text: str) -> None:
        self.console.print(f"[bold cyan]==>[/] parking {self.tag}: {text}", highlight=False)

    def run(self) -> PhaseResult:
        bootstrap = self.broker.bootstrap_servers
        specs = plan_topics(TopicNames(self.prefix), self.options.partitions, 1, (GROUP,))
        specs.append(TopicSpec(self.topic, self.options.partitions, 1))
        ensure_topics(AdminClient(kafka_client_config(bootstrap)), specs)
        listener = SqlTransactionListener(
            sessionmaker(self.orders.engine), self.orders.business, group=GROUP, table=LOG_TABLE
        )
        settings = ProducerSettings(
            bootstrap_servers=bootstrap,
            topic_prefix=self.prefix,
            park_when_unavailable=self.parking,
            park_after_seconds=self.options.park_after_seconds,
        )
        self._say(f"checker, producer (parking {self.tag}), reader of {self.topic}")
        checker = start_checker(
            bootstrap, self.prefix, self.database_url, self.options, self.log_path
        )
        reader = Reader(bootstrap, self.topic, self.options.partitions)
        producer = TransactionProducer(GROUP, listener, settings).start()
        client_log = ClientLog()
        try:
            with client_log.installed():
                primer = self._send(producer, 0, time.monotonic())
                self._wait_for(lambda: primer.transaction_id in reader.first, checker, "relay")
                cpu = self._cpu(checker)
                broker_cpu = BrokerCpu(self.broker)
                senders = Senders(
                    lambda seq, due: self._send(producer, seq, due),
                    self.options.rate,
                    self.options.senders,
                )
                samples = self._drive(senders, broker_cpu, settings.send_timeout_seconds)
                spent = self._spent(cpu, self._cpu(checker), broker_cpu)
                committed = self.orders.committed(self.tag)
                waited = self._wait_visible(reader, committed)
        finally:
            producer.shutdown()
            reader.close()
            stop_process(checker)
        result = self._result(samples, committed, reader, waited, spent)
        result.client_log_records = client_log.records
        return result

    def _send(self, producer: TransactionProducer, seq: int, due: float) -> Sample:
        began = time.monotonic()
        try:
            result = producer.send_message_in_transaction(
                Message(self.topic, VALUE, key=f"order-{seq % 50}"), (self.tag, seq)
            )
        except Exception as exc:  # any raise is a failed request, whatever its type
            return Sample(seq, due, began, time.monotonic(), None, "failed", error=repr(exc)[:300])
        status = "parked" if result.send_status is SendStatus.PARKED else "sent"
        return Sample(
            seq,
            due,
            began,
            time.monotonic(),
            result.transaction_id,
            status,
            result.end_status.value,
        )

    def _wait_for(
        self, done: Callable[[], bool], checker: subprocess.Popen[bytes], what: str
    ) -> None:
        deadline = time.monotonic() + PRIMER_TIMEOUT
        while not done():
            if checker.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the checker exited {checker.returncode}: {tail}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the checker's {what} published nothing in {PRIMER_TIMEOUT:g}s")
            time.sleep(0.05)

    def _drive(self, senders: Senders, broker_cpu: BrokerCpu, send_timeout: float) -> list[Sample]:
        """Sends on their schedule around the fault, which runs here, on the thread that
        started the broker (its JVM dies with the thread that started it)."""
        o, m = self.options, self.marks
        t0 = time.monotonic()
        m.measure_from = t0 + o.warmup
        fault_at = m.measure_from + o.before_seconds
        senders.start(t0)
        columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
        with Progress(*columns, console=self.console, transient=True) as progress:
            task = progress.add_task(
                self.tag, total=fault_at - t0 + o.down_seconds + o.after_seconds
            )

            def until(moment: float, what: str) -> None:
                while (left := moment - time.monotonic()) > 0:
                    counts = senders.counts()
                    progress.update(
                        task,
                        completed=time.monotonic() - t0,
                        description=f"parking {self.tag}, {what}: {sum(counts.values())} sends, "
                        f"{counts['parked']} parked, {counts['failed']} failed",
                    )
                    time.sleep(min(left, 0.25))

            until(fault_at, "sending")
            self._fault(broker_cpu, lambda moment: until(moment, f"broker {o.fault}"))
            until(m.returned + o.after_seconds, "broker back")
        senders.stop(send_timeout * 2 + 5)
        m.sends_end = time.monotonic()
        return senders.samples

    def _fault(self, broker_cpu: BrokerCpu, until: Callable[[float], None]) -> None:
        o, m = self.options, self.marks
        verb = "freezing" if o.fault == "freeze" else "stopping"
        self._say(f"{verb} the broker for {o.down_seconds:g}s")
        m.fault_start = time.monotonic()
        if o.fault == "freeze":
            self.broker.freeze()
        else:
            broker_cpu.before_stop()
            self.broker.stop()
        until(m.fault_start + o.down_seconds)
        if o.fault == "freeze":
            self.broker.thaw()
        else:
            began = time.monotonic()
            self.broker.start()
            m.return_took = time.monotonic() - began
        m.returned = time.monotonic()
        self._say(
            f"broker back after {m.returned - m.fault_start:.1f}s"
            + (f" (its start took {m.return_took:.1f}s)" if m.return_took is not None else "")
        )

    def _wait_visible(self, reader: Reader, committed: set[str]) -> float:
        """Until every committed order was seen (bounded), then ``settle_seconds`` more,
        in which a second copy would show; the seconds waited for the last one."""
        began = time.monotonic()
        deadline = began + self.options.visible_timeout
        self._say(f"waiting for {len(committed):,} committed orders to be visible")
        while any(t not in reader.first for t in committed) and time.monotonic() < deadline:
            time.sleep(0.1)
        waited = time.monotonic() - began
        time.sleep(self.options.settle_seconds)
        return waited

    def _cpu(self, checker: subprocess.Popen[bytes]) -> dict[str, float | None]:
        return {
            "wall": time.monotonic(),
            "host": host_cpu_seconds(),
            "bench": process_cpu_seconds(None),
            "checker": process_cpu_seconds(checker.pid),
        }

    @staticmethod
    def _spent(
        before: dict[str, float | None], after: dict[str, float | None], broker: BrokerCpu
    ) -> dict[str, float | None]:
        """% of one core each used over the phase; ``other``: everything else on the host."""
        wall = (after["wall"] or 0.0) - (before["wall"] or 0.0)

        def pct(name: str) -> float | None:
            a, b = after[name], before[name]
            return None if a is None or b is None or wall <= 0 else round(100 * (a - b) / wall, 1)

        spent = {name: pct(name) for name in ("host", "bench", "checker")}
        used = broker.total()
        spent["broker"] = None if used is None or wall <= 0 else round(100 * used / wall, 1)
        known = [spent["bench"], spent["checker"], spent["broker"]]
        host = spent.pop("host")
        spent["other"] = (
            None if host is None else round(max(0.0, host - sum(v or 0.0 for v in known)), 1)
        )
        return spent

    def _result(
        self,
        samples: list[Sample],
        committed: set[str],
        reader: Reader,
        waited: float,
        cpu: dict[str, float | None],
    ) -> PhaseResult:
        m = self.marks
        window = [s for s in samples if s.due >= m.measure_from]
        away = [s for s in window if m.fault_start <= s.began < m.returned]
        failed = [s for s in window if s.status == "failed"]
        parked = {s.transaction_id for s in window if s.status == "parked"}
        acked = [s.ended for s in samples if s.status == "sent" and s.ended > m.returned]
        writable = min(acked) if acked else None
        parked_committed = parked & committed
        first = reader.first
        to_return = [first[t] - m.returned for t in parked_committed if t in first]
        to_writable = [first[t] - writable for t in parked_committed if t in first and writable]
        attempted = self.orders.attempted.get(self.tag, set())
        shown = set(reader.seen)
        visible_committed = [first[t] for t in committed if t in first]
        load = os.getloadavg() if hasattr(os, "getloadavg") else None
        return PhaseResult(
            parking=self.parking,
            fault=self.options.fault,
            down_seconds=round(m.returned - m.fault_start, 2),
            return_took_s=None if m.return_took is None else round(m.return_took, 2),
            sends=len(window),
            failed=len(failed),
            first_error=failed[0].error if failed else None,
            parked=len(parked),
            parked_committed=len(parked_committed),
            send_p50_ms=_ms([s.ended - s.began for s in window], 50),
            send_p99_ms=_ms([s.ended - s.began for s in window], 99),
            send_max_ms=_ms([s.ended - s.began for s in window], 100),
            fault_sends=len(away),
            fault_send_p50_ms=_ms([s.ended - s.began for s in away], 50),
            fault_send_p99_ms=_ms([s.ended - s.began for s in away], 99),
            fault_send_max_ms=_ms([s.ended - s.began for s in away], 100),
            request_p99_ms=_ms([s.ended - s.due for s in window], 99),
            request_max_ms=_ms([s.ended - s.due for s in window], 100),
            fault_request_p99_ms=_ms(
                [s.ended - s.due for s in window if m.fault_start <= s.due < m.returned], 99
            ),
            writable_after_return_s=None if writable is None else round(writable - m.returned, 2),
            parked_to_visible_p50_s=_s(to_return, 50),
            parked_to_visible_max_s=_s(to_return, 100),
            after_writable_p50_s=_s(to_writable, 50),
            after_writable_max_s=_s(to_writable, 100),
            last_visible_after_return_s=(
                round(max(visible_committed) - m.returned, 2) if visible_committed else None
            ),
            committed=len(committed),
            rolled_back=len(attempted - committed),
            visible=len(committed & shown),
            missing=len(committed - shown),
            duplicates=sum(1 for t in committed if reader.seen[t] > 1),
            rolled_back_visible=len((attempted - committed) & shown),
            unexpected_visible=len(shown - attempted),
            visible_wait_s=round(waited, 2),
            end_statuses=dict(Counter(s.end_status or "raised" for s in window)),
            cpu_pct=cpu,
            other_cpu_pct=cpu.get("other"),
            load_average=None if load is None else [round(v, 2) for v in load],
            checker=checker_moments(self.log_path, m.fault_start, m.returned),
            checker_log=str(self.log_path),
        )


def _ms(seconds: list[float], q: float) -> float | None:
    return percentile_ms(seconds, q, digits=1)


def _s(seconds: list[float], q: float) -> float | None:
    value = percentile_ms(seconds, q)
    return None if value is None else round(value / 1000, 2)


# --------------------------------------------------------------------------- the bench


@dataclass
class Report:
    """What ``bench.all`` keeps of the bench."""

    phases: list[PhaseResult]
    summary: dict[str, Any]
    document: dict[str, Any]
    ok: bool
    other_cpu_pct: float

    def phase(self, parking: bool) -> PhaseResult | None:
        return next((p for p in self.phases if p.parking == parking), None)


@contextmanager
def _database(options: Options) -> Iterator[str]:
    """``--database-url``, or a SQLite file in a temporary directory."""
    if options.database_url:
        yield options.database_url
        return
    with tempfile.TemporaryDirectory(prefix="bench-parking-") as directory:
        yield f"sqlite:///{directory}/parking.db"


def measure(console: Console, options: Options) -> Report:
    """Start a broker of its own, run both phases on it, verify; print the table, save."""
    began = time.monotonic()
    console.print("[bold cyan]==>[/] resolving the Kafka broker jars", highlight=False)
    ensure_kafka_jars()
    console.print("[bold cyan]==>[/] starting a local Kafka broker of its own", highlight=False)
    with _database(options) as url, LocalKafka() as broker:
        console.print(
            f"    broker up at {broker.bootstrap_servers} in {broker.last_start_seconds:.1f}s; "
            f"database {url.split('@')[-1]}",
            highlight=False,
        )
        upgrade(url, target=LogTarget(LOG_TABLE))
        engine = create_engine(url)
        try:
            orders = Orders(engine)
            phases = []
            for parking in (False, True):
                phase = Phase(console, options, broker, url, orders, parking).run()
                console.print(phase_line(phase), highlight=False)
                console.print(moments_line(phase.checker), highlight=False)
                phases.append(phase)
        finally:
            engine.dispose()
    busiest = max((p.other_cpu_pct or 0.0 for p in phases), default=0.0)
    warn_if_noisy(console, busiest, "the phases")
    console.print(results_table(phases, options))
    problems = [f"{p.name}: {problem}" for p in phases for problem in p.problems()]
    for problem in problems:
        console.print(f"[red]FAILED:[/] {problem}", highlight=False)
    summary = _summary(phases, options)
    document = {
        "bench": "parking",
        "created_unix": round(time.time(), 3),
        "elapsed_seconds": round(time.monotonic() - began, 1),
        "config": {
            key: str(value) if isinstance(value, Path) else value
            for key, value in asdict(options).items()
        },
        "environment": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "kafka": KAFKA_VERSION,
            "database": url.split(":", 1)[0],
        },
        "phases": [asdict(p) for p in phases],
        "summary": summary,
        "problems": problems,
        "ok": not problems,
    }
    save_results(console, options.json_path, document)
    return Report(phases, summary, document, ok=not problems, other_cpu_pct=busiest)


def _summary(phases: list[PhaseResult], options: Options) -> dict[str, Any]:
    """The headline figures; ``_off``/``_on``: without/with parking."""
    off = next((p for p in phases if not p.parking), None)
    on = next((p for p in phases if p.parking), None)
    return {
        "fault": options.fault,
        "down_s": options.down_seconds,
        "fault_p99_ms_off": off.fault_send_p99_ms if off else None,
        "fault_p99_ms_on": on.fault_send_p99_ms if on else None,
        "fault_p99_ratio": ratio(
            off.fault_send_p99_ms if off else None, on.fault_send_p99_ms if on else None
        ),
        "fault_request_p99_ms_off": off.fault_request_p99_ms if off else None,
        "fault_request_p99_ms_on": on.fault_request_p99_ms if on else None,
        "failed_off": off.failed if off else None,
        "failed_on": on.failed if on else None,
        "parked": on.parked if on else None,
        "parked_to_visible_p50_s": on.parked_to_visible_p50_s if on else None,
        "parked_to_visible_max_s": on.parked_to_visible_max_s if on else None,
        "after_writes_max_s": on.after_writable_max_s if on else None,
        "missing": sum(p.missing for p in phases),
        "duplicates": sum(p.duplicates for p in phases),
        "rolled_back_visible": sum(p.rolled_back_visible for p in phases),
    }


LAST_LINE = (
    ("fault_p99_ms_off", ".0f"),
    ("fault_p99_ms_on", ".0f"),
    ("fault_p99_ratio", ".1f"),
    ("fault_request_p99_ms_off", ".0f"),
    ("fault_request_p99_ms_on", ".0f"),
    ("failed_off", "d"),
    ("failed_on", "d"),
    ("parked", "d"),
    ("parked_to_visible_p50_s", ".1f"),
    ("parked_to_visible_max_s", ".1f"),
    ("after_writes_max_s", ".1f"),
    ("missing", "d"),
    ("duplicates", "d"),
    ("rolled_back_visible", "d"),
)


def run(console: Console, options: Options) -> int:
    report = measure(console, options)
    summary = report.summary
    print_last_line(
        console,
        f"bench-parking: fault={summary['fault']} down_s={summary['down_s']:g} "
        + " ".join(f"{key}={figure(summary[key], spec)}" for key, spec in LAST_LINE),
    )
    return 0 if report.ok else 1


# --------------------------------------------------------------------------- command line


def _seconds(minimum: float, inclusive: bool) -> Callable[[str], float]:
    """An argparse type: a number of seconds above (or from) ``minimum``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value < minimum or (value == minimum and not inclusive) or value != value:
            bound = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text!r}")
        return value

    return parse


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return value


def parse_args(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.parking",
        description="Send latency across a broker fault without and with park_when_unavailable, "
        "and the parked sends' delay to visible; on a broker of its own.",
    )
    positive, at_least_zero = _seconds(0.0, inclusive=False), _seconds(0.0, inclusive=True)
    parser.add_argument(
        "--quick", action="store_true", help="a 5 s fault, short phases: a smoke run"
    )
    parser.add_argument("--fault", choices=FAULTS, default="freeze", help="SIGSTOP, or stop/start")
    parser.add_argument("--down-seconds", type=positive, help="the fault's length (20; quick 5)")
    parser.add_argument("--before-seconds", type=at_least_zero, help="sends before the fault (5)")
    parser.add_argument("--after-seconds", type=at_least_zero, help="sends after the return (10)")
    parser.add_argument("--warmup", type=at_least_zero, help="uncounted seconds of sends (3)")
    parser.add_argument("--rate", type=positive, default=20.0, help="sends a second, in all")
    parser.add_argument("--senders", type=_count, default=2, help="sending threads")
    parser.add_argument("--partitions", type=_count, default=4)
    parser.add_argument("--park-after-seconds", type=positive, default=0.5)
    parser.add_argument("--database-url", help="SQLAlchemy URL (default: a SQLite temp file)")
    parser.add_argument("--check-interval", type=positive, help="the checker's (default its own)")
    parser.add_argument(
        "--dynamic-member",
        action="store_true",
        help="run the checker without --instance-id (a dynamic group member)",
    )
    parser.add_argument("--visible-timeout", type=positive, help="wait for visible at most (180)")
    parser.add_argument("--settle-seconds", type=at_least_zero, help="read on after that (5)")
    parser.add_argument("--json", dest="json_path", type=Path, default=RESULTS_PATH)
    parser.add_argument("--log-dir", type=Path, default=LOG_DIR, help="the checkers' logs")
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    timings = {
        key: getattr(args, key) if getattr(args, key) is not None else default
        for key, default in defaults.items()
    }
    return Options(
        fault=args.fault,
        rate=args.rate,
        senders=args.senders,
        partitions=args.partitions,
        park_after_seconds=args.park_after_seconds,
        database_url=args.database_url,
        check_interval=args.check_interval,
        dynamic_member=args.dynamic_member,
        quick=args.quick,
        json_path=args.json_path,
        log_dir=args.log_dir,
        **timings,
    )


def main(argv: Sequence[str] | None = None) -> None:
    bench_main(parse_args(argv), run)


if __name__ == "__main__":
    main()
