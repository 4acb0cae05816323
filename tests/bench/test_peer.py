"""``python -m bench.peer --quick`` on the test broker and PostgreSQL: us against faststream-outbox.

Not a measurement: it proves that each side (the polling outbox, and our
caller's-transaction, asyncio and SQL listener forms) runs its requests at one
concurrency level with its relay in a process of its own, that every committed
request is visible on the real topic exactly once, that every figure is
reported, and that bad input is one line naming it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from bench import all as bench_all
from bench import peer
from tests.fixtures.postgres import fresh_database

pytestmark = [pytest.mark.kafka, pytest.mark.postgres]

HEADLINE = (
    "peer_requests_per_s_at_4",
    "outbox_requests_per_s_at_4",
    "peer_visible_p99_ms_at_4",
    "outbox_sql_visible_p99_ms_at_4",
)


@pytest.mark.long_proof  # the bench's smoke run (20-60 s); make test-long runs it
def test_quick_run_each_committed_request_is_visible_once_on_each_side(
    kafka_bootstrap: str, postgres_url: str, tmp_path: Path
) -> None:
    json_path = tmp_path / "peer.json"
    console = Console(record=True, width=200, force_terminal=False)
    # A database of its own: pg_stat_database counts per database, and other tests' idle
    # connections may still hold statistics they have not reported.
    with fresh_database(postgres_url) as database_url:
        options = peer.parse_args(
            [
                "--quick",
                "--bootstrap-servers",
                kafka_bootstrap,
                "--database-url",
                database_url,
                "--json",
                str(json_path),
            ]
        )

        code = peer.run(console, options)

    output = console.export_text()
    assert code == 0, output
    last = output.strip().splitlines()[-1]
    assert last.startswith("bench-peer: peer_requests_per_s_at_4="), last
    keys = dict(pair.split("=", 1) for pair in last.split()[1:])
    for key in HEADLINE:
        assert keys[key] != "nan", key
    assert keys["missing"] == keys["duplicates"] == "0", last
    assert "FAILED" not in output
    document = json.loads(json_path.read_text())
    assert document["ok"] is True and document["problems"] == []
    cells = document["cells"]
    assert [(c["side"], c["concurrency"]) for c in cells] == [
        ("peer", 4),
        ("outbox", 4),
        ("outbox-async", 4),
        ("outbox-sql", 4),
    ]
    for cell in cells:
        assert cell["committed"] > 0 and cell["errors"] == 0, cell
        assert cell["visible"] == cell["committed"], cell
        assert cell["missing"] == cell["duplicates"] == 0, cell
        assert cell["warmup_missing"] == cell["warmup_duplicates"] == 0, cell
        assert cell["rows"] == cell["committed"] + cell["warmup_committed"], cell
        for figure in ("visible_p99_ms", "cpu_us_per_request", "db_xacts", "wal_bytes"):
            assert cell[figure] is not None and cell[figure] > 0, (figure, cell)
    by_side = {c["side"]: c for c in cells}
    # Each request's own rows: the order and the outbox row (the peer's) or the
    # transaction-log row (ours); the peer's relay then claims (UPDATE) and DELETEs its row.
    assert by_side["peer"]["db_inserted"] == pytest.approx(2, abs=0.2)
    assert by_side["peer"]["db_deleted"] == pytest.approx(1, abs=0.2)
    assert by_side["outbox"]["db_inserted"] == pytest.approx(2, abs=0.2)
    assert by_side["outbox"]["db_deleted"] == 0
    for figure in ("req/s (relayed/s)", "visible p50 / p99 / max ms", "WAL B/req"):
        assert figure in output


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--concurrency", "0"], "--concurrency"),
        (["--concurrency", "1,x"], "--concurrency"),
        (["--sides", "outbox,kafka"], "--sides"),
        (["--database-url", "sqlite:///x.db"], "--database-url"),
        (["--database-url", "::not a url::"], "--database-url"),
    ],
)
def test_bad_input_is_one_line_naming_the_flag(capsys, argv: list[str], flag: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        peer.parse_args(argv)
    assert exit_info.value.code == 2
    error = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(error) == 1 and flag in error[0], error


def test_an_unreachable_database_is_one_line_and_exit_2(tmp_path: Path) -> None:
    # Nothing listens on port 1: the connection is refused before any broker starts.
    options = peer.parse_args(
        ["--database-url", "postgresql://nobody@127.0.0.1:1/none", "--json", str(tmp_path / "j")]
    )
    console = Console(record=True, width=200, force_terminal=False)

    assert peer.run(console, options) == 2

    lines = console.export_text().strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: --database-url postgresql+psycopg://nobody@127.0.0.1:1/none")
    assert "Traceback" not in lines[0]


def test_make_bench_runs_it_and_passes_the_flags_on(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench_all.parse_args(["--peer-args=--concurrency 0"])
    assert exit_info.value.code == 2 and "--concurrency" in capsys.readouterr().err

    quick = bench_all.parse_args(["--quick"])
    assert quick.peer is not None and quick.peer.concurrency == [4]
    assert quick.peer.json_path is None
    given = bench_all.parse_args(["--bootstrap-servers", "127.0.0.1:9092"])
    assert given.peer is not None and given.peer.bootstrap_servers == "127.0.0.1:9092"
    assert given.peer.concurrency == [1, 16, 64]
    assert bench_all.parse_args(["--skip-peer"]).peer is None
