"""``make bench``: every benchmark on one broker, and one table of the figures that matter.

:mod:`bench.producer`, :mod:`bench.checker`, :mod:`bench.relay`,
:mod:`bench.visible` and :mod:`bench.sink` run in turn against one Kafka
broker, started once here (or ``--bootstrap-servers``): a broker start per
bench costs start-up time on the small machines these run on, and one broker
keeps the sets of figures comparable (the visible bench's throughput is set
against the producer bench's plain sends). The benches use topics of their own
names, so they do not see each other's records.

:mod:`bench.peer` (us against faststream-outbox, a polling outbox) runs on the
shared broker after them, with a local PostgreSQL of its own; like the parking
bench, its verdict and summary keys appear only when it runs (``--skip-peer``).

:mod:`bench.parking` comes last, on a broker of its own that it starts once the
shared one is gone: it freezes (or stops) the broker it measures, which would
wreck a broker the other benches share, and a broker given by
``--bootstrap-servers`` is not one to freeze, so with that flag it is skipped.
Its verdict and its keys in the summary appear only when it runs, so a run
without it (``--skip-parking`` or ``--bootstrap-servers``) writes the verdicts and
summary keys it wrote before the bench existed.

Each bench is configured by its own command line parser (its defaults, its
checks), fed ``--quick``'s small counts and then whatever ``--producer-args``,
``--checker-args``, ``--relay-args``, ``--visible-args`` or ``--sink-args``
say (and ``--peer-args``, ``--parking-args``), so every knob of a bench is
reachable here without being declared twice. A bad flag fails before the
broker starts. Each bench prints its progress and its own table as it runs;
then comes one table of the headline figures, ``bench/results/all.json``
(every bench's full document, the machine, the noise) and a last line
``bench: key=value ...``. A bench that raises is reported and the others still
run, so a long run is not lost to one failure.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import shlex
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

from rich.console import Console

from bench import checker, parking, peer, peer_table, producer, relay, sink, visible
from bench.all_table import Options, Results, ratio_to, results_table
from bench.common import (
    bench_main,
    count_label,
    figure,
    noise_note,
    print_last_line,
    run_on_broker,
    save_results,
    warn_if_noisy,
)
from outbox_devtools.kafka import KAFKA_VERSION

RESULTS_PATH = Path(__file__).resolve().parent / "results" / "all.json"
BROKER_HEAP = "1g"
"""What the hungriest bench (checker's 1M-half backlog, the sink) starts its own broker with."""

QUICK_ARGS: dict[str, list[str]] = {
    "producer": ["--seconds", "2", "--warmup", "0.5"],
    "checker": ["--halves", "5000", "--rss-halves", "50000"],
    "relay": ["--commits", "5000"],
    "visible": ["--seconds", "2", "--warmup", "0.5"],
    "sink": ["--events", "2000", "--live-seconds", "5", "--rate", "50"],
    "peer": ["--quick"],
    "parking": ["--quick"],
}
"""``--quick``: a smoke run of a few minutes that exercises every figure, not a measurement."""

T = TypeVar("T")


class _BenchOptions(Protocol):
    json_path: Path | None


B = TypeVar("B", bound=_BenchOptions)


# --------------------------------------------------------------------------- running


def run(console: Console, options: Options) -> int:
    """Start (or use) one broker and run every shared bench not skipped on it; then the
    parking bench on a broker of its own; then the one table."""
    began = time.monotonic()
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    results = Results()
    shared = _shared_stages(options)
    total = len(shared) + (options.parking is not None)

    def run_shared(console: Console, options: Options, bootstrap: str, pid: int | None) -> int:
        results.bootstrap = bootstrap
        for number, (name, what, bench_options, measure) in enumerate(shared, 1):
            console.rule(f"[bold][{number}/{total}] bench.{name}[/]: {what}")
            report = _stage(console, results, name, measure, bench_options, bootstrap, pid)
            setattr(results, name, report)
        return 0

    if shared:
        run_on_broker(console, options, run_shared, heap=BROKER_HEAP)
    if options.parking is not None:
        console.rule(
            f"[bold][{total}/{total}] bench.parking[/]: send latency across a broker "
            f"{options.parking.fault}, without and with parking (a broker of its own)"
        )
        results.parking = _stage(console, results, "parking", _parking, options.parking, "", None)
    elif options.parking_skipped_why:
        console.print(f"bench.parking skipped: {options.parking_skipped_why}", highlight=False)
    return _report(console, options, results, began, load)


def _shared_stages(options: Options) -> list[tuple[str, str, Any, Callable[..., Any]]]:
    """The benches that share one broker, in order, those not skipped."""
    rss = options.checker is not None and not options.checker.skip_rss
    stages: list[tuple[str, str, Any, Callable[..., Any]]] = [
        ("producer", "plain vs outbox sends, threads, tasks", options.producer, producer.measure),
        (
            "checker",
            "scan rate, answers/s" + (" and peak RSS" if rss else ""),
            options.checker,
            checker.measure,
        ),
        ("relay", "commits/s published from one half partition", options.relay, relay.measure),
        (
            "visible",
            "commit-to-visible latency, checker relaying in its own process",
            options.visible,
            visible.measure,
        ),
        ("sink", "Spark sink rows/s (--once), commit-to-row delay", options.sink, sink.measure),
        (
            "peer",
            "us against faststream-outbox, a polling outbox, on a local PostgreSQL",
            options.peer,
            peer.measure,
        ),
    ]
    return [stage for stage in stages if stage[2] is not None]


def _parking(
    console: Console, options: parking.Options, bootstrap: str, broker_pid: int | None
) -> parking.Report:
    """:func:`bench.parking.measure` as a stage: the broker it starts is its own."""
    return parking.measure(console, options)


def _report(
    console: Console,
    options: Options,
    results: Results,
    began: float,
    load: tuple[float, float, float] | None,
) -> int:
    """The one table, ``all.json`` and the last line; 1 if a bench failed."""
    bootstrap = results.bootstrap
    console.rule("[bold]make bench[/]")
    noise = results.noise()
    busiest = max(noise.values(), default=0.0)
    note = noise_note(busiest, "the benchmarks")
    warn_if_noisy(console, busiest, "the benchmarks")
    verdicts = results.verdicts(options)
    console.print(results_table(results, options, verdicts))
    summary = _summary(results, options)
    document = {
        "bench": "all",
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "created_unix": round(time.time(), 3),
        "elapsed_seconds": round(time.monotonic() - began, 1),
        "quick": options.quick,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_average_at_start": None if load is None else [round(v, 2) for v in load],
            "other_cpu_pct_max": noise,
            "host_cpu_note": note,
        },
        "broker": {
            "local": options.bootstrap_servers is None,
            "bootstrap_servers": bootstrap,
            "kafka": KAFKA_VERSION,
            "heap": BROKER_HEAP if options.bootstrap_servers is None else None,
        },
        "argv": options.argv,
        "summary": {key: value for key, value, _ in summary},
        "verdicts": verdicts,
        "errors": results.errors,
        "stage_seconds": results.seconds,
        "benches": {
            name: None if report is None else report.document
            for name, report in results.reports().items()
        },
    }
    save_results(console, options.json_path, document)
    print_last_line(
        console,
        "bench: " + " ".join(f"{key}={figure(value, spec)}" for key, value, spec in summary),
    )
    return 0 if all(v in ("ok", "skipped") for v in verdicts.values()) else 1


def _stage(
    console: Console,
    results: Results,
    name: str,
    measure: Callable[[Console, B, str, int | None], T],
    options: B,
    bootstrap: str,
    broker_pid: int | None,
) -> T | None:
    """One bench's ``measure``, timed; an exception is reported and kept so that the next
    bench still runs."""
    began = time.monotonic()
    try:
        return measure(console, options, bootstrap, broker_pid)
    except Exception as exc:
        console.print_exception(max_frames=8)
        console.print(f"[red]bench.{name} failed:[/] {exc!r}", highlight=False)
        results.errors[name] = repr(exc)
        return None
    finally:
        # A bench's closed clients sit in reference cycles: collected now, they do not
        # poll the broker while the next bench measures.
        gc.collect()
        results.seconds[name] = round(time.monotonic() - began, 1)
        console.print(f"    bench.{name} took {results.seconds[name]:.0f}s", highlight=False)


# --------------------------------------------------------------------------- the last line


def _summary(results: Results, options: Options) -> list[tuple[str, float | None, str]]:
    """The last line's (key, value, format), in order; also the JSON's summary.

    Keys name what was measured: the RSS key carries the backlog it was measured
    at, so a ``--quick`` run's figure cannot pass for the 1M-half one.
    """
    p = results.producer.summary if results.producer else {}
    senders = p.get("senders", 64)
    c, s, r = results.checker, results.sink, results.relay
    v_senders = options.visible.senders if options.visible else senders
    sync = results.visible.of("sync") if results.visible else None
    oneway = results.visible.of("oneway") if results.visible else None
    steady = results.visible.of("steady") if results.visible else None
    kafka = results.visible.of("plain") if results.visible else None
    kafka_steady = results.visible.of("plain-steady") if results.visible else None
    plain = results.producer.at(v_senders)[0] if results.producer else None
    rss_at = count_label(options.checker.rss_halves if options.checker else 1_000_000)
    return [
        (f"ratio_at_{senders}", p.get("ratio"), ".3f"),
        (f"async_ratio_at_{senders}", p.get("async_ratio"), ".3f"),
        ("client_us_per_send", p.get("client_us_per_send"), ".1f"),
        ("plain_client_us_per_send", p.get("plain_client_us_per_send"), ".1f"),
        (f"pair_ratio_at_{senders}", p.get("pair_ratio"), ".3f"),
        ("pair_client_us_per_send", p.get("pair_client_us_per_send"), ".1f"),
        (f"outbox_msgs_per_s_at_{senders}", p.get("outbox_msgs_per_s"), ".0f"),
        ("end_p99_ms", p.get("end_p99_ms"), ".1f"),
        (
            f"oneway_ratio_at_{v_senders}",
            ratio_to(oneway.msgs_per_s, plain) if oneway else None,
            ".3f",
        ),
        ("visible_p50_ms", sync.visible_p50_ms if sync else None, ".1f"),
        ("visible_p99_ms", sync.visible_p99_ms if sync else None, ".1f"),
        ("oneway_visible_p99_ms", oneway.visible_p99_ms if oneway else None, ".1f"),
        ("visible_steady_p50_ms", steady.visible_p50_ms if steady else None, ".1f"),
        ("visible_steady_p99_ms", steady.visible_p99_ms if steady else None, ".1f"),
        ("plain_visible_p99_ms", kafka.visible_p99_ms if kafka else None, ".1f"),
        (
            "plain_visible_steady_p99_ms",
            kafka_steady.visible_p99_ms if kafka_steady else None,
            ".1f",
        ),
        ("relay_commits_per_s", r.commits_per_s if r else None, ".0f"),
        ("checker_halves_per_s", c.scan.halves_per_s if c else None, ".0f"),
        ("answers_per_s", c.scan.answers_per_s if c else None, ".0f"),
        (f"checker_rss_mb_at_{rss_at}", c.rss_mb if c else None, ".0f"),
        ("sink_rows_per_s", s.throughput.rows_per_s if s else None, ".0f"),
        ("sink_delay_p50_ms", s.delay.delay_p50_ms if s else None, ".0f"),
        ("sink_delay_p99_ms", s.delay.delay_p99_ms if s else None, ".0f"),
        *_peer_summary(results, options),
        *_parking_summary(results, options),
    ]


PEER_SUMMARY = ("requests_per_s", "visible_p99_ms", "cpu_us_per_request", "wal_bytes")
"""The peer bench's figures in the last line, for each side at its highest concurrency."""


def _peer_summary(results: Results, options: Options) -> list[tuple[str, float | None, str]]:
    """The peer bench's headline keys, when it was to run (as the parking bench's)."""
    if options.peer is None:
        return []
    top = max(options.peer.concurrency)
    cells = {(c.side, c.concurrency): c for c in results.peer.cells} if results.peer else {}
    specs = dict(peer_table.FIGURES)
    return [
        (
            peer_table.summary_key(side, name, top),
            getattr(cells.get((side, top)), name, None),
            specs[name],
        )
        for side in options.peer.sides
        for name in PEER_SUMMARY
    ]


def _parking_summary(results: Results, options: Options) -> list[tuple[str, float | None, str]]:
    """The parking bench's headline keys, when it was to run (see the module's docs)."""
    if options.parking is None:
        return []
    p = results.parking.summary if results.parking else {}
    return [
        ("parking_fault_p99_ms_off", p.get("fault_p99_ms_off"), ".0f"),
        ("parking_fault_p99_ms_on", p.get("fault_p99_ms_on"), ".0f"),
        ("parked_to_visible_max_s", p.get("parked_to_visible_max_s"), ".1f"),
        ("parked_visible_after_writes_max_s", p.get("after_writes_max_s"), ".1f"),
    ]


# --------------------------------------------------------------------------- command line


def _bench_argv(name: str, args: argparse.Namespace) -> list[str]:
    """The command line ``name`` is configured from: quick counts, then the pass-through."""
    argv = list(QUICK_ARGS[name]) if args.quick else []
    if name == "checker" and args.skip_rss:
        argv.append("--skip-rss")
    if args.bootstrap_servers and name != "parking":
        argv += ["--bootstrap-servers", args.bootstrap_servers]
    return argv + shlex.split(getattr(args, f"{name}_args"))


def parse_args(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.all",
        description=(
            "Every benchmark (producer, checker, relay, visible, sink) on one broker, then "
            "the parking bench on a broker of its own; one table of the figures, "
            "bench/results/all.json."
        ),
        epilog=(
            "Other knobs go to a bench as its own flags, e.g. "
            "--producer-args='--senders 1,64 --seconds 5' (use '=': the value starts with '-')."
        ),
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: seconds per cell, thousands of records, a 50k-half RSS backlog",
    )
    parser.add_argument("--skip-producer", action="store_true")
    parser.add_argument("--skip-checker", action="store_true")
    parser.add_argument("--skip-rss", action="store_true", help="the checker's scan rate only")
    parser.add_argument("--skip-relay", action="store_true")
    parser.add_argument("--skip-visible", action="store_true")
    parser.add_argument("--skip-sink", action="store_true", help="no Spark")
    parser.add_argument(
        "--skip-peer",
        action="store_true",
        help="not against faststream-outbox (it starts a local PostgreSQL)",
    )
    parser.add_argument(
        "--skip-parking",
        action="store_true",
        help="no broker fault (the parking bench freezes a broker of its own)",
    )
    for name in QUICK_ARGS:
        parser.add_argument(
            f"--{name}-args",
            default="",
            metavar="FLAGS",
            help=f"flags for bench.{name} (see python -m bench.{name} --help)",
        )
    parser.add_argument(
        "--bootstrap-servers", help="use this broker instead of starting a local one"
    )
    parser.add_argument("--json", dest="json_path", type=Path, default=RESULTS_PATH)
    args = parser.parse_args(argv)

    skipped = {name: getattr(args, f"skip_{name}") for name in QUICK_ARGS}
    why = None
    if args.bootstrap_servers and not args.skip_parking:
        skipped["parking"] = True
        why = "it freezes the broker it measures, and --bootstrap-servers names a shared one"
    bench_argv = {name: _bench_argv(name, args) for name in QUICK_ARGS if not skipped[name]}

    def configured(name: str, parse: Callable[[list[str]], B]) -> B | None:
        if name not in bench_argv:
            return None
        bench_options = parse(bench_argv[name])
        bench_options.json_path = None  # its document goes into all.json, not a file of its own
        return bench_options

    return Options(
        producer=configured("producer", producer.parse_args),
        checker=configured("checker", checker.parse_args),
        relay=configured("relay", relay.parse_args),
        visible=configured("visible", visible.parse_args),
        sink=configured("sink", sink.parse_args),
        peer=configured("peer", peer.parse_args),
        parking=configured("parking", parking.parse_args),
        parking_skipped_why=why,
        argv=bench_argv,
        quick=args.quick,
        bootstrap_servers=args.bootstrap_servers,
        json_path=args.json_path,
    )


def main(argv: Sequence[str] | None = None) -> None:
    bench_main(parse_args(argv), run)


if __name__ == "__main__":
    main()
