"""``outbox checker`` refuses bad settings with one line naming the flag's variable."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest


def checker(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    return subprocess.run(
        [sys.executable, "-m", "outbox", "checker", *args],
        capture_output=True,
        text=True,
        timeout=60,
        # No probes unless a test asks: port 9464 may be another checker's on this machine.
        env={
            **clean,
            "OUTBOX_DEV_HOME": "/nonexistent-outbox-dev",
            "OUTBOX_HTTP_ADDRESS": "",
            **env,
        },
    )


@pytest.mark.parametrize(
    "args,env,message",
    [
        (
            (),
            {},
            "no Kafka to talk to: pass --bootstrap-servers HOST:PORT, set OUTBOX_BOOTSTRAP_SERVERS",
        ),
        (("--bootstrap-servers", "nohostport"), {}, "expected host:port"),
        (("--bootstrap-servers", "h:1", "--check-max", "0"), {}, "OUTBOX_CHECK_MAX"),
        (
            ("--bootstrap-servers", "h:1"),
            {"OUTBOX_CHECK_INTERVAL_SECONDS": "-1"},
            "OUTBOX_CHECK_INTERVAL_SECONDS",
        ),
        (("--bootstrap-servers", "h:1", "--http-address", "nowhere"), {}, "expected host:port"),
        (("--bootstrap-servers", "h:1", "--topic-prefix", "a/b"), {}, "topic prefix"),
        (("--bootstrap-servers", "h:1", "-X", "novalue"), {}, "not KEY=VALUE"),
        (("--bootstrap-servers", "h:1", "--relay-batch", "0"), {}, "OUTBOX_RELAY_BATCH"),
        (("--bootstrap-servers", "h:1"), {"OUTBOX_RELAY_MEMORY": "10"}, "OUTBOX_RELAY_MEMORY"),
        (
            ("--bootstrap-servers", "h:1", "--relay-transaction-timeout-ms", "5"),
            {},
            "OUTBOX_RELAY_TRANSACTION_TIMEOUT_MS",
        ),
        (
            ("--bootstrap-servers", "h:1", "--max-ops-per-round", "0"),
            {},
            "OUTBOX_MAX_OPS_PER_ROUND",
        ),
        (
            ("--bootstrap-servers", "h:1", "--health-stall-seconds", "0"),
            {},
            "OUTBOX_HEALTH_STALL_SECONDS",
        ),
        (
            ("--bootstrap-servers", "h:1", "--unreachable-report-seconds", "0.5"),
            {},
            "OUTBOX_UNREACHABLE_REPORT_SECONDS",
        ),
        (
            ("--bootstrap-servers", "h:1"),
            {"OUTBOX_UNREACHABLE_REPORT_SECONDS": "0s"},
            "OUTBOX_UNREACHABLE_REPORT_SECONDS",
        ),
        (
            ("--bootstrap-servers", "h:1", "--start-timeout-seconds", "-1"),
            {},
            "OUTBOX_START_TIMEOUT_SECONDS",
        ),
        (
            ("--bootstrap-servers", "127.0.0.1:1", "--start-timeout-seconds", "2"),
            {},
            "outbox: error: cannot reach Kafka at 127.0.0.1:1 within 2s",
        ),
        (
            ("--bootstrap-servers", "h:1", "--resolve-from-db", "foo://x"),
            {},
            "unsupported database URL scheme",
        ),
    ],
)
def test_bad_settings_are_one_line_errors(args, env, message):
    result = checker(*args, **env)
    assert result.returncode == 1, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_help_lists_every_setting_with_its_variable():
    from outbox_checker.settings import CheckerSettings

    result = checker("--help", COLUMNS="200")
    assert result.returncode == 0
    for name in CheckerSettings.model_fields:
        if name != "kafka_properties":
            assert f"--{name.replace('_', '-')}" in result.stdout
            assert f"OUTBOX_{name.upper()}" in result.stdout


def test_a_relay_switch_that_is_no_boolean_is_a_usage_error_naming_its_variable():
    result = checker("--bootstrap-servers", "h:1", OUTBOX_RELAY="maybe")
    assert result.returncode == 2, result.stderr
    assert "OUTBOX_RELAY" in result.stderr and "boolean" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_probe_port_in_use_is_one_line_naming_it():
    """A second replica on one machine (the default 127.0.0.1:9464 taken) says so, no traceback."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        result = checker("--bootstrap-servers", "127.0.0.1:1", "--http-address", address)
    assert result.returncode == 1, result.stderr
    assert f"cannot serve the probes and metrics on {address}: Address already in use" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr


def test_help_groups_every_flag_in_a_panel():
    """``outbox checker --help`` shows its flags by what they tune, not as one long list."""
    import typer

    from outbox_cli import build_app

    command = typer.main.get_command(build_app()).commands["checker"]
    panels = {
        param.name: getattr(param, "rich_help_panel", None)
        for param in command.params
        if param.name != "help"
    }
    assert not [name for name, panel in panels.items() if panel is None]
    assert set(panels.values()) == {
        "Kafka",
        "Kafka security",
        "Check rounds (RocketMQ's)",
        "Relay (publication)",
        "Answers from the database",
        "Probes and logs",
    }
    assert (panels["relay_batch"], panels["sasl_password"], panels["check_max"]) == (
        "Relay (publication)",
        "Kafka security",
        "Check rounds (RocketMQ's)",
    )
