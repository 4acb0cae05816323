"""``python -m bench.all`` end to end on the test broker, at smoke-test size.

Not a measurement: it proves that the benches run on a broker they are given,
hand their results back, and that the one table, the JSON and the last line
carry them. The sink (Spark), the checker's RSS walk and the peer bench (its own
PostgreSQL; its smoke run is in tests/bench/test_peer.py, under ``make test-long``)
are skipped to keep it within seconds; ``make bench`` runs them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from bench import all as bench_all

pytestmark = pytest.mark.kafka


@pytest.mark.long_proof  # the bench's smoke run (50-60 s), as test_peer's and test_parking's are
def test_bench_all_on_the_test_broker(kafka_bootstrap: str, tmp_path: Path) -> None:
    json_path = tmp_path / "all.json"
    options = bench_all.parse_args(
        [
            "--quick",
            "--skip-sink",
            "--skip-rss",
            "--skip-peer",
            "--bootstrap-servers",
            kafka_bootstrap,
            "--producer-args=--senders 1,4 --seconds 1 --warmup 0.5",
            "--checker-args=--halves 500",
            "--relay-args=--commits 300",
            "--visible-args=--senders 4 --seconds 1 --warmup 0.5",
            "--json",
            str(json_path),
        ]
    )
    console = Console(record=True, width=200, force_terminal=False)

    code = bench_all.run(console, options)

    output = console.export_text()
    assert code == 0, output
    last = output.strip().splitlines()[-1]
    assert last.startswith("bench: ratio_at_4="), last
    assert "checker_rss_mb_at_50k=nan" in last and "sink_rows_per_s=nan" in last
    for figure in (
        "ratio outbox/plain",
        "async msg/s (ratio to plain)",
        "outbox end p99 ms",
        "scan rate, halves/s",
        "answers/s (producer group)",
        "commits/s published",
        "real records / commits",
        "sync commit-to-visible p50 / p99 ms",
        "plain send-to-visible p50 / p99 ms",
        "plain-steady send-to-visible p50 / p99 ms",
        "client CPU µs/send outbox / plain",
        "two plain writes a send, msg/s (ratio)",
    ):
        assert figure in output
    # Until the producer has ``end_oneway``, its row says so instead of failing the run.
    assert "oneway msg/s" in output
    assert "at 1 / 4 senders" in output

    document = json.loads(json_path.read_text())
    assert document["verdicts"] == {
        "producer": "ok",
        "checker": "ok",
        "relay": "ok",
        "visible": "ok",
        "sink": "skipped",
    }
    assert document["machine"]["cpus"] >= 1 and document["machine"]["python"]
    assert document["broker"]["local"] is False
    # Speeds are not asserted (the test machine may be busy); that each one was reported is.
    assert set(document["summary"]) == {
        "ratio_at_4",
        "async_ratio_at_4",
        "client_us_per_send",
        "plain_client_us_per_send",
        "pair_ratio_at_4",
        "pair_client_us_per_send",
        "outbox_msgs_per_s_at_4",
        "end_p99_ms",
        "oneway_ratio_at_4",
        "visible_p50_ms",
        "visible_p99_ms",
        "oneway_visible_p99_ms",
        "visible_steady_p50_ms",
        "visible_steady_p99_ms",
        "plain_visible_p99_ms",
        "plain_visible_steady_p99_ms",
        "relay_commits_per_s",
        "checker_halves_per_s",
        "answers_per_s",
        "checker_rss_mb_at_50k",
        "sink_rows_per_s",
        "sink_delay_p50_ms",
        "sink_delay_p99_ms",
    }
    summary = document["summary"]
    for key in (
        "checker_halves_per_s",
        "answers_per_s",
        "relay_commits_per_s",
        "visible_p99_ms",
        "plain_visible_p99_ms",
        "client_us_per_send",
        "plain_client_us_per_send",
        "pair_client_us_per_send",
        "pair_ratio_at_4",
    ):
        assert summary[key] > 0, key
    relay = document["benches"]["relay"]
    assert relay["real_records"] == relay["commits"] == 300
    sync = document["benches"]["visible"]["results"][0]
    assert sync["mode"] == "sync" and sync["visible"] == sync["committed"] > 0
    producer = document["benches"]["producer"]
    assert [(c["mode"], c["senders"]) for c in producer["cells"]] == [
        ("plain", 1),
        ("pair", 1),
        ("outbox", 1),
        ("async", 1),
        ("plain", 4),
        ("pair", 4),
        ("outbox", 4),
        ("async", 4),
    ]
    outbox_cells = [c for c in producer["cells"] if c["mode"] not in ("plain", "pair")]
    assert all(c["committed"] == c["attempts"] for c in outbox_cells)
    assert all(c["client_us_per_send"] > 0 for c in producer["cells"])
    walk = document["benches"]["checker"]["scan"]["walk"]
    assert walk["checks_sent"] == 500
    # The walk starts once the backlog is due by its store time: no round waits for it to age.
    assert "younger than the transaction timeout" not in walk["stop_reasons"], walk
    assert document["benches"]["sink"] is None
    # The benches' own result files are not written by ``bench.all``.
    assert options.producer is not None and options.producer.json_path is None


def test_a_bad_pass_through_flag_fails_before_any_broker_starts(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench_all.parse_args(["--producer-args=--senders=0"])
    assert exit_info.value.code == 2
    assert "--senders" in capsys.readouterr().err
