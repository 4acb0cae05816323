"""``make bench-producer``: what a transactional send costs next to a plain one.

Both modes send values of ``--value-bytes`` from N threads, each sending
synchronously (send, then wait for its own acknowledgement), because that is
what RocketMQ's sync ``send`` and ``sendMessageInTransaction`` do and what a
service thread handling a request experiences:

* **plain**: one shared idempotent ``acks=all`` confluent-kafka producer with a
  poll thread serving the delivery reports, configured like
  :mod:`outbox.acked_writer` (``linger.ms=1``), so the comparison measures the
  outbox's extra work and not a different client setup;
* **outbox**: one shared :class:`~outbox.producer.TransactionProducer` whose
  local transaction commits at once;
* **async**: one :class:`~outbox.async_producer.AsyncTransactionProducer` on an
  event loop, N tasks on that loop sending back to back (the same no-op local
  transaction, as a coroutine), as an asyncio service's request handlers send.
  (Until 2026-11-24 N threads each handed their send to the loop and waited for
  it; that hand-over, a ``concurrent.futures.Future`` per send, was about half
  the process's CPU in these cells and is no part of the producer.)

A transactional send writes two records and waits for each (the half, then
the decision op; the checker's relay publishes the real record later), so an
outbox/plain throughput ratio of 1/2 is what its two acknowledged writes
allow; the goal is to reach it at 64 senders.

Each cell runs a warm-up (connections, metadata, first batches; not counted)
and then a fixed measuring window; a send counts when it completes inside the
window. The end latency of an outbox send is the time from the local
transaction's answer to ``send_message_in_transaction`` returning, i.e. the
wait for the decision op's acknowledgement. (RocketMQ sends its end oneway; the
outbox confirms it by default, so the end is part of every send;
``--end-oneway`` measures the other way.)

Each cell also records the CPU used by this process, by the broker, and by
everything else on the host: on a shared machine the last one explains noisy
numbers, and the run says so when it was high.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import os
import platform
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import confluent_kafka
from confluent_kafka.admin import AdminClient
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
from bench.producer_table import PLAIN_MODES, CellResult, Options, cell_line, results_table
from bench.relay import drain_relay
from outbox.acked_writer import AckedWriter
from outbox.admin import TopicSpec, ensure_topics, plan_topics
from outbox.async_producer import AsyncTransactionProducer
from outbox.config import kafka_client_config
from outbox.errors import HalfWriteError
from outbox.message import EndStatus, LocalTransactionState, Message, TransactionSendResult
from outbox.producer import TransactionProducer
from outbox.protocol import OutgoingRecord, TopicNames
from outbox.reading import read_topic
from outbox.settings import ProducerSettings
from outbox_devtools.kafka import KAFKA_VERSION

PREFIX = "bench"
GROUP = "bench-producer"
REAL_TOPIC = "bench.events"
# Plain sends get a topic of their own, so the records on bench.events are
# exactly the outbox's commits and can be counted to verify them.
PLAIN_TOPIC = "bench.plain"
RESULTS_PATH = Path(__file__).resolve().parent / "results" / "producer.json"
SEND_TIMEOUT_SECONDS = 30.0
MODES = ("plain", "pair", "outbox", "async")
_T = TypeVar("_T")

SendFn = Callable[[int, int], float | None]
"""Send message ``seq`` of sender ``index``; return when its local transaction answered."""


# --------------------------------------------------------------------------- senders


class PlainSender:
    """Plain sync sends (idempotent, acks=all) through the outbox's own half writer.

    The half writer is exactly "one shared idempotent producer, each caller
    waiting for its own ack": the plain baseline, and the outbox's first step,
    so any gap between the two modes is the outbox's extra work, not a
    differently tuned client.
    """

    def __init__(self, bootstrap: str, topic: str, value: bytes) -> None:
        self.topic = topic
        self.value = value
        self.writer = AckedWriter(kafka_client_config(bootstrap))

    def send(self, index: int, seq: int) -> float | None:
        key = f"{index}:{seq}".encode()
        self.writer.write(
            OutgoingRecord(self.topic, key, self.value), SEND_TIMEOUT_SECONDS, HalfWriteError
        )
        return None

    def close(self) -> None:
        self.writer.close(10)


class PairSender(PlainSender):
    """Two plain sends in a row, each waiting for its acknowledgement: the protocol's floor.

    A transactional send writes two records and waits for each (the half, then
    the decision). With nothing else, what the threads would cost is this; the
    outbox's distance from it, in the same run, is its own work (building and
    checking the records, the flow, the listener), apart from what two
    acknowledged writes cost on this machine.
    """

    def send(self, index: int, seq: int) -> float | None:
        super().send(index, seq)
        return super().send(index, seq)


class CommitAtOnce:
    """A local transaction with no work: commits, and notes when it answered.

    The timestamp is per thread because each sender thread runs its own local
    transaction inside ``send_message_in_transaction``.
    """

    def __init__(self) -> None:
        self._local = threading.local()

    def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        self._local.answered = time.perf_counter()
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE

    def answered_at(self) -> float:
        return float(self._local.answered)


class OutboxSender:
    """Transactional sends through one shared :class:`TransactionProducer`."""

    def __init__(self, settings: ProducerSettings, value: bytes, senders: int) -> None:
        self.value = value
        self.start(settings)
        # One counter per sender thread: no lock on the hot path.
        self.committed = [0] * senders
        self.not_committed: dict[str, int] = {}
        self._lock = threading.Lock()

    def start(self, settings: ProducerSettings) -> None:
        self.listener = CommitAtOnce()
        self.producer = TransactionProducer(GROUP, self.listener, settings).start()

    def send_one(self, message: Message) -> tuple[TransactionSendResult, float]:
        """The result, and when the local transaction answered."""
        return self.producer.send_message_in_transaction(message), self.listener.answered_at()

    def send(self, index: int, seq: int) -> float | None:
        message = Message(topic=REAL_TOPIC, value=self.value, key=f"{index}:{seq}".encode())
        result, answered = self.send_one(message)
        self._count(index, result)
        return answered

    def _count(self, index: int, result: TransactionSendResult) -> None:
        if result.end_status is EndStatus.COMMITTED:
            self.committed[index] += 1
        else:
            with self._lock:
                status = result.end_status.value
                self.not_committed[status] = self.not_committed.get(status, 0) + 1

    def close(self) -> None:
        self.producer.shutdown()


_answered: ContextVar[float] = ContextVar("bench_answered")


class AwaitedCommitAtOnce:
    """:class:`CommitAtOnce` as coroutines; the time is kept per task (all share one thread)."""

    async def execute_local_transaction(self, message: Message, arg: Any) -> LocalTransactionState:
        _answered.set(time.perf_counter())
        return LocalTransactionState.COMMIT_MESSAGE

    async def check_local_transaction(self, message: Message) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE


class AsyncOutboxSender(OutboxSender):
    """Transactional sends through one :class:`AsyncTransactionProducer`, on its own loop."""

    def start(self, settings: ProducerSettings) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="bench-loop")
        self._thread.start()
        self.producer = AsyncTransactionProducer(GROUP, AwaitedCommitAtOnce(), settings)
        self._on_loop(self.producer.start())

    def _on_loop(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    async def _send(self, message: Message) -> tuple[TransactionSendResult, float]:
        result = await self.producer.send_message_in_transaction(message)
        return result, _answered.get()

    def send_one(self, message: Message) -> tuple[TransactionSendResult, float]:
        return self._on_loop(self._send(message))

    async def send_async(self, index: int, seq: int) -> float | None:
        """:meth:`send` for a task on the producer's loop: awaited, no thread hands it over."""
        message = Message(topic=REAL_TOPIC, value=self.value, key=f"{index}:{seq}".encode())
        result, answered = await self._send(message)
        self._count(index, result)
        return answered

    def close(self) -> None:
        self._on_loop(self.producer.shutdown())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


# --------------------------------------------------------------------------- running a cell


@dataclass
class CellRun:
    """What :func:`run_cell` saw, before it is reduced to a :class:`CellResult`."""

    samples: list[tuple[float, float, float | None]]
    """(completed at, send seconds, local transaction answered at) per send."""
    window_start: float
    window_end: float
    attempts: int
    errors: list[BaseException]
    client_cpu_pct: float | None
    broker_cpu_pct: float | None
    other_cpu_pct: float | None
    client_cpu_seconds: float | None


def run_cell(
    send: SendFn,
    senders: int,
    warmup: float,
    seconds: float,
    broker_pid: int | None,
    *,
    tasks_on: AsyncOutboxSender | None = None,
) -> CellRun:
    """Run ``senders`` threads calling ``send`` back to back; time the measuring window.

    With ``tasks_on``, the senders are tasks on that sender's loop awaiting its
    :meth:`~AsyncOutboxSender.send_async` instead, as an asyncio service's
    request handlers send.
    """
    stop = threading.Event()
    start = threading.Barrier(senders + 1)
    samples: list[list[tuple[float, float, float | None]]] = [[] for _ in range(senders)]
    attempts = [0] * senders
    errors: list[list[BaseException]] = [[] for _ in range(senders)]

    def counted(index: int, begun: float, outcome: float | Exception | None) -> bool:
        """Note one send of sender ``index``: its outcome is when its local transaction
        answered, or what it raised (then False: the sender pauses, not to spin on a
        broken broker)."""
        attempts[index] += 1
        if isinstance(outcome, Exception):
            errors[index].append(outcome)
            return False
        done = time.perf_counter()
        samples[index].append((done, done - begun, outcome))
        return True

    def loop(index: int) -> None:
        start.wait()
        seq = 0
        while not stop.is_set():
            seq += 1
            begun = time.perf_counter()
            try:
                outcome: float | Exception | None = send(index, seq)
            except Exception as exc:
                outcome = exc
            if not counted(index, begun, outcome):
                time.sleep(0.01)

    async def task(index: int) -> None:
        assert tasks_on is not None
        for seq in itertools.count(1):
            if stop.is_set():
                return
            begun = time.perf_counter()
            try:
                outcome: float | Exception | None = await tasks_on.send_async(index, seq)
            except Exception as exc:
                outcome = exc
            if not counted(index, begun, outcome):
                await asyncio.sleep(0.01)

    async def tasks() -> None:
        await asyncio.gather(*(task(i) for i in range(senders)))

    threads: list[threading.Thread] = []
    if tasks_on is None:
        threads = [
            threading.Thread(target=loop, args=(i,), name=f"bench-sender-{i}", daemon=True)
            for i in range(senders)
        ]
        for thread in threads:
            thread.start()
        start.wait()
    else:
        running = asyncio.run_coroutine_threadsafe(tasks(), tasks_on.loop)
    window_start = time.perf_counter() + warmup
    window_end = window_start + seconds
    time.sleep(warmup)
    wall_before = time.perf_counter()
    client_before = process_cpu_seconds(None)
    broker_before = process_cpu_seconds(broker_pid) if broker_pid else None
    host_before = host_cpu_seconds()
    time.sleep(max(0.0, window_end - time.perf_counter()))
    wall = time.perf_counter() - wall_before
    client_after = process_cpu_seconds(None)
    broker_after = process_cpu_seconds(broker_pid) if broker_pid else None
    host_after = host_cpu_seconds()
    stop.set()
    for thread in threads:
        thread.join(SEND_TIMEOUT_SECONDS * 2 + 5)
    if tasks_on is not None:
        running.result(SEND_TIMEOUT_SECONDS * 2 + 5)

    def pct(before: float | None, after: float | None) -> float | None:
        if before is None or after is None:
            return None
        return round(100 * (after - before) / wall, 1)

    return CellRun(
        samples=[sample for mine in samples for sample in mine],
        window_start=window_start,
        window_end=window_end,
        attempts=sum(attempts),
        errors=[exc for mine in errors for exc in mine],
        client_cpu_pct=pct(client_before, client_after),
        broker_cpu_pct=pct(broker_before, broker_after),
        other_cpu_pct=_other(
            pct(host_before, host_after),
            pct(client_before, client_after),
            pct(broker_before, broker_after),
        ),
        client_cpu_seconds=_spent(client_before, client_after),
    )


def _spent(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before


def _other(host: float | None, client: float | None, broker: float | None) -> float | None:
    """Host CPU not spent by this bench or its broker: other tenants' noise."""
    if host is None or client is None:
        return None
    return round(max(0.0, host - client - (broker or 0.0)), 1)


def summarise(mode: str, senders: int, run: CellRun, seconds: float) -> CellResult:
    """Throughput and latencies of the sends that completed inside the window."""
    inside = [s for s in run.samples if run.window_start <= s[0] < run.window_end]
    sends = [s[1] for s in inside]
    ends = [done - answered for done, _, answered in inside if answered is not None]
    halves = [answered - (done - took) for done, took, answered in inside if answered is not None]
    return CellResult(
        mode=mode,
        senders=senders,
        window_seconds=seconds,
        messages=len(inside),
        msgs_per_s=round(len(inside) / seconds, 1),
        send_p50_ms=percentile_ms(sends, 50),
        send_p99_ms=percentile_ms(sends, 99),
        end_p50_ms=percentile_ms(ends, 50),
        end_p99_ms=percentile_ms(ends, 99),
        half_p50_ms=percentile_ms(halves, 50),
        half_p99_ms=percentile_ms(halves, 99),
        attempts=run.attempts,
        errors=len(run.errors),
        first_error=repr(run.errors[0]) if run.errors else None,
        client_cpu_pct=run.client_cpu_pct,
        broker_cpu_pct=run.broker_cpu_pct,
        other_cpu_pct=run.other_cpu_pct,
        client_us_per_send=_per_send_us(run.client_cpu_seconds, len(inside)),
    )


def _per_send_us(cpu_seconds: float | None, sends: int) -> float | None:
    """CPU seconds over ``sends``, in µs a send (None when nothing completed)."""
    if cpu_seconds is None or not sends:
        return None
    return round(cpu_seconds * 1e6 / sends, 1)


# --------------------------------------------------------------------------- the bench


@dataclass
class Report:
    """What :func:`measure` found, for the command line and for ``bench.all`` alike."""

    results: list[CellResult]
    summary: dict[str, Any]
    """The headline numbers (see :func:`_summary`)."""
    document: dict[str, Any]
    """Everything, as written to the JSON."""
    ok: bool
    """Every outbox send committed, the records read back match, no send failed."""
    other_cpu_pct: float
    """The most CPU other processes used during a cell: the noise in these numbers."""

    def at(self, senders: int) -> tuple[CellResult | None, CellResult | None, float | None]:
        """The plain and outbox cells at ``senders`` senders, and their ratio."""
        plain, outbox = _pair_of(self.results, senders)
        return plain, outbox, _ratio(plain, outbox)

    def floor_at(self, senders: int) -> tuple[CellResult | None, float | None]:
        """The two-plain-writes cell at ``senders`` senders, and its ratio to plain sends."""
        floor = _cell(self.results, "pair", senders)
        return floor, _ratio(_cell(self.results, "plain", senders), floor)

    def async_at(self, senders: int) -> tuple[CellResult | None, float | None]:
        """The async cell at ``senders`` concurrent tasks, and its ratio to plain sends."""
        awaited = _cell(self.results, "async", senders)
        return awaited, _ratio(_cell(self.results, "plain", senders), awaited)


def _run_cells(
    console: Console, options: Options, bootstrap: str, broker_pid: int | None
) -> tuple[list[CellResult], bool]:
    """Every (senders, mode) cell in turn; whether every outbox send committed."""
    value = os.urandom(options.value_bytes)
    settings = ProducerSettings(
        bootstrap_servers=bootstrap, topic_prefix=PREFIX, **options.producer_overrides
    )
    results: list[CellResult] = []
    all_committed = True
    total = len(options.senders) * len(options.modes)
    number = 0
    for senders in options.senders:
        for mode in options.modes:
            number += 1
            console.print(
                f"[bold cyan]==>[/] [{number}/{total}] {mode} senders={senders}: "
                f"warm-up {options.warmup:g}s, measuring {options.seconds:g}s",
                highlight=False,
            )
            if mode in PLAIN_MODES:
                result = _plain_cell(options, bootstrap, broker_pid, value, senders, mode)
            else:
                sender = AsyncOutboxSender if mode == "async" else OutboxSender
                result = _outbox_cell(options, settings, broker_pid, value, senders, sender)
                ok = result.committed == result.attempts and not result.errors
                all_committed &= ok
                verdict = "[green]ok[/]" if ok else "[red]MISMATCH[/]"
                console.print(
                    f"    verify: COMMITTED results {result.committed:,} of "
                    f"{result.attempts:,} sends {verdict}",
                    highlight=False,
                )
            results.append(result)
            console.print(cell_line(result), highlight=False)
            # A closed TransactionProducer sits in reference cycles: collect it now, so its
            # Kafka clients neither poll the broker during the next cells nor outlive it.
            gc.collect()
    return results, all_committed


def _plain_cell(
    options: Options,
    bootstrap: str,
    broker_pid: int | None,
    value: bytes,
    senders: int,
    mode: str,
) -> CellResult:
    plain = (PairSender if mode == "pair" else PlainSender)(bootstrap, PLAIN_TOPIC, value)
    try:
        run = run_cell(plain.send, senders, options.warmup, options.seconds, broker_pid)
    finally:
        plain.close()
    return summarise(mode, senders, run, options.seconds)


def _outbox_cell(
    options: Options,
    settings: ProducerSettings,
    broker_pid: int | None,
    value: bytes,
    senders: int,
    sender: type[OutboxSender],
) -> CellResult:
    outbox = sender(settings, value, senders)
    try:
        tasks_on = outbox if isinstance(outbox, AsyncOutboxSender) else None
        run = run_cell(
            outbox.send, senders, options.warmup, options.seconds, broker_pid, tasks_on=tasks_on
        )
    finally:
        outbox.close()
    mode = "async" if isinstance(outbox, AsyncOutboxSender) else "outbox"
    result = summarise(mode, senders, run, options.seconds)
    result.committed = sum(outbox.committed)
    result.not_committed = dict(outbox.not_committed)
    return result


def _count_committed_reals(bootstrap: str) -> int:
    """Records a ``read_committed`` consumer sees on the real topic: what downstream gets."""
    return len(read_topic(kafka_client_config(bootstrap), REAL_TOPIC, timeout=180))


def run(console: Console, options: Options) -> int:
    """Start (or use) a broker, create the topics, run every cell, report and save."""
    return run_on_broker(console, options, _run_against)


def _run_against(console: Console, options: Options, bootstrap: str, broker_pid: int | None) -> int:
    report = measure(console, options, bootstrap, broker_pid)
    summary = report.summary
    print_last_line(
        console,
        f"bench-producer: ratio_at_{summary['senders']}={figure(summary['ratio'], '.3f')} "
        f"outbox_msgs_per_s_at_{summary['senders']}={figure(summary['outbox_msgs_per_s'], '.0f')} "
        f"plain_msgs_per_s_at_{summary['senders']}={figure(summary['plain_msgs_per_s'], '.0f')} "
        f"end_p99_ms={figure(summary['end_p99_ms'], '.1f')} "
        f"async_ratio_at_{summary['senders']}={figure(summary['async_ratio'], '.3f')} "
        f"client_us_per_send={figure(summary['client_us_per_send'], '.1f')} "
        f"plain_client_us_per_send={figure(summary['plain_client_us_per_send'], '.1f')} "
        f"pair_ratio_at_{summary['senders']}={figure(summary['pair_ratio'], '.3f')} "
        f"pair_client_us_per_send={figure(summary['pair_client_us_per_send'], '.1f')}",
    )
    return 0 if report.ok else 1


def measure(console: Console, options: Options, bootstrap: str, broker_pid: int | None) -> Report:
    """Create the topics, run every cell on ``bootstrap``, verify; print the table, save.

    ``broker_pid`` (a local broker's) lets each cell report the broker's CPU.
    """
    began = time.monotonic()
    specs = [
        *plan_topics(TopicNames(PREFIX), options.partitions, 1, (GROUP,)),
        TopicSpec(REAL_TOPIC, options.partitions, 1),
        TopicSpec(PLAIN_TOPIC, options.partitions, 1),
    ]
    created = ensure_topics(AdminClient(kafka_client_config(bootstrap)), specs)
    console.print(
        f"[bold cyan]==>[/] topics ready ({options.partitions} partitions): "
        f"{', '.join(s.name for s in specs)}",
        highlight=False,
    )
    # A fresh broker's transaction coordinator may still be loading: one acknowledged
    # idempotent write first, so that the first cell does not time the broker's start.
    primer = PlainSender(bootstrap, PLAIN_TOPIC, b"")
    try:
        primer.send(0, 0)
    finally:
        primer.close()
    # A topic created just now is empty, and its leader may not answer offset requests yet.
    fresh = created[REAL_TOPIC] or not options.verify_read
    before = 0 if fresh else _count_committed_reals(bootstrap)
    results, all_committed = _run_cells(console, options, bootstrap, broker_pid)

    read_ok: bool | None = None
    verification: dict[str, Any] = {"committed_results_match_sends": all_committed}
    if options.verify_read and set(options.modes) - set(PLAIN_MODES):
        expected = sum(r.committed or 0 for r in results if r.mode not in PLAIN_MODES)
        console.print(f"[bold cyan]==>[/] reading {REAL_TOPIC} back", highlight=False)
        found = _count_committed_reals(bootstrap) - before
        if found < expected:
            # Producers that only decide leave publishing to the checker's relay.
            console.print("    fewer than committed: relaying the decisions", highlight=False)
            drain_relay(bootstrap, TopicNames(PREFIX))
            found = _count_committed_reals(bootstrap) - before
        read_ok = found == expected
        verdict = "[green]ok[/]" if read_ok else "[red]MISMATCH[/]"
        console.print(
            f"    verify: {found:,} committed records on {REAL_TOPIC}, "
            f"{expected:,} expected {verdict}",
            highlight=False,
        )
        verification.update(real_records_expected=expected, real_records_found=found)
    verification["real_records_match"] = read_ok

    busiest = max((r.other_cpu_pct or 0.0 for r in results), default=0.0)
    warn_if_noisy(console, busiest, "the cells")
    console.print(results_table(results, options))
    summary = _summary(results, options)
    document = _document(
        options, bootstrap, results, verification, summary, time.monotonic() - began
    )
    save_results(console, options.json_path, document)
    failed = not all_committed or read_ok is False or any(r.errors for r in results)
    return Report(results, summary, document, ok=not failed, other_cpu_pct=busiest)


def _cell(results: list[CellResult], mode: str, senders: int) -> CellResult | None:
    return next((r for r in results if r.mode == mode and r.senders == senders), None)


def _pair_of(results: list[CellResult], senders: int) -> tuple[CellResult | None, ...]:
    """The (plain, outbox) cells measured with ``senders`` senders, if they ran."""
    return _cell(results, "plain", senders), _cell(results, "outbox", senders)


def _ratio(plain: CellResult | None, outbox: CellResult | None) -> float | None:
    return outbox.ratio_to(plain) if outbox else None


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _summary(results: list[CellResult], options: Options) -> dict[str, Any]:
    """The headline numbers: at 64 senders, or the most senders measured."""
    senders = 64 if 64 in options.senders else max(options.senders)
    plain, outbox = _pair_of(results, senders)
    awaited = _cell(results, "async", senders)
    floor = _cell(results, "pair", senders)
    outbox_us = outbox.client_us_per_send if outbox else None
    plain_us = plain.client_us_per_send if plain else None
    floor_us = floor.client_us_per_send if floor else None
    return {
        "senders": senders,
        "ratio": _rounded(_ratio(plain, outbox)),
        "async_ratio": _rounded(_ratio(plain, awaited)),
        "async_msgs_per_s": awaited.msgs_per_s if awaited else None,
        "outbox_msgs_per_s": outbox.msgs_per_s if outbox else None,
        "plain_msgs_per_s": plain.msgs_per_s if plain else None,
        "end_p99_ms": outbox.end_p99_ms if outbox else None,
        "write_amplification_limit": 0.5,
        "client_us_per_send": outbox_us,
        "plain_client_us_per_send": plain_us,
        "async_client_us_per_send": awaited.client_us_per_send if awaited else None,
        "client_us_ratio": _rounded(outbox_us / plain_us) if outbox_us and plain_us else None,
        "pair_ratio": _rounded(_ratio(plain, floor)),
        "pair_client_us_per_send": floor_us,
        "pair_client_us_ratio": _rounded(floor_us / plain_us) if floor_us and plain_us else None,
    }


def _document(
    options: Options,
    bootstrap: str,
    results: list[CellResult],
    verification: dict[str, Any],
    summary: dict[str, Any],
    elapsed: float,
) -> dict[str, Any]:
    return {
        "bench": "producer",
        "created_unix": round(time.time(), 3),
        "elapsed_seconds": round(elapsed, 1),
        "config": {
            "senders": options.senders,
            "seconds_per_cell": options.seconds,
            "warmup_seconds": options.warmup,
            "value_bytes": options.value_bytes,
            "partitions": options.partitions,
            "modes": options.modes,
            "producer_overrides": options.producer_overrides,
            "local_broker": options.bootstrap_servers is None,
            "bootstrap_servers": bootstrap,
        },
        "environment": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "confluent_kafka": confluent_kafka.version()[0],
            "librdkafka": confluent_kafka.libversion()[0],
            "kafka": KAFKA_VERSION,
        },
        "cells": [asdict(r) for r in results],
        "ratios": {str(n): _rounded(_ratio(*_pair_of(results, n))) for n in options.senders},
        "async_ratios": {
            str(n): _rounded(_ratio(_cell(results, "plain", n), _cell(results, "async", n)))
            for n in options.senders
        },
        "verification": verification,
        "summary": summary,
    }


def _positive_ints(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _modes(text: str) -> list[str]:
    modes = [part.strip() for part in text.split(",") if part.strip()]
    if not modes or any(m not in MODES for m in modes):
        raise argparse.ArgumentTypeError(f"modes are some of {', '.join(MODES)}, got {text!r}")
    return modes


def parse_args(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.producer",
        description="Send throughput: plain confluent-kafka vs the transactional outbox "
        "(threads, and asyncio tasks).",
    )
    parser.add_argument("--senders", type=_positive_ints, default=[1, 16, 64])
    parser.add_argument("--seconds", type=float, default=10.0, help="measuring window per cell")
    parser.add_argument("--warmup", type=float, default=2.0, help="uncounted seconds per cell")
    parser.add_argument("--value-bytes", type=int, default=1024)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--modes", type=_modes, default=list(MODES))
    parser.add_argument(
        "--bootstrap-servers",
        help="use this broker instead of starting a local one (topics are created if missing)",
    )
    parser.add_argument(
        "--no-verify-read",
        dest="verify_read",
        action="store_false",
        help=f"skip counting the committed records on {REAL_TOPIC}",
    )
    parser.add_argument("--json", dest="json_path", type=Path, default=RESULTS_PATH)
    parser.add_argument(
        "--end-oneway", action="store_true", help="ProducerSettings override: end_oneway=true"
    )
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.warmup < 0 or args.value_bytes < 1 or args.partitions < 1:
        parser.error("--seconds, --value-bytes and --partitions must be positive")
    overrides = {"end_oneway": True} if args.end_oneway else {}
    return Options(
        senders=args.senders,
        seconds=args.seconds,
        warmup=args.warmup,
        value_bytes=args.value_bytes,
        partitions=args.partitions,
        modes=args.modes,
        bootstrap_servers=args.bootstrap_servers,
        verify_read=args.verify_read,
        json_path=args.json_path,
        producer_overrides=overrides,
    )


def main(argv: Sequence[str] | None = None) -> None:
    bench_main(parse_args(argv), run)


if __name__ == "__main__":
    main()
