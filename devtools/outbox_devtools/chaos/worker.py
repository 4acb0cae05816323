"""One producer process of the chaos run: an order service that may be killed at any time.

``python -m outbox_devtools.chaos.worker CONFIG_JSON``. Its threads place orders through
:class:`~outbox.sql.SqlTransactionListener` (PostgreSQL) until the controller
writes ``stop`` on its stdin; it then keeps answering check-backs until stdin
closes, because the checker still needs a live producer of the group to settle
what the killed ones left behind. Every half-second it prints one line,
``SENT <sends> <committed> <rolled back> <other ends> <failed sends> <parked sends>``
(with ``park_when_unavailable`` a send Kafka did not take in time is parked in the
transaction log: counted as sent and parked, never as failed).

``arm-check`` on stdin makes the next check-back it answers print
``CHECKING <transaction id>`` and pause for :data:`CHECK_PAUSE_SECONDS` before
answering, so the controller can SIGKILL it in the middle of an answer
(``disarm-check`` takes that back).

Nothing here is made to survive SIGKILL: that is the point. The database and
the topics, not this process, are the record of what happened.
"""

from __future__ import annotations

import json
import logging
import random
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from outbox.errors import HalfWriteError, KafkaUnavailableError, OutboxError
from outbox.message import EndStatus, LocalTransactionState, Message, SendStatus
from outbox.producer import TransactionProducer
from outbox.settings import ProducerSettings
from outbox.sql import SqlTransactionListener, create_engine

GROUP = "chaos-orders"
ORDERS_TABLE = "chaos_orders"
REPORT_SECONDS = 0.5
CHECK_PAUSE_SECONDS = 5.0
"""Long enough for the controller (a 0.2 s tick) to see the marker and kill during the pause."""

_output = threading.Lock()


def say(line: str) -> None:
    """One whole line to the controller: sender, reporter and check threads all write."""
    with _output:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


log = logging.getLogger("outbox_devtools.chaos.worker")


@dataclass(frozen=True)
class WorkerConfig:
    """What the controller tells a producer process (one JSON argument)."""

    bootstrap_servers: str
    topic_prefix: str
    real_topic: str
    database_url: str
    worker: int
    incarnation: int
    threads: int
    seed: int
    rollback_share: float
    unknown_share: float
    reused_key_share: float
    slow_commit_share: float
    grace_seconds: float
    kafka_properties: dict[str, str]
    park_when_unavailable: bool = False

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> WorkerConfig:
        return cls(**json.loads(text))


def place_order(session: Session, message: Message, order: dict[str, Any]) -> None:
    """The business change; a negative total breaks a business rule and rolls back. A slow
    order's row makes its COMMIT block (the deferred trigger of the orders table)."""
    if order["total"] < 0:
        raise ValueError(f"order {order['id']}: a total cannot be negative")
    session.execute(
        sa.text(f"INSERT INTO {ORDERS_TABLE} (id, total, slow) VALUES (:id, :total, :slow)"),
        {"id": order["id"], "total": order["total"], "slow": order.get("slow", False)},
    )


class ChaosListener(SqlTransactionListener):
    """Commits as the SQL listener does, but answers UNKNOW for some committed orders.

    RocketMQ's own examples do the same: it makes the check-back path carry
    real traffic even in the stretches between faults. Armed, it announces the
    next check it answers and pauses inside it, for the controller to kill.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.armed = threading.Event()

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        if arg.get("orphan"):
            # The half is stored; the process "dies" before its local transaction: no row,
            # no decision. The order is sent again with the same transaction id.
            return LocalTransactionState.UNKNOW
        state = super().execute_local_transaction(message, arg)
        if state is LocalTransactionState.COMMIT_MESSAGE and arg.get("answer_unknown"):
            return LocalTransactionState.UNKNOW
        return state

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        if self.armed.is_set():
            self.armed.clear()
            say(f"CHECKING {message.transaction_id}")
            time.sleep(CHECK_PAUSE_SECONDS)
        return super().check_local_transaction(message)


class Worker:
    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.stop_sending = threading.Event()
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        engine = create_engine(config.database_url, pool_size=config.threads + 2)
        self.listener = ChaosListener(
            sessionmaker(engine), place_order, group=GROUP, grace_seconds=config.grace_seconds
        )
        self.settings = ProducerSettings(
            bootstrap_servers=config.bootstrap_servers,
            topic_prefix=config.topic_prefix,
            kafka_properties=config.kafka_properties,
            start_timeout_seconds=5,
            park_when_unavailable=config.park_when_unavailable,
        )

    def start_producer(self) -> TransactionProducer:
        """Start, waiting out a broker outage: a restarted producer may come up mid-outage."""
        while True:
            try:
                return TransactionProducer(GROUP, self.listener, self.settings).start()
            except KafkaUnavailableError as exc:
                log.warning("broker unavailable at start, retrying: %s", exc)
                time.sleep(1)

    def _count(self, outcome: str) -> None:
        with self._lock:
            self.counts[outcome] += 1

    def send(self, producer: TransactionProducer, thread: int) -> None:
        config = self.config
        rng = random.Random(f"{config.seed}-{config.worker}-{config.incarnation}-{thread}")
        sequence = 0
        while not self.stop_sending.is_set():
            sequence += 1
            order_id = f"{config.worker}-{config.incarnation}-{thread}-{sequence}"
            refused = rng.random() < config.rollback_share
            order = {
                "id": order_id,
                "total": round(rng.uniform(1, 500) * (-1 if refused else 1), 2),
                "answer_unknown": rng.random() < config.unknown_share,
                "slow": rng.random() < config.slow_commit_share,
            }
            reused = rng.random() < config.reused_key_share  # an id of the caller's own
            message = Message(
                config.real_topic,
                json.dumps(order),
                key=order_id,
                transaction_id=order_id if reused else None,
            )
            try:
                if reused:
                    orphan = {**order, "orphan": True}
                    producer.send_message_in_transaction(
                        replace(message, value=json.dumps(orphan)), orphan
                    )
                    self._count("orphaned")
                result = producer.send_message_in_transaction(message, order)
            except HalfWriteError:
                self._count("failed_halves")
                time.sleep(0.2)
                continue
            except OutboxError as exc:
                log.error("send failed: %r", exc)
                self._count("failed_halves")
                time.sleep(0.2)
                continue
            self._count("sent")
            if result.send_status is SendStatus.PARKED:
                self._count("parked")
            if result.end_status in (EndStatus.COMMITTED, EndStatus.PARKED):
                self._count("committed")
            elif result.end_status is EndStatus.ROLLED_BACK:
                self._count("rolled_back")
            else:
                self._count("other")

    def report(self) -> None:
        with self._lock:
            c = self.counts
            line = (
                f"SENT {c['sent']} {c['committed']} {c['rolled_back']} {c['other']} "
                f"{c['failed_halves']} {c['parked']}"
            )
        say(line)

    def run(self) -> None:
        producer = self.start_producer()
        say("READY")
        senders = [
            threading.Thread(target=self.send, args=(producer, n), daemon=True)
            for n in range(self.config.threads)
        ]
        for sender in senders:
            sender.start()
        commands = threading.Thread(target=self._read_commands, daemon=True)
        commands.start()
        while commands.is_alive():
            self.report()
            commands.join(REPORT_SECONDS)
        for sender in senders:
            sender.join()
        self.report()
        producer.shutdown()

    def _read_commands(self) -> None:
        """``stop`` ends the sending; end of input ends the process (after the check-backs)."""
        for line in sys.stdin:
            command = line.strip()
            if command == "stop":
                self.stop_sending.set()
            elif command == "arm-check":
                self.listener.armed.set()
            elif command == "disarm-check":
                self.listener.armed.clear()
        self.stop_sending.set()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    Worker(WorkerConfig.from_json(argv[1])).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
