"""``outbox chaos`` refuses bad settings at once, naming them, before it starts anything."""

import os
import subprocess
import sys

import pytest


def _chaos(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "outbox", "chaos", *args],
        capture_output=True,
        text=True,
        timeout=60,  # a run that started a broker would take minutes
        env=env,
    )


@pytest.mark.parametrize(
    "args,named",
    [
        (["--transactions=5"], "OUTBOX_CHAOS_TRANSACTIONS"),
        (["--producers=1"], "OUTBOX_CHAOS_PRODUCERS"),
        (["--rollback-share=2"], "OUTBOX_CHAOS_ROLLBACK_SHARE"),
        (["--broker-restarts=-1"], "OUTBOX_CHAOS_BROKER_RESTARTS"),
        (["--checker-outages=-1"], "OUTBOX_CHAOS_CHECKER_OUTAGES"),
        (["--answering-producer-kills=-2"], "OUTBOX_CHAOS_ANSWERING_PRODUCER_KILLS"),
        (["--broker-freezes=-1"], "OUTBOX_CHAOS_BROKER_FREEZES"),
        (["--checker-freezes=-1"], "OUTBOX_CHAOS_CHECKER_FREEZES"),
        (["--sink-format=iceberg"], "OUTBOX_CHAOS_SINK_FORMAT"),
        (["--brokers=2"], "OUTBOX_CHAOS_BROKERS"),
        (["--brokers=0"], "OUTBOX_CHAOS_BROKERS"),
        (["--rolling-restarts=-1"], "OUTBOX_CHAOS_ROLLING_RESTARTS"),
        (["--half-leader-kills=-1"], "OUTBOX_CHAOS_HALF_LEADER_KILLS"),
        (["--coordinator-kills=-1"], "OUTBOX_CHAOS_COORDINATOR_KILLS"),
        (["--kafka-outages=-1"], "OUTBOX_CHAOS_KAFKA_OUTAGES"),
        (["--drain-freezes=-1"], "OUTBOX_CHAOS_DRAIN_FREEZES"),
        (["--database=oracle"], "OUTBOX_CHAOS_DATABASE"),
    ],
)
def test_out_of_range_values_are_one_error_naming_the_setting(args, named):
    result = _chaos(*args)
    assert result.returncode == 1
    assert "invalid settings" in result.stderr and named in result.stderr
    assert "==>" not in result.stdout  # nothing was started


def test_a_value_that_is_not_a_number_is_refused_naming_flag_and_variable():
    result = _chaos("--threads=many")
    assert result.returncode == 2
    assert "--threads" in result.stderr and "OUTBOX_CHAOS_THREADS" in result.stderr
    assert "['" not in result.stderr  # the variable, not a list's repr


def test_a_bad_environment_variable_is_refused_like_a_flag():
    result = _chaos(env={**os.environ, "OUTBOX_CHAOS_SEED": "abc"})
    assert result.returncode == 2
    assert "OUTBOX_CHAOS_SEED" in result.stderr


@pytest.mark.parametrize(
    "variable", ["OUTBOX_CHAOS_CHECKER_OUTAGES", "OUTBOX_CHAOS_ANSWERING_PRODUCER_KILLS"]
)
def test_a_fault_count_that_is_not_a_number_is_refused_from_the_environment(variable):
    result = _chaos(env={**os.environ, variable: "once"})
    assert result.returncode == 2
    assert variable in result.stderr


def test_two_brokers_are_refused_with_the_reason():
    result = _chaos("--brokers=2")
    assert result.returncode == 1
    assert "1 node or a cluster of 3 to 5, not 2" in result.stderr
    assert "two voters lose their quorum" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
