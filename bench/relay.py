"""``python -m bench.relay``: commits/s the relay publishes from ONE half partition.

The relay (:mod:`outbox_checker.relay`) is the one publisher of real records: each
commit decision costs a half lookup, a decode and a transactional produce. To
time that alone, N halves and one COMMIT op each are written first (topics of
one partition, as the producer and a check answer write them), then an
in-process :class:`outbox_checker.relay.Relay` is pumped from its first decision to the
last real record committed. Afterwards the real topic must hold exactly N
records: a relay that drops or doubles a commit fails the bench, whatever its
speed. ``--profile`` runs the relay under cProfile and prints the top of it.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from rich.console import Console

from bench.checker import GROUP, CpuWindow, drop_topics, fresh_topics
from bench.common import bench_main, run_on_broker
from outbox.acked_writer import produce_when_room
from outbox.config import kafka_client_config
from outbox.protocol import HalfRecord, OpRecord, Resolution, TopicNames
from outbox_checker.relay import Relay, RelaySettings


@dataclass
class Options:
    commits: int = 100_000
    value_bytes: int = 1024
    batch: int = RelaySettings.batch
    profile: bool = False
    bootstrap_servers: str | None = None
    json_path: Path | None = None


@dataclass
class Report:
    """The relay's figures and whether the real topic holds each commit exactly once."""

    commits: int
    value_bytes: int
    batch: int
    write_seconds: float
    relay_seconds: float
    commits_per_s: float
    real_records: int
    cpu_pct: dict[str, float | None] = field(default_factory=dict)
    profile_top: str | None = None

    @property
    def ok(self) -> bool:
        return self.real_records == self.commits

    @property
    def other_cpu_pct(self) -> float:
        return self.cpu_pct.get("other") or 0.0

    @property
    def document(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


def _produce_all(producer: Producer, records: Any) -> None:
    for record in records:
        produce_when_room(producer, **record.produce_kwargs())
    if producer.flush(300) > 0:
        raise RuntimeError("the relay bench's records were not acknowledged within 300s")


def write_decided(bootstrap: str, topics: TopicNames, count: int, value_bytes: int) -> float:
    """``count`` halves at offsets 0.. of half partition 0, then one COMMIT op each; seconds."""
    producer = Producer(
        {
            **kafka_client_config(bootstrap),  # its log lines through logging, not raw on fd 2
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 50,
            "batch.size": 900_000,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
        }
    )
    value = os.urandom(value_bytes)
    run = uuid.uuid4().hex[:8]
    now_ms = int(time.time() * 1000)
    real = f"{topics.prefix}.events"
    began = time.monotonic()
    ids = [f"{run}-{index}" for index in range(count)]
    # An empty partition and an idempotent producer without transactions: offsets 0..count-1.
    _produce_all(
        producer,
        (HalfRecord(i, GROUP, real, None, value, now_ms).to_record(topics, 0) for i in ids),
    )
    _produce_all(
        producer,
        (
            OpRecord(i, GROUP, 0, offset, Resolution.COMMIT, now_ms, offset).to_record(topics)
            for offset, i in enumerate(ids)
        ),
    )
    return time.monotonic() - began


def real_count(bootstrap: str, topic: str) -> int:
    """Records a ``read_committed`` reader sees in the real topic (its one partition)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-relay-count-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        tp = TopicPartition(topic, 0)
        low, high = consumer.get_watermark_offsets(tp, timeout=30)
        consumer.assign([TopicPartition(topic, 0, low)])
        count = 0
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            messages = consumer.consume(10_000, timeout=1.0)
            count += sum(1 for m in messages if m.error() is None)
            (position,) = consumer.position([tp])
            if position.offset >= high:
                break
        return count
    finally:
        consumer.close()


def drain_relay(bootstrap: str, topics: TopicNames, quiet_seconds: float = 3.0) -> int:
    """Relay every decision on ``topics``' op topic until none came for ``quiet_seconds``.

    For benches that time producers alone: the decisions they wrote are
    published afterwards, so their real records can be counted. Returns the
    records published.
    """
    relay = Relay(
        {"bootstrap.servers": bootstrap},
        topics,
        group_id=f"{topics.prefix}.relay",
        transactional_id=f"{topics.prefix}.relay.bench",
    )
    published = 0
    try:
        deadline = time.monotonic() + 60
        while not relay.partitions:
            if time.monotonic() > deadline:
                raise RuntimeError("the relay got no op partitions within 60s")
            published += relay.pump(0.2).published
        last = time.monotonic()
        while time.monotonic() - last < quiet_seconds:
            report = relay.pump(0.2)
            if report.decisions:
                published += report.published
                last = time.monotonic()
    finally:
        relay.close()
    return published


def measure(console: Console, options: Options, bootstrap: str, broker_pid: int | None) -> Report:
    topics = fresh_topics(bootstrap, "relay")
    try:
        console.print(
            f"    writing {options.commits:,} halves of {options.value_bytes} B and their commits",
            highlight=False,
        )
        written = write_decided(bootstrap, topics, options.commits, options.value_bytes)
        relay = Relay(
            {"bootstrap.servers": bootstrap},
            topics,
            group_id=f"{topics.prefix}.relay",
            transactional_id=f"{topics.prefix}.relay.bench",
            settings=RelaySettings(batch=options.batch),
        )
        profiler = cProfile.Profile() if options.profile else None
        try:
            published = 0
            # The group join and the first poll are not the relay's speed: time from the
            # first batch that carried decisions.
            deadline = time.monotonic() + 60
            first = relay.pump(0.5)
            while not first.decisions:
                if time.monotonic() > deadline:
                    raise RuntimeError("the relay received no decisions within 60s")
                first = relay.pump(0.5)
            with CpuWindow(broker_pid) as cpu:
                began = time.monotonic()
                if profiler is not None:
                    profiler.enable()
                published = first.published
                decided = first.decisions
                while decided < options.commits:
                    report = relay.pump(5.0)
                    if not report.decisions:
                        raise RuntimeError(f"the relay stalled at {decided:,} decisions")
                    decided += report.decisions
                    published += report.published
                if profiler is not None:
                    profiler.disable()
                seconds = time.monotonic() - began
        finally:
            relay.close()
        # The first batch ran before the clock started: its decisions are not counted.
        timed = max(1, options.commits - first.decisions)
        real = real_count(bootstrap, f"{topics.prefix}.events")
        top = None
        if profiler is not None:
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(20)
            top = out.getvalue()
            console.print(top, highlight=False, markup=False)
        result = Report(
            commits=options.commits,
            value_bytes=options.value_bytes,
            batch=options.batch,
            write_seconds=round(written, 2),
            relay_seconds=round(seconds, 3),
            commits_per_s=round(timed / max(seconds, 1e-9), 1),
            real_records=real,
            cpu_pct=cpu.pct,
            profile_top=top,
        )
        verdict = "exactly once" if result.ok else "NOT exactly once"
        console.print(
            f"    relay: {result.commits_per_s:,.0f} commits/s ({published:,} published), "
            f"CPU {cpu.pct}; real topic holds {real:,} of {options.commits:,}: {verdict}",
            highlight=False,
        )
        return result
    finally:
        drop_topics(bootstrap, topics)


def parse_args(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.relay", description="Commits/s the relay publishes."
    )
    parser.add_argument("--commits", type=int, default=Options.commits)
    parser.add_argument("--value-bytes", type=int, default=Options.value_bytes)
    parser.add_argument("--batch", type=int, default=Options.batch, help="RelaySettings.batch")
    parser.add_argument("--profile", action="store_true", help="cProfile the relay")
    parser.add_argument("--bootstrap-servers")
    args = parser.parse_args(argv)
    for name in ("commits", "value_bytes", "batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return Options(
        commits=args.commits,
        value_bytes=args.value_bytes,
        batch=args.batch,
        profile=args.profile,
        bootstrap_servers=args.bootstrap_servers,
    )


def run(console: Console, options: Options) -> int:
    return run_on_broker(console, options, _run_against)


def _run_against(console: Console, options: Options, bootstrap: str, broker_pid: int | None) -> int:
    report = measure(console, options, bootstrap, broker_pid)
    return 0 if report.ok else 1


def main(argv: Sequence[str] | None = None) -> None:
    bench_main(parse_args(argv), run)


if __name__ == "__main__":
    main()
