"""The README's first command works: ``outbox demo`` end to end on a real local broker."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.kafka


def test_demo_round_trips_every_record_kind():
    result = subprocess.run(
        [sys.executable, "-m", "outbox", "demo"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last == "demo: kinds=5 written=5 read_back=5 round_trip=ok"
    for kind in ("half", "real", "op", "check", "discard"):
        assert f"│ {kind} " in result.stdout
