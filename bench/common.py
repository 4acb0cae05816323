"""What the benchmarks share: the broker they run on, CPU accounting, ``main``.

The machines that run the benchmarks are small and often shared, so every
table says how much CPU the bench, the broker and everything else used
(from /proc, Linux).
"""

from __future__ import annotations

import gc
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from outbox_cli.console import make_console
from outbox_devtools.kafka import LocalKafka, ensure_kafka_jars


def host_cpu_seconds() -> float | None:
    """CPU seconds every process on the host has used (all CPUs), from /proc/stat."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    # user nice system idle iowait irq softirq steal ...: busy is everything but idle+iowait.
    ticks = [int(v) for v in fields[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int | None) -> float | None:
    """User+system CPU seconds of ``pid`` (or this process), from /proc on Linux."""
    if pid is None:
        times = os.times()
        return times.user + times.system
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # utime and stime are fields 14 and 15 of stat; 12 and 13 after the ")".
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


NOISY_OTHER_CPU_PCT = 25.0
"""Above this much CPU used by other processes, a table carries a warning."""

RunAgainst = Callable[[Console, Any, str, int | None], int]


def run_on_broker(
    console: Console, options: Any, run_against: RunAgainst, *, heap: str = "512m"
) -> int:
    """``run_against`` on ``options.bootstrap_servers``, else on a local broker started here."""
    if options.bootstrap_servers:
        return run_against(console, options, options.bootstrap_servers, None)
    console.print("[bold cyan]==>[/] resolving the Kafka broker jars", highlight=False)
    ensure_kafka_jars()
    console.print("[bold cyan]==>[/] starting a local Kafka broker", highlight=False)
    with LocalKafka(heap=heap) as kafka:
        console.print(
            f"    broker up at {kafka.bootstrap_servers} in {kafka.last_start_seconds:.1f}s",
            highlight=False,
        )
        try:
            return run_against(console, options, kafka.bootstrap_servers, kafka.pid)
        finally:
            # Clients in reference cycles would otherwise outlive the broker and
            # log "connection refused" while the process exits.
            gc.collect()


def noise_note(other_cpu_pct: float, what: str) -> str | None:
    """The warning for a measurement other processes shared the machine with, if they did.

    A sentence, so that ``bench.all`` can keep it in its JSON as well as print it.
    """
    if other_cpu_pct <= NOISY_OTHER_CPU_PCT:
        return None
    return (
        f"other processes used up to {other_cpu_pct:.0f}% CPU during {what} "
        f"({os.cpu_count()} CPUs); these numbers are noisier than on a quiet machine"
    )


def warn_if_noisy(console: Console, other_cpu_pct: float, what: str) -> None:
    """Say so when other processes shared the machine during the measurement."""
    note = noise_note(other_cpu_pct, what)
    if note is not None:
        console.print(f"[yellow]note:[/] {note}", highlight=False)


def save_results(console: Console, path: Path | None, document: dict[str, Any]) -> None:
    """``document`` to ``path``, and say where; ``None`` when the caller keeps it instead
    (``bench.all`` embeds each bench's document in its own)."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
    console.print(f"results written to {path}", highlight=False)


def percentile_ms(values: Sequence[float], q: float, digits: int = 3) -> float | None:
    """Nearest-rank percentile of ``values`` (seconds), in milliseconds to ``digits`` places."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return round(ordered[rank - 1] * 1000, digits)


def figure(value: float | None, spec: str) -> str:
    """A number for a ``key=value`` summary line; ``nan`` when it was not measured."""
    return "nan" if value is None else format(value, spec)


def count_label(n: int) -> str:
    """1000000 -> ``1m``, 50000 -> ``50k``: a backlog size as a summary key's suffix."""
    for size, suffix in ((1_000_000, "m"), (1_000, "k")):
        if n % size == 0:
            return f"{n // size}{suffix}"
    return str(n)


def print_last_line(console: Console, line: str) -> None:
    """The ``bench…: key=value …`` line scripts grep for: verbatim, never wrapped or styled."""
    console.print(line, highlight=False, markup=False, soft_wrap=True)


def bench_main(options: Any, run: Callable[[Console, Any], int]) -> None:
    """The shared ``main``: quiet logging, a console, the exit code of ``run``."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    sys.exit(run(make_console(), options))
