"""The README's first command works: ``outbox demo`` end to end, invariants checked."""

import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.kafka


def test_demo_runs_the_whole_pipeline_and_its_invariants_hold():
    result = subprocess.run(
        [sys.executable, "-m", "outbox", "demo"], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    last = result.stdout.strip().splitlines()[-1]
    found = re.fullmatch(
        r"demo: committed=(\d+) rolled_back=(\d+) resolved_by_check=(\d+) "
        r"sink_rows=(\d+) duplicates=0 lost=0",
        last,
    )
    assert found, last
    committed, rolled_back, resolved, sink_rows = map(int, found.groups())
    assert committed == sink_rows > 0
    assert rolled_back > 0
    assert resolved == 4
    # The screen is the demo's own: no raw librdkafka line, no Python warning.
    output = (result.stdout + result.stderr).splitlines()
    assert [line for line in output if line.startswith("%")] == [], result.stderr[-3000:]
    assert [line for line in output if re.search(r"\w+Warning: ", line)] == [], result.stderr
