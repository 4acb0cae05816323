"""The discard-and-resume cycle: halves the checker gives up on, put back, given up on again.

A few orders go through a producer group of their own (:data:`MUTE_GROUP`) whose
producer leaves every decision unknown and then goes away, so nobody answers
its check-backs: at ``check_max`` the checker discards them. The cycle puts
them back with the real ``outbox discard resume`` while still nobody answers
(so they are discarded a second time), then brings up a producer of that group
that answers from the transaction log and resumes them again. Each committed
order must then be published exactly once, and each refused one never, like
every other order of the run. What it exercises: discards, resumes of halves
resumed before, and the relay's first-decision rule across both.

The producer-answering mode only: with ``--resolve-from-db`` the checker answers
every half from the log itself and discards nothing.
"""

from __future__ import annotations

import json
import logging
import queue
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import sessionmaker

from outbox.config import kafka_client_config
from outbox.errors import KafkaUnavailableError, OutboxError
from outbox.message import LocalTransactionState, Message
from outbox.producer import TransactionProducer
from outbox.protocol import TopicNames
from outbox.settings import ProducerSettings
from outbox.sql import SqlTransactionListener, create_engine
from outbox_checker.discard import read_discards
from outbox_devtools.chaos.worker import place_order

log = logging.getLogger(__name__)

MUTE_GROUP = "chaos-mute"
"""The producer group of the cycle's orders: nobody answers for it until the last resume."""
ORDERS_PER_CYCLE = 6
REFUSED_EVERY = 3
"""Every third order of a cycle breaks a business rule: its half must never be published."""
LOOK_EVERY_SECONDS = 2.0
"""How often the discard topic is read while a cycle waits (the controller ticks at 0.2 s)."""
DISCARD_WAIT_SECONDS = 300.0
"""check_max (15) checks, each once a put-back copy is past the transaction timeout: about
100 s on one broker; on three, under a rolling restart, more than 180 s was seen."""


class _LostDecisions(SqlTransactionListener):
    """Runs the local transaction as the SQL listener does, then loses the decision."""

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        super().execute_local_transaction(message, arg)
        return LocalTransactionState.UNKNOW


@dataclass
class DiscardCycle:
    """One cycle, run in a thread of its own (reads of the discard topic block while a
    broker is away; the controller's loop must not), until :attr:`done`."""

    index: int
    bootstrap: str
    prefix: str
    real_topic: str
    database_url: str
    grace_seconds: float
    kafka_properties: dict[str, str]
    answering: list[TransactionProducer] = field(default_factory=list)
    """Where the producer that answers at the end goes (the controller closes it)."""
    transaction_ids: list[str] = field(default_factory=list)
    resumes: int = 0
    """``outbox discard resume`` runs that put the cycle's halves back."""
    discards_seen: int = 0
    """Discard records of the cycle's halves (two per half when the cycle ran whole)."""
    shortfall: str | None = None
    """Why the cycle went on without all its discards (a wait ran out); None: it did not."""
    news: queue.Queue[str] = field(default_factory=queue.Queue)
    """What it did, for the controller to print."""
    _thread: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    @property
    def done(self) -> bool:
        return self._thread is not None and not self._thread.is_alive()

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._run, name=f"discard-cycle-{self.index}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Give up waiting (the run is ending): the thread returns at its next look."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(DISCARD_WAIT_SECONDS)

    def describe(self) -> str:
        """How far it went, for the fault table."""
        went = f"{self.discards_seen} discards, {self.resumes} resumes"
        return f"{went}; {self.shortfall}" if self.shortfall else went

    def _run(self) -> None:
        try:
            self._send()
            if not self.transaction_ids:
                self.shortfall = "no order could be sent"
                return
            self.news.put(
                f"sent {len(self.transaction_ids)} orders of group {MUTE_GROUP} with their "
                "decisions lost; nobody answers for it"
            )
            found = self._wait_for_discards("the first discards")
            self._resume()
            self.news.put(f"resumed {found} discarded halves of {MUTE_GROUP} (nobody answers)")
            found = self._wait_for_discards("the second discards")
            self.answering.append(self._answering_producer())
            self._resume()
            self.news.put(f"resumed {found} halves of {MUTE_GROUP} again, a producer answering")
        except Exception as exc:  # a tool's thread: say why it stopped, never hang the run
            log.exception("discard cycle %d stopped", self.index)
            self.shortfall = f"stopped: {exc}"

    def _send(self) -> None:
        """Send the cycle's orders with their decisions lost; nobody of the group stays up.

        An order whose half cannot be written (a broker away) is left out: it has
        no local transaction, so nothing of it may be published either way.
        """
        producer = TransactionProducer(MUTE_GROUP, self._listener(_LostDecisions), self._settings())
        while True:
            try:
                producer.start()
                break
            except KafkaUnavailableError:  # the broker away: a supervisor would start it again
                if self._stop.wait(1):
                    return
        try:
            for n in range(ORDERS_PER_CYCLE):
                order_id = f"mute-{self.index}-{n}"
                total = -1.0 if n % REFUSED_EVERY == REFUSED_EVERY - 1 else 10.0 + n
                order = {"id": order_id, "total": total}
                message = Message(self.real_topic, json.dumps(order), key=order_id)
                try:
                    result = producer.send_message_in_transaction(message, order)
                except OutboxError as exc:  # said in the run's output, not over its progress
                    self.news.put(f"order {order_id} of {MUTE_GROUP} not sent: {exc}")
                    continue
                self.transaction_ids.append(result.transaction_id)
        finally:
            producer.shutdown()

    def _wait_for_discards(self, what: str) -> int:
        """Until every half of the cycle has a discard not yet resumed (or the wait runs out)."""
        deadline = time.monotonic() + DISCARD_WAIT_SECONDS
        found = 0
        while not self._stop.is_set():
            try:
                found = len(self._unresumed_discards())
            except OutboxError as exc:  # the broker away: look again
                log.info("discard cycle %d: reading discards: %s", self.index, exc)
            if found == len(self.transaction_ids):
                return found
            if time.monotonic() > deadline:
                break
            self._stop.wait(LOOK_EVERY_SECONDS)
        self.shortfall = f"{found} of {len(self.transaction_ids)} in {what}"
        return found

    def _unresumed_discards(self) -> set[str]:
        """The cycle's transaction ids with a discard not yet resumed; counts every discard."""
        mine = set(self.transaction_ids)
        client = kafka_client_config(self.bootstrap)
        discards = [
            d
            for d in read_discards(client, TopicNames(self.prefix), timeout=10)
            if d.transaction_id in mine
        ]
        self.discards_seen = len(discards)
        return {d.transaction_id for d in discards if d.resumed is None}

    def _resume(self) -> None:
        """The operator's command, as an operator runs it."""
        command = [
            sys.executable,
            "-m",
            "outbox",
            "discard",
            "resume",
            *self.transaction_ids,
            f"--bootstrap-servers={self.bootstrap}",
            f"--topic-prefix={self.prefix}",
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=180)
        self.resumes += 1
        if done.returncode not in (0, 1):  # 1: some id had nothing to resume (said above)
            raise RuntimeError(f"outbox discard resume failed: {done.stderr.strip()}")
        log.info("discard resume: %s", done.stdout.strip())

    def _answering_producer(self) -> TransactionProducer:
        """A producer of the group answering check-backs from the log, as a restarted one would."""
        return TransactionProducer(
            MUTE_GROUP, self._listener(SqlTransactionListener), self._settings()
        ).start()

    def _listener(self, kind: type[SqlTransactionListener]) -> SqlTransactionListener:
        engine = create_engine(self.database_url, pool_size=2)
        return kind(
            sessionmaker(engine), place_order, group=MUTE_GROUP, grace_seconds=self.grace_seconds
        )

    def _settings(self) -> ProducerSettings:
        return ProducerSettings(
            bootstrap_servers=self.bootstrap,
            topic_prefix=self.prefix,
            kafka_properties=self.kafka_properties,
        )
