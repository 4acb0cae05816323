"""``make bench``: every benchmark on one broker, and one table of the figures that matter.

:mod:`bench.producer`, :mod:`bench.checker`, :mod:`bench.relay`,
:mod:`bench.visible` and :mod:`bench.sink` run in turn against one Kafka
broker, started once here (or ``--bootstrap-servers``): a broker start per
bench costs start-up time on the small machines these run on, and one broker
keeps the sets of figures comparable (the visible bench's throughput is set
against the producer bench's plain sends). The benches use topics of their own
names, so they do not see each other's records.

Each bench is configured by its own command line parser (its defaults, its
checks), fed ``--quick``'s small counts and then whatever ``--producer-args``,
``--checker-args``, ``--relay-args``, ``--visible-args`` or ``--sink-args``
say, so every knob of a bench is
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
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

from rich.console import Console
from rich.table import Table

from bench import checker, producer, relay, sink, visible
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
from outbox.dev.kafka import KAFKA_VERSION

RESULTS_PATH = Path(__file__).resolve().parent / "results" / "all.json"
BROKER_HEAP = "1g"
"""What the hungriest bench (checker's 1M-half backlog, the sink) starts its own broker with."""

QUICK_ARGS: dict[str, list[str]] = {
    "producer": ["--seconds", "2", "--warmup", "0.5"],
    "checker": ["--halves", "5000", "--rss-halves", "50000"],
    "relay": ["--commits", "5000"],
    "visible": ["--seconds", "2", "--warmup", "0.5"],
    "sink": ["--events", "2000", "--live-seconds", "5", "--rate", "50"],
}
"""``--quick``: a smoke run of a few minutes that exercises every figure, not a measurement."""

T = TypeVar("T")
AnyReport = producer.Report | checker.Report | relay.Report | visible.Report | sink.Report


class _BenchOptions(Protocol):
    json_path: Path | None


B = TypeVar("B", bound=_BenchOptions)


@dataclass
class Options:
    """Each bench's own options (``None``: skipped), and what this command adds."""

    producer: producer.Options | None
    checker: checker.Options | None
    relay: relay.Options | None
    visible: visible.Options | None
    sink: sink.Options | None
    argv: dict[str, list[str]]
    """The command line each bench was configured from, kept in the JSON."""
    quick: bool
    bootstrap_servers: str | None
    json_path: Path


@dataclass
class Results:
    """What each bench returned; ``None`` where it was skipped or failed."""

    producer: producer.Report | None = None
    checker: checker.Report | None = None
    relay: relay.Report | None = None
    visible: visible.Report | None = None
    sink: sink.Report | None = None
    errors: dict[str, str] = field(default_factory=dict)
    """Bench name -> the exception that ended it."""
    seconds: dict[str, float] = field(default_factory=dict)
    """Bench name -> its wall time."""

    def reports(self) -> dict[str, AnyReport | None]:
        """Bench name -> its report, in the order they run."""
        return {
            "producer": self.producer,
            "checker": self.checker,
            "relay": self.relay,
            "visible": self.visible,
            "sink": self.sink,
        }

    def verdicts(self, options: Options) -> dict[str, str]:
        """Per bench: ``ok``, ``FAILED`` (its own checks), ``ERROR`` or ``skipped``."""
        verdicts = {}
        for name, report in self.reports().items():
            if getattr(options, name) is None:
                verdicts[name] = "skipped"
            elif report is None:
                verdicts[name] = "ERROR"
            else:
                verdicts[name] = "ok" if report.ok else "FAILED"
        return verdicts

    def noise(self) -> dict[str, float]:
        """Per bench, the most CPU other processes used while it measured (% of one core)."""
        return {
            name: report.other_cpu_pct
            for name, report in self.reports().items()
            if report is not None
        }


# --------------------------------------------------------------------------- running


def run(console: Console, options: Options) -> int:
    """Start (or use) one broker and run every bench not skipped on it."""
    return run_on_broker(console, options, _run_against, heap=BROKER_HEAP)


def _run_against(console: Console, options: Options, bootstrap: str, broker_pid: int | None) -> int:
    began = time.monotonic()
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    results = Results()
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
    ]
    chosen = [stage for stage in stages if stage[2] is not None]
    for number, (name, what, bench_options, measure) in enumerate(chosen, 1):
        console.rule(f"[bold][{number}/{len(chosen)}] bench.{name}[/]: {what}")
        report = _stage(console, results, name, measure, bench_options, bootstrap, broker_pid)
        setattr(results, name, report)

    console.rule("[bold]make bench[/]")
    noise = results.noise()
    busiest = max(noise.values(), default=0.0)
    note = noise_note(busiest, "the benchmarks")
    warn_if_noisy(console, busiest, "the benchmarks")
    verdicts = results.verdicts(options)
    console.print(_table(results, options, verdicts))
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


# --------------------------------------------------------------------------- reporting


def _num(value: float | None, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def _per_senders(
    report: producer.Report, senders: list[int], mode: str, attr: str, spec: str
) -> str:
    """``attr`` of the ``mode`` cell at each sender count, as ``a / b / c``."""
    values = []
    for n in senders:
        plain, outbox, _ = report.at(n)
        cell = plain if mode == "plain" else outbox
        values.append(_num(None if cell is None else getattr(cell, attr), spec))
    return " / ".join(values)


Row = tuple[str, str, str, str]
"""(figure, value, aim, detail): one line of the table."""


def _table(results: Results, options: Options, verdicts: dict[str, str]) -> Table:
    """One section per bench, its name once, then the correctness verdicts."""
    local = "one local Kafka broker" if options.bootstrap_servers is None else "one Kafka broker"
    title = f"make bench: {local}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    if options.quick:
        title += " (--quick: a smoke run, not a measurement)"
    table = Table(title=title)
    table.add_column("bench")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("aim")
    table.add_column("detail")
    sections: list[tuple[str, str, list[Row]]] = [
        ("producer", "sync sends", _producer_rows(results.producer, options.producer)),
        ("checker", "1 half partition", _checker_rows(results.checker, options.checker)),
        ("relay", "1 half partition", _relay_rows(results.relay, options.relay)),
        (
            "visible",
            "checker sidecar relaying",
            _visible_rows(results.visible, results.producer, options.visible),
        ),
        ("sink", "Spark → Parquet", _sink_rows(results.sink, options.sink)),
    ]
    for name, about, rows in sections:
        if getattr(options, name) is None:
            rows = [("-", "-", "", "skipped")]
        elif getattr(results, name) is None:
            rows = [("-", "-", "", "[red]failed[/] (see above)")]
        for number, row in enumerate(rows):
            label = name if number == 0 else f"[dim]{about}[/]" if number == 1 else ""
            table.add_row(label, *row, end_section=number == len(rows) - 1)
    failed = any(v not in ("ok", "skipped") for v in verdicts.values())
    table.add_row(
        "all",
        "correctness (each bench's checks)",
        "[red]FAILED[/]" if failed else "[green]ok[/]",
        "",
        " · ".join(f"{name} {verdict}" for name, verdict in verdicts.items()),
    )
    return table


def _producer_rows(report: producer.Report | None, options: producer.Options | None) -> list[Row]:
    if report is None or options is None:
        return []
    senders = options.senders
    at = f"{' / '.join(map(str, senders))} senders"
    limit = report.summary["write_amplification_limit"]
    return [
        (
            "plain msg/s",
            _per_senders(report, senders, "plain", "msgs_per_s", ",.0f"),
            "",
            f"at {at}; {options.value_bytes} B values, {options.seconds:g}s per cell",
        ),
        (
            "outbox msg/s",
            _per_senders(report, senders, "outbox", "msgs_per_s", ",.0f"),
            "",
            "send_message_in_transaction, a no-op local transaction",
        ),
        (
            "ratio outbox/plain",
            " / ".join(_num(report.at(n)[2], ".3f") for n in senders),
            f"-> {limit:.3f}",
            "2 acknowledged writes a send (half, decision): 1/2 is the limit",
        ),
        (
            "async msg/s (ratio to plain)",
            " / ".join(
                f"{_num(cell.msgs_per_s if cell else None)} ({_num(ratio, '.3f')})"
                for cell, ratio in map(report.async_at, senders)
            ),
            f"-> {limit:.3f}",
            "AsyncTransactionProducer: as many tasks on one event loop",
        ),
        (
            "outbox end p50 ms",
            _per_senders(report, senders, "outbox", "end_p50_ms", ",.1f"),
            "",
            "local transaction answered -> decision acknowledged",
        ),
        (
            "outbox end p99 ms",
            _per_senders(report, senders, "outbox", "end_p99_ms", ",.1f"),
            "",
            "",
        ),
    ]


def _checker_rows(report: checker.Report | None, options: checker.Options | None) -> list[Row]:
    if report is None or options is None:
        return []
    scan, rss = report.scan, report.rss
    ok = scan.halves_per_s >= checker.AIM_HALVES_PER_S
    rounds = scan.walk.rounds
    rows: list[Row] = [
        (
            "scan rate, halves/s",
            _num(scan.halves_per_s),
            f">= {checker.AIM_HALVES_PER_S:,} {'ok' if ok else 'BELOW'}",
            f"{scan.halves:,} pending x {scan.value_bytes} B, "
            f"{rounds} round{'s' if rounds != 1 else ''}",
        )
    ]
    if scan.checks_answered is not None:
        rows.append(
            (
                "answers/s (producer group)",
                _num(scan.answers_per_s),
                "",
                f"{scan.checks_answered:,} of {scan.walk.checks_sent:,} checks answered COMMIT "
                "after the walk, by a producer process of its own",
            )
        )
    figure_name = f"peak RSS MiB at {options.rss_halves:,} pending"
    if rss is None:
        rows.append((figure_name, "-", "", "skipped (--skip-rss)"))
    else:
        ok = rss.peak_rss_mb is not None and rss.peak_rss_mb < checker.AIM_RSS_MB
        rows.append(
            (
                figure_name,
                _num(rss.peak_rss_mb),
                f"< {checker.AIM_RSS_MB} {'ok' if ok else 'ABOVE'}",
                f"{rss.value_bytes} B halves; that walk: {_num(rss.halves_per_s)} halves/s",
            )
        )
    return rows


def _relay_rows(report: relay.Report | None, options: relay.Options | None) -> list[Row]:
    if report is None or options is None:
        return []
    ok = report.commits_per_s >= relay.AIM_COMMITS_PER_S
    exact = "[green]exactly once[/]" if report.ok else "[red]NOT exactly once[/]"
    cpu = report.cpu_pct
    return [
        (
            "commits/s published",
            _num(report.commits_per_s),
            f">= {relay.AIM_COMMITS_PER_S:,} {'ok' if ok else 'BELOW'}",
            f"{report.commits:,} commits of {report.value_bytes} B, batch {report.batch}; "
            f"cpu% relay {_num(cpu.get('bench_process'))} broker {_num(cpu.get('broker'))}",
        ),
        (
            "real records / commits",
            f"{report.real_records:,} / {report.commits:,}",
            "equal",
            exact,
        ),
    ]


def _visible_rows(
    report: visible.Report | None,
    producer_report: producer.Report | None,
    options: visible.Options | None,
) -> list[Row]:
    if report is None or options is None:
        return []
    n = options.senders
    plain = producer_report.at(n)[0] if producer_report else None
    rows: list[Row] = []
    for mode in options.modes:
        result = report.of(mode)
        if result is None:
            continue
        if not result.available:
            rows.append((f"{mode} msg/s", "-", "", f"unavailable: {result.unavailable_reason}"))
            continue
        ratio = _ratio_to(result.msgs_per_s, plain)
        p99_ok = result.visible_p99_ms is not None and result.visible_p99_ms <= (
            visible.AIM_VISIBLE_P99_MS
        )
        rows += [
            (
                f"{mode} msg/s (ratio to plain)",
                f"{_num(result.msgs_per_s)} ({_num(ratio, '.3f')})",
                "",
                f"at {n} senders; plain from the producer bench",
            ),
            (
                f"{mode} commit-to-visible p50 / p99 ms",
                f"{_num(result.visible_p50_ms, ',.1f')} / {_num(result.visible_p99_ms, ',.1f')}",
                f"p99 <= {visible.AIM_VISIBLE_P99_MS:g} {'ok' if p99_ok else 'ABOVE'}",
                f"{result.visible:,} of {result.committed:,} commits seen by a read_committed "
                f"reader; max {_num(result.visible_max_ms, ',.1f')} ms",
            ),
        ]
    return rows


def _ratio_to(msgs_per_s: float | None, plain: producer.CellResult | None) -> float | None:
    if msgs_per_s is None or plain is None or not plain.msgs_per_s:
        return None
    return msgs_per_s / plain.msgs_per_s


def _sink_rows(report: sink.Report | None, options: sink.Options | None) -> list[Row]:
    if report is None or options is None:
        return []
    throughput, delay = report.throughput, report.delay
    return [
        (
            "--once rows/s (warm JVM)",
            _num(throughput.rows_per_s),
            "",
            f"{throughput.events:,} events of {options.value_bytes} B; "
            f"fresh JVM {_num(throughput.cold.rows_per_s)} rows/s",
        ),
        (
            "commit-to-row delay p50 / p99 ms",
            f"{_num(delay.delay_p50_ms)} / {_num(delay.delay_p99_ms)}",
            "",
            f"{delay.committed:,} events at {delay.rate:g}/s for {delay.seconds:g}s, "
            f"trigger {delay.trigger}",
        ),
    ]


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
    plain = results.producer.at(v_senders)[0] if results.producer else None
    rss_at = count_label(options.checker.rss_halves if options.checker else 1_000_000)
    return [
        (f"ratio_at_{senders}", p.get("ratio"), ".3f"),
        (f"outbox_msgs_per_s_at_{senders}", p.get("outbox_msgs_per_s"), ".0f"),
        ("end_p99_ms", p.get("end_p99_ms"), ".1f"),
        (
            f"oneway_ratio_at_{v_senders}",
            _ratio_to(oneway.msgs_per_s, plain) if oneway else None,
            ".3f",
        ),
        ("visible_p50_ms", sync.visible_p50_ms if sync else None, ".1f"),
        ("visible_p99_ms", sync.visible_p99_ms if sync else None, ".1f"),
        ("oneway_visible_p99_ms", oneway.visible_p99_ms if oneway else None, ".1f"),
        ("relay_commits_per_s", r.commits_per_s if r else None, ".0f"),
        ("checker_halves_per_s", c.scan.halves_per_s if c else None, ".0f"),
        ("answers_per_s", c.scan.answers_per_s if c else None, ".0f"),
        (f"checker_rss_mb_at_{rss_at}", c.rss_mb if c else None, ".0f"),
        ("sink_rows_per_s", s.throughput.rows_per_s if s else None, ".0f"),
        ("sink_delay_p50_ms", s.delay.delay_p50_ms if s else None, ".0f"),
        ("sink_delay_p99_ms", s.delay.delay_p99_ms if s else None, ".0f"),
    ]


# --------------------------------------------------------------------------- command line


def _bench_argv(name: str, args: argparse.Namespace) -> list[str]:
    """The command line ``name`` is configured from: quick counts, then the pass-through."""
    argv = list(QUICK_ARGS[name]) if args.quick else []
    if name == "checker" and args.skip_rss:
        argv.append("--skip-rss")
    if args.bootstrap_servers:
        argv += ["--bootstrap-servers", args.bootstrap_servers]
    return argv + shlex.split(getattr(args, f"{name}_args"))


def parse_args(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        prog="python -m bench.all",
        description=(
            "Every benchmark (producer, checker, sink) on one broker, one table of the "
            "figures, bench/results/all.json."
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

    bench_argv = {
        name: _bench_argv(name, args) for name in QUICK_ARGS if not getattr(args, f"skip_{name}")
    }

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
        argv=bench_argv,
        quick=args.quick,
        bootstrap_servers=args.bootstrap_servers,
        json_path=args.json_path,
    )


def main(argv: Sequence[str] | None = None) -> None:
    bench_main(parse_args(argv), run)


if __name__ == "__main__":
    main()
