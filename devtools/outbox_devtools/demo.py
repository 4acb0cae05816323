"""``outbox demo``: the main job, end to end, on embedded defaults.

An order service writes a few hundred orders to SQLite through the SQL
listener and publishes an event for each through the outbox: most commit, some
fail a business rule and roll back, and a few producer processes are killed
between their database commit and their end, so the checker must resolve them
by asking the live producer (check-back). The checker's relay publishes every
commit to the real topic; then the Spark sink lands the events in a Parquet
table, and the demo checks every invariant: each committed order is on the
real topic and in the table exactly once, no rolled-back order is anywhere.

Everything runs locally: a real Kafka broker from the official jars, SQLite,
the checker as its own process, Spark in local mode.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa
from confluent_kafka.admin import AdminClient
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table
from sqlalchemy.orm import sessionmaker

from outbox.admin import TopicSpec, ensure_topics, plan_topics
from outbox.config import kafka_client_config
from outbox.message import EndStatus, Message
from outbox.producer import TransactionProducer
from outbox.protocol import RealRecord, TopicNames
from outbox.reading import read_topic
from outbox.settings import ProducerSettings
from outbox.sql import SqlTransactionListener, create_engine, upgrade
from outbox_cli.console import make_console
from outbox_devtools.demo_crash import GROUP, log_errors_only, place_order
from outbox_devtools.kafka import LocalKafka, ensure_kafka_jars

PREFIX = "demo"
REAL_TOPIC = "demo.orders"
PARTITIONS = 3
ORDERS = 300
CRASHED_PRODUCERS = 4
BAD_ORDER_SHARE = 0.15
SENDERS = 4
SEED = 7


@dataclass
class Outcomes:
    committed: set[str] = field(default_factory=set)
    rolled_back: set[str] = field(default_factory=set)
    resolved_by_check: set[str] = field(default_factory=set)
    left_to_check: dict[str, object] = field(default_factory=dict)
    """Sends the producer did not end itself (e.g. REFUSED_LATE on a loaded
    machine), by transaction id to order id: the check-back ends them from the
    database, so the database says which way each must go."""
    ended_by_check: set[str] = field(default_factory=set)
    """Of those, the ones whose order the database holds: the check-back commits them."""
    other: Counter[str] = field(default_factory=Counter)

    @property
    def all_committed(self) -> set[str]:
        return self.committed | self.resolved_by_check | self.ended_by_check

    def settle_left_to_check(self, engine: sa.Engine) -> None:
        """File each send left to the check-back by whether its order is in the database."""
        if not self.left_to_check:
            return
        with engine.connect() as connection:
            stored = set(connection.execute(sa.text("SELECT id FROM orders")).scalars())
        for transaction_id, order_id in self.left_to_check.items():
            if order_id in stored:
                self.ended_by_check.add(transaction_id)
            else:
                self.rolled_back.add(transaction_id)


def _step(console: Console, text: str) -> None:
    console.print(f"[bold cyan]==>[/] {text}")


def _orders(count: int, seed: int) -> list[dict[str, object]]:
    rng = random.Random(seed)
    return [
        {
            "id": i,
            "total": round(
                -rng.uniform(1, 50) if rng.random() < BAD_ORDER_SHARE else rng.uniform(1, 500), 2
            ),
        }
        for i in range(1, count + 1)
    ]


def prepare_database(url: str) -> None:
    """The demo's database at ``url``: the transaction log (by the migrations) and its orders."""
    upgrade(url)  # the outbox transaction log, by the Alembic migrations
    engine = create_engine(url)
    with engine.begin() as connection:
        connection.execute(sa.text("CREATE TABLE orders (id INTEGER PRIMARY KEY, total REAL)"))
    engine.dispose()


def _start_checker(bootstrap: str, log_path: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "OUTBOX_BOOTSTRAP_SERVERS": bootstrap,
        "OUTBOX_TOPIC_PREFIX": PREFIX,
        "OUTBOX_CHECK_INTERVAL_SECONDS": "1",
        "OUTBOX_TRANSACTION_TIMEOUT_SECONDS": "2",
        # A check a second: the default 15 checks would be spent in the half minute
        # the producer group may take to notice its killed members.
        "OUTBOX_CHECK_MAX": "120",
        "OUTBOX_HTTP_ADDRESS": "",
        "OUTBOX_INSTANCE_ID": "demo-checker",
    }
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "outbox", "checker"], env=env, stdout=log, stderr=log
        )


def _send_orders(
    producer: TransactionProducer,
    orders: list[dict[str, object]],
    outcomes: Outcomes,
    console: Console,
) -> None:
    lock = threading.Lock()
    columns = (TextColumn("    orders"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("orders", total=len(orders))

        def send(order: dict[str, object]) -> None:
            message = Message(
                REAL_TOPIC,
                f'{{"order": {order["id"]}, "total": {order["total"]}}}',
                key=str(order["id"]),
            )
            result = producer.send_message_in_transaction(message, order)
            with lock:
                if result.end_status is EndStatus.COMMITTED:
                    outcomes.committed.add(result.transaction_id)
                elif result.end_status is EndStatus.ROLLED_BACK:
                    outcomes.rolled_back.add(result.transaction_id)
                else:
                    outcomes.left_to_check[result.transaction_id] = order["id"]
                    outcomes.other[result.end_status.name] += 1
                progress.advance(task)

        with ThreadPoolExecutor(SENDERS) as pool:
            list(pool.map(send, orders))


def _crash_producers(
    bootstrap: str, url: str, first_id: int, outcomes: Outcomes, console: Console
) -> None:
    """Producers that commit their order in the database, then die before their end."""
    for n in range(CRASHED_PRODUCERS):
        order_id = first_id + n
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "outbox_devtools.demo_crash",
                bootstrap,
                PREFIX,
                REAL_TOPIC,
                url,
                str(order_id),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert process.stdout is not None
        line = process.stdout.readline().split()
        process.kill()
        process.wait(30)
        if line[:1] != ["DB_COMMITTED"]:
            raise RuntimeError(f"the crashing producer said {line!r}")
        outcomes.resolved_by_check.add(line[1])
        console.print(f"    producer pid {process.pid} killed after committing order {order_id}")


def _events(bootstrap: str) -> Counter[str]:
    records = read_topic(kafka_client_config(bootstrap), REAL_TOPIC, timeout=60)
    return Counter(RealRecord.from_record(r).transaction_id for r in records)


def _wait_for_publication(bootstrap: str, outcomes: Outcomes, console: Console) -> None:
    """Until the relay has published every commit, those resolved by check-back included."""
    deadline = time.monotonic() + 120
    with console.status(
        "    waiting for the checker to resolve the crashed producers' transactions"
        " and its relay to publish every commit"
    ):
        while time.monotonic() < deadline:
            if outcomes.all_committed <= set(_events(bootstrap)):
                return
            time.sleep(1)
    console.print("[red]    the checker did not publish every committed transaction in 120 s[/]")


def _run_sink(bootstrap: str, work: Path, console: Console) -> Counter[str]:
    from spark_sink.job import new_session, run_sink
    from spark_sink.settings import SinkSettings

    settings = SinkSettings(
        bootstrap_servers=bootstrap,
        topics=(REAL_TOPIC,),
        output=str(work / "table"),
        checkpoint=str(work / "checkpoint"),
        once=True,
        master="local[2]",
        shuffle_partitions=2,
    )
    spark = new_session(settings)
    try:
        summary = run_sink(settings, spark, on_progress=lambda b: console.print(f"    {b.line()}"))
        console.print(f"    {summary.line()}")
        rows = spark.read.parquet(settings.output).select("transaction_id").collect()
        return Counter(row.transaction_id for row in rows)
    finally:
        spark.stop()


def _order_service(
    bootstrap: str, url: str, orders: list[dict[str, object]], outcomes: Outcomes, console: Console
) -> None:
    """The order service's part, in a function of its own so that its Kafka clients
    are closed and gone when it returns, before the broker stops (a client left
    alive would keep reconnecting to a broker that is no more)."""
    engine = create_engine(url, connect_args={"check_same_thread": False})
    listener = SqlTransactionListener(
        sessionmaker(engine), place_order, group=GROUP, grace_seconds=30
    )
    settings = ProducerSettings(
        bootstrap_servers=bootstrap, topic_prefix=PREFIX, transaction_timeout_seconds=2
    )
    with TransactionProducer(GROUP, listener, settings) as producer:
        _step(console, f"order service: {len(orders)} orders from {SENDERS} threads")
        _send_orders(producer, orders, outcomes, console)
        outcomes.settle_left_to_check(engine)
        if outcomes.other:
            console.print(
                f"    not ended by the producer, left to the check-back: {dict(outcomes.other)}"
            )
        _step(console, f"{CRASHED_PRODUCERS} producers die between database commit and end")
        _crash_producers(bootstrap, url, len(orders) + 1, outcomes, console)
        _wait_for_publication(bootstrap, outcomes, console)
    engine.dispose()


def run(console: Console, orders: int = ORDERS, seed: int = SEED) -> int:
    started = time.monotonic()
    _step(
        console, "resolving the Kafka broker and Spark connector jars (cached after the first run)"
    )
    ensure_kafka_jars()
    from spark_sink.jars import ensure_spark_kafka_jars

    ensure_spark_kafka_jars()
    outcomes = Outcomes()
    with tempfile.TemporaryDirectory(prefix="outbox-demo-") as tmp, LocalKafka() as kafka:
        work = Path(tmp)
        bootstrap = kafka.bootstrap_servers
        console.print(
            f"    Kafka {bootstrap} up in {kafka.last_start_seconds:.1f}s; work dir {work}"
        )
        url = f"sqlite:///{work / 'orders.db'}"
        _step(console, f"database {url}: migrations, orders table")
        prepare_database(url)
        _step(console, f"topics with prefix {PREFIX!r} ({PARTITIONS} partitions) and {REAL_TOPIC}")
        ensure_topics(
            AdminClient(kafka_client_config(bootstrap)),
            [
                *plan_topics(TopicNames(PREFIX), PARTITIONS, 1, (GROUP,)),
                TopicSpec(REAL_TOPIC, PARTITIONS, 1),
            ],
        )
        _step(console, "starting the checker (its own process)")
        checker = _start_checker(bootstrap, work / "checker.log")
        try:
            _order_service(bootstrap, url, _orders(orders, seed), outcomes, console)
        finally:
            checker.terminate()
            checker.wait(60)
        events = _events(bootstrap)
        _step(console, "Spark sink, once (available-now trigger) into Parquet")
        sink_rows = _run_sink(bootstrap, work, console)
    return _report(console, outcomes, events, sink_rows, time.monotonic() - started)


def _report(
    console: Console,
    outcomes: Outcomes,
    events: Counter[str],
    sink_rows: Counter[str],
    seconds: float,
) -> int:
    table = Table(title=f"outbox demo ({seconds:.0f}s)")
    for column in ("outcome", "transactions", "events on the real topic", "rows in the sink"):
        table.add_column(column, justify="right")

    def row(name: str, ids: set[str]) -> None:
        table.add_row(
            name,
            str(len(ids)),
            str(sum(events[i] for i in ids)),
            str(sum(sink_rows[i] for i in ids)),
        )

    row("committed", outcomes.committed)
    row("rolled back", outcomes.rolled_back)
    row("resolved by check-back", outcomes.resolved_by_check)
    if outcomes.ended_by_check:
        row("committed by check-back", outcomes.ended_by_check)
    console.print(table)
    committed = outcomes.all_committed
    lost = len(committed - set(sink_rows))
    duplicates = sum(sink_rows.values()) - len(sink_rows)
    raw_duplicates = sum(events.values()) - len(events)
    phantom = len(outcomes.rolled_back & set(events)) + len(set(sink_rows) - committed)
    failures = []
    if lost:
        failures.append(f"{lost} committed transactions missing from the sink")
    if duplicates:
        failures.append(f"{duplicates} duplicate rows in the sink")
    if raw_duplicates:
        failures.append(f"{raw_duplicates} events on the real topic beyond one per transaction")
    if phantom:
        failures.append(f"{phantom} rolled-back or unknown transactions visible")
    for failure in failures:
        console.print(f"[red]invariant failed:[/] {failure}")
    console.print(
        f"demo: committed={len(committed)} rolled_back={len(outcomes.rolled_back)} "
        f"resolved_by_check={len(outcomes.resolved_by_check)} sink_rows={sum(sink_rows.values())} "
        f"duplicates={duplicates} lost={lost}",
        highlight=False,
    )
    return 1 if failures else 0


def main() -> None:
    log_errors_only()
    sys.exit(run(make_console()))
