"""``python -m bench.peer``: us against the polling outbox a Python service would otherwise pick.

The peer is faststream-outbox (issue 40): a PostgreSQL table, ``FOR UPDATE SKIP
LOCKED`` claims, ``LISTEN``/``NOTIFY`` wake-ups, and a FastStream Kafka publisher
relaying each row. Both sides run the same service shape on the same PostgreSQL
and the same broker: each request is ONE database transaction that inserts an
order row and publishes its 1 KiB event (:mod:`bench.peer_service`, a process of
its own per cell). Each side's relay runs as deployed, in its own process: the
peer's FastStream app (:mod:`bench.peer_relay`), and for our forms a real
``outbox checker``, whose relay publishes the committed halves to the real topic.

For each side and each ``--concurrency`` (1, 16, 64 requests in flight): the
requests a second; the CPU per committed request of every process of the side
(the service while it sends, plus the relay from the first request until the last
is visible; /proc); commit-to-visible p50/p99/max, from the stamp the service
takes when its COMMIT returns to the moment a ``read_committed`` reader of the real
topic (in this process, not counted) first sees the order id the event carries;
and the database's own cost per request: ``pg_stat_database`` deltas (transactions,
tuples inserted, updated, deleted), WAL bytes (``pg_current_wal_lsn()``), and the
server's CPU when the server is local. Every committed request (the warm-up's too)
must be visible exactly once, and every committed order's row present: a check
that fails is a line naming it, and exit code 1.

PostgreSQL is ``--database-url`` or a local cluster started here (tuned for speed:
``fsync=off``, ``synchronous_commit=off``, as every bench and test runs it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import queue
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import IO, Any

import sqlalchemy as sa
from confluent_kafka import Message as KafkaMessage
from confluent_kafka.admin import AdminClient
from faststream_outbox import make_outbox_table
from rich.console import Console

from bench.common import (
    bench_main,
    figure,
    host_cpu_seconds,
    percentile_ms,
    print_last_line,
    process_cpu_seconds,
    run_on_broker,
    save_results,
    warn_if_noisy,
)
from bench.parking import Reader
from bench.peer_service import (
    APPLICATION_NAME,
    GROUP,
    LOG_TABLE,
    PEER_QUEUE,
    PEER_TABLE,
    RELAY_APPLICATION_NAME,
    asyncpg_url,
    orders_table,
)
from bench.peer_table import (
    SIDE_NAMES,
    SIDES,
    CellResult,
    Options,
    cell_line,
    results_table,
    summary,
)
from bench.visible import start_checker, stop_process
from outbox.admin import TopicSpec, ensure_topics, plan_topics
from outbox.config import kafka_client_config
from outbox.protocol import TopicNames
from outbox.sql import LogTarget, create_engine, upgrade
from outbox_devtools.kafka import KAFKA_VERSION
from outbox_devtools.postgres import LocalPostgres
from outbox_devtools.processes import free_port

RESULTS_PATH = Path(__file__).resolve().parent / "results" / "peer.json"
ROOT = Path(__file__).resolve().parent.parent
SETTLE_SECONDS = 0.5
"""Reading on after a cell's last event is visible, before it is checked: a second copy
(a relay's redelivery) would show."""
START_TIMEOUT = 120.0
FULL = {"concurrency": "1,16,64", "seconds": 10.0, "warmup": 1.0}
QUICK = {"concurrency": "4", "seconds": 0.5, "warmup": 0.2}
"""``--quick``: one level, half a second of requests a side: a smoke run, not a measurement."""


# --------------------------------------------------------------------------- the database


@dataclass
class DbSample:
    """The database's counters at one moment."""

    xacts: int
    rollbacks: int
    inserted: int
    updated: int
    deleted: int
    wal_lsn: str
    cpu: float | None


class Database:
    """The PostgreSQL both sides use: its tables, and its counters read on a connection of
    our own (``pg_stat_database`` for this database, the server's WAL position, and when
    the server is on this host the CPU of its processes, from /proc)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = create_engine(url, isolation_level="AUTOCOMMIT", pool_size=1)
        with self.engine.connect() as connection:
            backend = connection.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
        self.server_pid = _local_postmaster(int(backend))

    def prepare(self) -> None:
        """Fresh tables: the orders, the peer's outbox table, our transaction log."""
        metadata = sa.MetaData()
        orders = orders_table(metadata)
        peer = make_outbox_table(metadata, table_name=PEER_TABLE)
        metadata.drop_all(self.engine, tables=[orders, peer])
        metadata.create_all(self.engine, tables=[orders, peer])
        upgrade(self.url, target=LogTarget(LOG_TABLE))
        with self.engine.connect() as connection:
            connection.execute(sa.text(f"TRUNCATE {LOG_TABLE}"))

    def sample(self) -> DbSample:
        with self.engine.connect() as connection:
            row = connection.execute(
                sa.text(
                    "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted, "
                    "pg_current_wal_lsn()::text FROM pg_stat_database "
                    "WHERE datname = current_database()"
                )
            ).one()
        return DbSample(*row[:5], wal_lsn=row[5], cpu=_process_tree_cpu(self.server_pid))

    def wal_bytes(self, before: DbSample, after: DbSample) -> int:
        with self.engine.connect() as connection:
            return int(
                connection.execute(
                    sa.text("SELECT pg_wal_lsn_diff(:a, :b)"),
                    {"a": after.wal_lsn, "b": before.wal_lsn},
                ).scalar_one()
            )

    def wait_for_clients(self, *names: str, timeout: float = 10.0) -> None:
        """Until no client named one of ``names`` (``application_name``) is connected: a
        backend reports its statistics as it exits, a moment after its client went."""
        query = sa.text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name IN :names"
        ).bindparams(sa.bindparam("names", expanding=True))
        deadline = time.monotonic() + timeout
        with self.engine.connect() as connection:
            while (
                connection.execute(query, {"names": list(names)}).scalar_one()
                and time.monotonic() < deadline
            ):
                time.sleep(0.02)

    def publish_primer(self) -> str:
        """One event through faststream-outbox, as the service publishes it; its order id."""
        order_id = uuid.uuid4().hex

        async def publish() -> None:
            from faststream_outbox import OutboxBroker
            from sqlalchemy.ext.asyncio import create_async_engine

            engine = create_async_engine(asyncpg_url(self.url))
            table = make_outbox_table(sa.MetaData(), table_name=PEER_TABLE)
            broker = OutboxBroker(engine, outbox_table=table, logger=None)
            try:
                async with engine.begin() as connection:
                    await broker.publish(order_id.encode(), queue=PEER_QUEUE, session=connection)
            finally:
                await engine.dispose()

        asyncio.run(publish())
        return order_id

    def rows(self, cell: str) -> int:
        orders = orders_table()
        query = sa.select(sa.func.count()).where(orders.c.cell == cell)
        with self.engine.connect() as connection:
            return int(connection.execute(query).scalar_one())

    def dispose(self) -> None:
        self.engine.dispose()


def _local_postmaster(backend_pid: int) -> int | None:
    """The server's pid when ``backend_pid`` is a PostgreSQL backend on this host."""
    try:
        if Path(f"/proc/{backend_pid}/comm").read_text().strip() != "postgres":
            return None
        parent = int(Path(f"/proc/{backend_pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        return parent if Path(f"/proc/{parent}/comm").read_text().strip() == "postgres" else None
    except (OSError, ValueError, IndexError):
        return None


def _process_tree_cpu(pid: int | None) -> float | None:
    """CPU seconds of ``pid``, of its children that exited (reaped) and of those alive:
    a PostgreSQL server's, whose backends come and go with the clients' connections."""
    if pid is None:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # utime, stime, cutime, cstime: fields 14-17 of stat, 12-15 after the ")".
    total = sum(int(v) for v in fields[11:15]) / tick
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            child = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if child[1] == str(pid):
            total += (int(child[11]) + int(child[12])) / tick
    return total


@contextmanager
def _database(console: Console, options: Options) -> Iterator[str]:
    """``--database-url``, or a local PostgreSQL started here for the run."""
    if options.database_url:
        yield options.database_url
        return
    console.print("[bold cyan]==>[/] starting a local PostgreSQL", highlight=False)
    with LocalPostgres(database="bench_peer") as server:
        yield server.url


# --------------------------------------------------------------------------- processes


class ServiceProcess:
    """One cell's service (:mod:`bench.peer_service`), driven by lines on its stdin/stdout."""

    def __init__(self, command: list[str], log: IO[bytes]) -> None:
        self._log = log
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line.strip())
        self._lines.put(None)

    def expect(self, word: str, timeout: float) -> None:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            line = ""
        if line != word:
            raise RuntimeError(
                f"the service said {line!r}, not {word!r} (within {timeout:g}s): {self.log_tail()}"
            )

    def say(self, word: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(word + "\n")
        self.process.stdin.flush()

    def log_tail(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-2000:]

    def stop(self) -> None:
        """``exit`` (again: a line it no longer reads is harmless), then its end."""
        try:
            self.say("exit")
            self.process.wait(30)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            stop_process(self.process)  # type: ignore[arg-type]


def start_peer_relay(
    options: Options, database_url: str, bootstrap: str, topic: str, log: IO[bytes]
) -> subprocess.Popen[bytes]:
    """faststream-outbox's relay (:mod:`bench.peer_relay`), its own process."""
    command = [sys.executable, "-m", "bench.peer_relay", "--database-url"]
    command += [asyncpg_url(database_url), "--bootstrap-servers", bootstrap]
    command += ["--table", PEER_TABLE, "--queue", PEER_QUEUE, "--topic", topic]
    command += ["--workers", str(options.peer_workers)]
    command += ["--fetch-batch", str(options.peer_fetch_batch)]
    command += ["--flush-batch", str(options.peer_flush_batch)]
    command += ["--application-name", RELAY_APPLICATION_NAME]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)


class Relay:
    """A side's relay process: our checker (one for all our forms; it holds no
    connection to the database), or faststream-outbox's relay, restarted around each
    measured window (``per_window``): a PostgreSQL backend reports its statistics when
    its connection closes, else up to 10 s after it goes idle, so only a relay whose
    connections close at the window's edges has its share counted in that window."""

    def __init__(
        self,
        start: Callable[[], subprocess.Popen[bytes]],
        log: IO[bytes],
        database: Database,
        per_window: bool,
    ) -> None:
        self._start = start
        self._log = log
        self._database = database
        self.per_window = per_window
        self.process = start()
        self._stopped = False

    def check(self) -> None:
        if self.process.poll() is not None:
            self._log.seek(0)
            tail = self._log.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"the relay exited {self.process.returncode}: {tail}")

    def begin_window(self, wait_visible: Callable[[list[str], float], float]) -> None:
        """A fresh relay process, its predecessor's statistics reported, relaying: an event
        it published (its Kafka producer connected, the topic's metadata known)."""
        if not self.per_window:
            return
        stop_process(self.process)
        self._database.wait_for_clients(RELAY_APPLICATION_NAME)
        self.process = self._start()
        wait_visible([self._database.publish_primer()], START_TIMEOUT)

    def end_window(self) -> None:
        """The peer's relay stopped (its statistics reported); the next cell starts one."""
        if self.per_window:
            stop_process(self.process)
            self._stopped = True

    def running(self) -> None:
        """Started again if :meth:`end_window` stopped it: for the next cell's warm-up."""
        if self._stopped:
            self.process = self._start()
            self._stopped = False

    def stop(self) -> None:
        if not self._stopped:
            stop_process(self.process)
            self._stopped = True


def order_id_of(message: KafkaMessage) -> str | None:
    """The order id an event's value starts with (both sides' events)."""
    value = message.value()
    return value[:32].decode(errors="replace") if value and len(value) >= 32 else None


# --------------------------------------------------------------------------- a cell


class Side:
    """One side: its real topic, its reader, its relay process; a cell per concurrency."""

    def __init__(
        self,
        console: Console,
        options: Options,
        database: Database,
        bootstrap: str,
        broker_pid: int | None,
        prefix: str,
        side: str,
        relay: Relay,
    ) -> None:
        self.console = console
        self.options = options
        self.database = database
        self.bootstrap = bootstrap
        self.broker_pid = broker_pid
        self.prefix = prefix
        self.side = side
        self.topic = side_topic(prefix, side)
        self.relay = relay
        self.reader = Reader(bootstrap, self.topic, options.partitions, key=order_id_of)

    def close(self) -> None:
        self.reader.close()

    def _wait_visible(self, ids: Sequence[str], timeout: float) -> float:
        """Until every id of ``ids`` was seen (bounded); the seconds waited."""
        if not ids:
            return 0.0
        began = time.monotonic()
        deadline = began + timeout
        while any(i not in self.reader.first for i in ids) and time.monotonic() < deadline:
            self.relay.check()
            time.sleep(0.02)
        return time.monotonic() - began

    def _cpu(self, service: int) -> dict[str, float | None]:
        return {
            "wall": time.monotonic(),
            "host": host_cpu_seconds(),
            "bench": process_cpu_seconds(None),
            "service": process_cpu_seconds(service),
            "relay": process_cpu_seconds(self.relay.process.pid),
            "broker": process_cpu_seconds(self.broker_pid) if self.broker_pid else None,
        }

    def cell(self, concurrency: int) -> CellResult:
        o = self.options
        tag = f"{self.side}-{concurrency}"
        with tempfile.TemporaryDirectory(prefix="bench-peer-") as directory:
            out = Path(directory) / "service.json"
            command = [sys.executable, "-m", "bench.peer_service", "--side", self.side]
            command += ["--concurrency", str(concurrency), "--seconds", f"{o.seconds:g}"]
            command += ["--warmup", f"{o.warmup:g}", "--value-bytes", str(o.value_bytes)]
            command += ["--database-url", self.database.url, "--bootstrap-servers", self.bootstrap]
            command += ["--prefix", self.prefix, "--topic", self.topic, "--cell", tag]
            command += ["--out", str(out)]
            with (Path(directory) / "service.log").open("w+b") as log:
                self.relay.running()
                service = ServiceProcess(command, log)
                try:
                    return self._drive(service, out, tag)
                finally:
                    service.stop()

    def _drive(self, service: ServiceProcess, out: Path, tag: str) -> CellResult:
        o = self.options
        service.expect("ready", START_TIMEOUT)
        warmup = list(json.loads(out.read_text())["committed"])
        self._wait_visible(warmup, START_TIMEOUT)
        self.relay.begin_window(self._wait_visible)
        db_before = self.database.sample()
        before = self._cpu(service.process.pid)
        service.say("go")
        service.expect("done", o.seconds + START_TIMEOUT)
        service_after = process_cpu_seconds(service.process.pid)
        measured = json.loads(out.read_text())
        service.say("exit")  # it shuts down while its last events are relayed
        committed: dict[str, float] = measured["committed"]
        waited = self._wait_visible(list(committed), o.visible_timeout)
        after = self._cpu(service.process.pid)
        after["service"] = service_after
        service.stop()
        self.relay.end_window()
        self.database.wait_for_clients(APPLICATION_NAME, RELAY_APPLICATION_NAME)
        db_after = self.database.sample()
        time.sleep(SETTLE_SECONDS)  # a second copy of an event would show by now
        return self._result(
            committed, measured, warmup, waited, before, after, db_before, db_after, tag
        )

    def _result(
        self,
        committed: dict[str, float],
        measured: dict[str, Any],
        warmup: list[str],
        waited: float,
        before: dict[str, float | None],
        after: dict[str, float | None],
        db_before: DbSample,
        db_after: DbSample,
        tag: str,
    ) -> CellResult:
        n = len(committed)
        first, seen = self.reader.first, self.reader.seen
        delays = [first[i] - at for i, at in committed.items() if i in first]
        last = max((first[i] for i in committed if i in first), default=None)
        span = None if last is None else last - (before["wall"] or 0.0)

        def per_request(a: float | None, b: float | None, scale: float = 1.0) -> float | None:
            return None if a is None or b is None or n == 0 else round((a - b) * scale / n, 3)

        service_us = per_request(after["service"], before["service"], 1e6)
        relay_us = per_request(after["relay"], before["relay"], 1e6)
        wall = (after["wall"] or 0.0) - (before["wall"] or 0.0)

        def pct(name: str) -> float | None:
            a, b = after[name], before[name]
            return None if a is None or b is None or wall <= 0 else round(100 * (a - b) / wall, 1)

        cpu = {name: pct(name) for name in ("host", "bench", "service", "relay", "broker")}
        db_cpu_pct = (
            None
            if db_after.cpu is None or db_before.cpu is None or wall <= 0
            else round(100 * (db_after.cpu - db_before.cpu) / wall, 1)
        )
        cpu["database"] = db_cpu_pct
        host = cpu.pop("host")
        known = sum(v or 0.0 for v in cpu.values())
        cpu["other"] = None if host is None else round(max(0.0, host - known), 1)
        return CellResult(
            side=self.side,
            concurrency=int(tag.rsplit("-", 1)[1]),
            committed=n,
            errors=measured["errors"],
            first_error=measured["first_error"],
            requests_per_s=round(n / measured["wall_seconds"], 1),
            rows=self.database.rows(tag),
            visible=sum(1 for i in committed if i in seen),
            missing=sum(1 for i in committed if i not in seen),
            duplicates=sum(1 for i in committed if seen[i] > 1),
            warmup_committed=len(warmup),
            warmup_missing=sum(1 for i in warmup if i not in seen),
            warmup_duplicates=sum(1 for i in warmup if seen[i] > 1),
            visible_p50_ms=percentile_ms(delays, 50, digits=1),
            visible_p99_ms=percentile_ms(delays, 99, digits=1),
            visible_max_ms=percentile_ms(delays, 100, digits=1),
            visible_wait_s=round(waited, 2),
            relayed_per_s=None if not span or span <= 0 else round(n / span, 1),
            service_cpu_us=None if service_us is None else round(service_us),
            relay_cpu_us=None if relay_us is None else round(relay_us),
            cpu_us_per_request=(
                None if service_us is None or relay_us is None else round(service_us + relay_us)
            ),
            db_xacts=per_request(db_after.xacts, db_before.xacts),
            db_rollbacks=per_request(db_after.rollbacks, db_before.rollbacks),
            db_inserted=per_request(db_after.inserted, db_before.inserted),
            db_updated=per_request(db_after.updated, db_before.updated),
            db_deleted=per_request(db_after.deleted, db_before.deleted),
            wal_bytes=(
                None if n == 0 else round(self.database.wal_bytes(db_before, db_after) / n, 1)
            ),
            db_cpu_us=(
                None
                if per_request(db_after.cpu, db_before.cpu, 1e6) is None
                else round(per_request(db_after.cpu, db_before.cpu, 1e6) or 0.0)
            ),
            cpu_pct=cpu,
            other_cpu_pct=cpu["other"],
        )


def side_topic(prefix: str, side: str) -> str:
    return f"{prefix}.orders-{side}"


# --------------------------------------------------------------------------- the bench


@dataclass
class Report:
    """What ``bench.all`` keeps of the bench."""

    cells: list[CellResult]
    summary: list[tuple[str, float | None, str]]
    document: dict[str, Any]
    ok: bool
    other_cpu_pct: float

    def of(self, side: str, concurrency: int) -> CellResult | None:
        return next(
            (c for c in self.cells if c.side == side and c.concurrency == concurrency), None
        )


def measure(console: Console, options: Options, bootstrap: str, broker_pid: int | None) -> Report:
    began = time.monotonic()
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    with _database(console, options) as url:
        database = Database(url)
        try:
            database.prepare()
            cells = _measure_sides(console, options, database, bootstrap, broker_pid)
            where = (
                "a local PostgreSQL"
                if database.server_pid
                else "PostgreSQL at " + (sa.make_url(url).host or "?")
            )
        finally:
            database.dispose()
    busiest = max((c.other_cpu_pct or 0.0 for c in cells), default=0.0)
    warn_if_noisy(console, busiest, "the cells")
    console.print(results_table(cells, options, where))
    problems = [problem for cell in cells for problem in cell.problems()]
    for problem in problems:
        console.print(f"[red]FAILED:[/] {problem}", highlight=False)
    rows = summary(cells)
    document = {
        "bench": "peer",
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
            "faststream_outbox": _version("faststream-outbox"),
            "faststream": _version("faststream"),
            "load_average_at_start": None if load is None else [round(v, 2) for v in load],
        },
        "cells": [asdict(c) for c in cells],
        "summary": {key: value for key, value, _ in rows},
        "problems": problems,
        "ok": not problems,
    }
    save_results(console, options.json_path, document)
    return Report(cells, rows, document, ok=not problems, other_cpu_pct=busiest)


def _version(distribution: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def _measure_sides(
    console: Console,
    options: Options,
    database: Database,
    bootstrap: str,
    broker_pid: int | None,
) -> list[CellResult]:
    prefix = f"bench-peer-{uuid.uuid4().hex[:6]}"
    specs = plan_topics(TopicNames(prefix), options.partitions, 1, (GROUP,))
    specs += [TopicSpec(side_topic(prefix, s), options.partitions, 1) for s in options.sides]
    ensure_topics(AdminClient(kafka_client_config(bootstrap)), specs)
    cells: list[CellResult] = []
    with tempfile.TemporaryFile() as checker_log, tempfile.TemporaryFile() as relay_log:
        relays: list[Relay] = []
        try:
            # Our checker first, joining its group while the peer's cells run (it holds no
            # connection to the database and idles meanwhile, as a deployed sidecar does).
            checker = None
            if any(side != "peer" for side in options.sides):
                checker = Relay(
                    partial(start_checker, bootstrap, prefix, checker_log, free_port()),
                    checker_log,
                    database,
                    per_window=False,
                )
                relays.append(checker)
            for side in options.sides:
                if side == "peer":
                    what = (
                        f"faststream-outbox's relay (max_workers={options.peer_workers}, "
                        f"fetch_batch_size={options.peer_fetch_batch}, "
                        f"terminal_flush_batch_size={options.peer_flush_batch})"
                    )
                    topic = side_topic(prefix, side)
                    start = partial(start_peer_relay, options, database.url, bootstrap, topic)
                    relay = Relay(partial(start, relay_log), relay_log, database, per_window=True)
                    relays.append(relay)
                else:
                    what, relay = "the outbox checker relaying", checker
                assert relay is not None
                _say(console, f"{SIDE_NAMES[side]}: {what}")
                cells += _side_cells(
                    console,
                    options,
                    Side(console, options, database, bootstrap, broker_pid, prefix, side, relay),
                )
                if side == "peer":
                    relay.stop()
        finally:
            for relay in relays:
                relay.stop()
    return cells


def _side_cells(console: Console, options: Options, side: Side) -> list[CellResult]:
    """The side at each concurrency, a progress line each."""
    cells = []
    try:
        for concurrency in options.concurrency:
            _say(
                console,
                f"{side.side} at {concurrency} concurrent requests: warm-up "
                f"{options.warmup:g}s, measuring {options.seconds:g}s",
            )
            cell = side.cell(concurrency)
            console.print(cell_line(cell), highlight=False)
            cells.append(cell)
    finally:
        side.close()
    return cells


def _say(console: Console, text: str) -> None:
    console.print(f"[bold cyan]==>[/] {text}", highlight=False)


# --------------------------------------------------------------------------- command line


def _run_against(console: Console, options: Options, bootstrap: str, broker_pid: int | None) -> int:
    report = measure(console, options, bootstrap, broker_pid)
    print_last_line(
        console,
        "bench-peer: "
        + " ".join(f"{key}={figure(value, spec)}" for key, value, spec in report.summary),
    )
    return 0 if report.ok else 1


def check_database(console: Console, url: str) -> bool:
    """Whether ``--database-url`` answers; one line naming the problem if not."""
    try:
        engine = create_engine(url)
        try:
            with engine.connect() as connection:
                connection.execute(sa.text("SELECT 1"))
        finally:
            engine.dispose()
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        console.print(
            f"error: --database-url {sa.make_url(url).render_as_string()}: cannot connect "
            f"({reason})",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
        return False
    return True


def run(console: Console, options: Options) -> int:
    if options.database_url and not check_database(console, options.database_url):
        return 2
    return run_on_broker(console, options, _run_against)


def _levels(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 1,16,64, got {text!r}") from None
    if not levels or any(level < 1 for level in levels):
        raise argparse.ArgumentTypeError(f"each level must be at least 1, got {text!r}")
    return levels


def _sides(text: str) -> list[str]:
    sides = {part.strip() for part in text.split(",") if part.strip()}
    if not sides or not sides <= set(SIDES):
        raise argparse.ArgumentTypeError(f"sides are of {', '.join(SIDES)}, got {text!r}")
    # In SIDES' order, the peer first: our forms share one checker, started once.
    return [side for side in SIDES if side in sides]


def _positive(kind: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
        return value

    return parse


def _database_url(text: str) -> str:
    try:
        url = sa.make_url(text)
    except sa.exc.ArgumentError:
        raise argparse.ArgumentTypeError(f"not a database URL: {text!r}") from None
    if url.get_backend_name() != "postgresql":
        raise argparse.ArgumentTypeError(
            f"must be a PostgreSQL URL (the peer is PostgreSQL-only), got {url.drivername!r}"
        )
    return url.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def parse_args(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.peer",
        description="Us against faststream-outbox, a polling outbox: requests/s, CPU per "
        "request of every process, commit-to-visible latency and the database's cost.",
    )
    parser.add_argument("--quick", action="store_true", help="one level, 0.5 s a side: a smoke run")
    parser.add_argument(
        "--concurrency", type=_levels, help="requests in flight, e.g. 1,16,64 (quick: 4)"
    )
    parser.add_argument(
        "--sides", type=_sides, default=list(SIDES), help=f"of {', '.join(SIDES)} (all)"
    )
    parser.add_argument("--seconds", type=_positive(float), help="of requests a cell (10)")
    parser.add_argument("--warmup", type=_positive(float), help="uncounted seconds a cell (1)")
    parser.add_argument("--value-bytes", type=_positive(int), default=1024)
    parser.add_argument("--partitions", type=_positive(int), default=8)
    parser.add_argument(
        "--peer-workers", type=_positive(int), default=16, help="the relay's max_workers (16)"
    )
    parser.add_argument(
        "--peer-fetch-batch", type=_positive(int), default=10, help="fetch_batch_size (10)"
    )
    parser.add_argument(
        "--peer-flush-batch",
        type=_positive(int),
        default=1,
        help="terminal_flush_batch_size (1: no redelivery window)",
    )
    parser.add_argument(
        "--database-url", type=_database_url, help="PostgreSQL (default: a local one started here)"
    )
    parser.add_argument("--bootstrap-servers", help="use this broker instead of a local one")
    parser.add_argument("--visible-timeout", type=_positive(float), default=60.0)
    parser.add_argument("--json", dest="json_path", type=Path, default=RESULTS_PATH)
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    if args.value_bytes < 32:
        parser.error("--value-bytes must be at least 32 (the event starts with the order id)")
    return Options(
        concurrency=args.concurrency or _levels(str(defaults["concurrency"])),
        sides=args.sides,
        seconds=args.seconds or float(defaults["seconds"]),
        warmup=args.warmup or float(defaults["warmup"]),
        value_bytes=args.value_bytes,
        partitions=args.partitions,
        peer_workers=args.peer_workers,
        peer_fetch_batch=args.peer_fetch_batch,
        peer_flush_batch=args.peer_flush_batch,
        database_url=args.database_url,
        bootstrap_servers=args.bootstrap_servers,
        visible_timeout=args.visible_timeout,
        quick=args.quick,
        json_path=args.json_path,
    )


def main(argv: Sequence[str] | None = None) -> None:
    bench_main(parse_args(argv), run)


if __name__ == "__main__":
    main()
