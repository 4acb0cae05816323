"""What ``make bench`` gathered, and how it shows it: one table, a section per bench,
aims beside values.

The running is :mod:`bench.all`; this module holds what it gathers (its options
and every bench's report) and formats it, importing nothing of :mod:`bench.all`,
so the two never import each other.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

from rich.table import Table

from bench import aims, checker, parking, peer, producer, relay, sink, visible
from bench.parking_table import AIM_PARKED_TO_VISIBLE_S, ratio
from bench.peer_table import SIDE_NAMES

AnyReport = (
    producer.Report
    | checker.Report
    | relay.Report
    | visible.Report
    | sink.Report
    | peer.Report
    | parking.Report
)

ONLY_WHEN_RUN = ("peer", "parking")
"""Benches whose verdict (and summary keys) appear only when they were to run: a run
without them writes what it wrote before they existed (see :mod:`bench.all`)."""


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
    peer: peer.Options | None = None
    """Us against faststream-outbox, on the shared broker (:mod:`bench.peer`)."""
    parking: parking.Options | None = None
    """On a broker of its own, after the others (:mod:`bench.parking`)."""
    parking_skipped_why: str | None = None
    """Why it was left out though not ``--skip-parking``."""


@dataclass
class Results:
    """What each bench returned; ``None`` where it was skipped or failed."""

    producer: producer.Report | None = None
    checker: checker.Report | None = None
    relay: relay.Report | None = None
    visible: visible.Report | None = None
    sink: sink.Report | None = None
    peer: peer.Report | None = None
    parking: parking.Report | None = None
    bootstrap: str | None = None
    """The shared broker's address (``None``: no shared bench ran)."""
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
            "peer": self.peer,
            "parking": self.parking,
        }

    def verdicts(self, options: Options) -> dict[str, str]:
        """Per bench: ``ok``, ``FAILED`` (its own checks), ``ERROR`` or ``skipped``."""
        verdicts = {}
        for name, report in self.reports().items():
            if getattr(options, name) is None and name in ONLY_WHEN_RUN:
                continue
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


def results_table(results: Results, options: Options, verdicts: dict[str, str]) -> Table:
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
        ("peer", "faststream-outbox", _peer_rows(results.peer, options.peer)),
        ("parking", "a broker of its own", _parking_rows(results.parking, options.parking)),
    ]
    for name, about, rows in sections:
        if getattr(options, name) is None:
            why = options.parking_skipped_why if name == "parking" else None
            rows = [("-", "-", "", f"skipped ({why})" if why else "skipped")]
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
            "two plain writes a send, msg/s (ratio)",
            " / ".join(
                f"{_num(cell.msgs_per_s if cell else None)} ({_num(ratio, '.3f')})"
                for cell, ratio in map(report.floor_at, senders)
            ),
            "",
            "the protocol's floor on this machine: the outbox's two waits, none of its work",
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
        _client_cpu_row(report),
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


def _client_cpu_row(report: producer.Report) -> Row:
    """The producer process's CPU a send, outbox against plain: a regression guard."""
    summary = report.summary
    ratio = summary.get("client_us_ratio")
    ok = ratio is not None and ratio <= aims.AIM_CLIENT_US_RATIO
    return (
        "client CPU µs/send outbox / plain",
        f"{_num(summary.get('client_us_per_send'), ',.1f')} / "
        f"{_num(summary.get('plain_client_us_per_send'), ',.1f')} ({_num(ratio, '.2f')}x)",
        f"<= {aims.AIM_CLIENT_US_RATIO:g}x {'ok' if ok else 'ABOVE'}",
        f"process CPU time / sends, at {summary['senders']} senders; two plain writes a send: "
        f"{_num(summary.get('pair_client_us_per_send'), ',.1f')} "
        f"({_num(summary.get('pair_client_us_ratio'), '.2f')}x)",
    )


def _checker_rows(report: checker.Report | None, options: checker.Options | None) -> list[Row]:
    if report is None or options is None:
        return []
    scan, rss = report.scan, report.rss
    ok = scan.halves_per_s >= aims.AIM_HALVES_PER_S
    rounds = scan.walk.rounds
    rows: list[Row] = [
        (
            "scan rate, halves/s",
            _num(scan.halves_per_s),
            f">= {aims.AIM_HALVES_PER_S:,} {'ok' if ok else 'BELOW'}",
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
        ok = rss.peak_rss_mb is not None and rss.peak_rss_mb < aims.AIM_RSS_MB
        rows.append(
            (
                figure_name,
                _num(rss.peak_rss_mb),
                f"< {aims.AIM_RSS_MB} {'ok' if ok else 'ABOVE'}",
                f"{rss.value_bytes} B halves; that walk: {_num(rss.halves_per_s)} halves/s",
            )
        )
    return rows


def _relay_rows(report: relay.Report | None, options: relay.Options | None) -> list[Row]:
    if report is None or options is None:
        return []
    ok = report.commits_per_s >= aims.AIM_COMMITS_PER_S
    exact = "[green]exactly once[/]" if report.ok else "[red]NOT exactly once[/]"
    cpu = report.cpu_pct
    return [
        (
            "commits/s published",
            _num(report.commits_per_s),
            f">= {aims.AIM_COMMITS_PER_S:,} {'ok' if ok else 'BELOW'}",
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
        paced = mode in visible.PACED
        if mode.startswith("plain"):
            rows.append(
                (
                    f"{mode} send-to-visible p50 / p99 ms",
                    f"{_num(result.visible_p50_ms, ',.1f')} / "
                    f"{_num(result.visible_p99_ms, ',.1f')}",
                    "",
                    f"Kafka's own exactly-once copy of plain sends (bench.eos_copy), "
                    f"{_num(result.msgs_per_s)} msg/s at {result.senders} senders",
                )
            )
            continue
        ratio = None if paced else ratio_to(result.msgs_per_s, plain)
        load = f"offered {options.rate:g} tx/s" if paced else "plain from the producer bench"
        p99_ok = result.visible_p99_ms is not None and result.visible_p99_ms <= (
            aims.AIM_VISIBLE_P99_MS
        )
        yardstick = report.of(visible.yardstick_of(mode))
        to_kafka = (
            f"; {result.visible_p99_ms / yardstick.visible_p99_ms:.2f}x the p99 of Kafka's own "
            f"copy ({yardstick.mode})"
            if yardstick and yardstick.visible_p99_ms and result.visible_p99_ms
            else ""
        )
        rows += [
            (
                f"{mode} msg/s (ratio to plain)",
                f"{_num(result.msgs_per_s)} ({_num(ratio, '.3f')})",
                "",
                f"at {result.senders} senders; {load}",
            ),
            (
                f"{mode} commit-to-visible p50 / p99 ms",
                f"{_num(result.visible_p50_ms, ',.1f')} / {_num(result.visible_p99_ms, ',.1f')}",
                f"p99 <= {aims.AIM_VISIBLE_P99_MS:g} {'ok' if p99_ok else 'ABOVE'}",
                f"{result.visible:,} of {result.committed:,} commits seen by a read_committed "
                f"reader; max {_num(result.visible_max_ms, ',.1f')} ms{to_kafka}",
            ),
            (f"{mode} relay stages", visible.stage_line(result.stages), "", "per relay batch"),
        ]
    return rows


def ratio_to(msgs_per_s: float | None, plain: producer.CellResult | None) -> float | None:
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


def _parking_rows(report: parking.Report | None, options: parking.Options | None) -> list[Row]:
    if report is None or options is None:
        return []
    off, on = report.phase(False), report.phase(True)
    times = ratio(off.fault_send_p99_ms if off else None, on.fault_send_p99_ms if on else None)
    fault = (
        f"broker {'frozen' if options.fault == 'freeze' else 'stopped'} {options.down_seconds:g}s"
    )
    after_writes = on.after_writable_max_s if on else None
    back = on.checker.get("assigned_after_return_s") if on else None
    met = after_writes is not None and after_writes <= AIM_PARKED_TO_VISIBLE_S
    exact = "[green]ok[/]" if report.ok else "[red]FAILED[/] (see above)"
    return [
        (
            "send p99 ms while away: without / with parking",
            f"{_num(off.fault_send_p99_ms if off else None)} / "
            f"{_num(on.fault_send_p99_ms if on else None)} ({_num(times, '.1f')}x)",
            "",
            f"{fault}, {options.rate:g} sends/s from {options.senders} threads; "
            "sends started while it was away",
        ),
        (
            "parked → visible max s: after return / after writes",
            f"{_num(on.parked_to_visible_max_s if on else None, '.1f')} / "
            f"{_num(after_writes, '.1f')}",
            f"<= {AIM_PARKED_TO_VISIBLE_S:g} {'ok' if met else 'ABOVE'}",
            f"{on.parked_committed if on else 0} committed parked sends; the checker had its "
            f"partitions back {_num(back, '.1f')} s after the return",
        ),
        (
            "failed with parking; missing / dup / rolled back",
            f"{on.failed if on else '-'}; {report.summary['missing']} / "
            f"{report.summary['duplicates']} / {report.summary['rolled_back_visible']}",
            "all 0",
            exact,
        ),
    ]


def _peer_rows(report: peer.Report | None, options: peer.Options | None) -> list[Row]:
    """Each side at the highest concurrency: requests/s, visible p99, CPU and WAL a request."""
    if report is None or options is None:
        return []
    top = max(options.concurrency)
    rows: list[Row] = []
    for side in options.sides:
        cell = report.of(side, top)
        if cell is None:
            continue
        rows.append(
            (
                f"{SIDE_NAMES[side]}: req/s; visible p99 ms",
                f"{_num(cell.requests_per_s)}; {_num(cell.visible_p99_ms, ',.1f')}",
                "",
                f"at {top} concurrent requests; {_num(cell.cpu_us_per_request)} µs CPU and "
                f"{_num(cell.wal_bytes)} B WAL a request",
            )
        )
    missing = sum(c.missing + c.warmup_missing for c in report.cells)
    duplicates = sum(c.duplicates + c.warmup_duplicates for c in report.cells)
    rows.append(
        (
            "committed requests missing / dup",
            f"{missing} / {duplicates}",
            "all 0",
            "[green]ok[/]" if report.ok else "[red]FAILED[/] (see above)",
        )
    )
    return rows
