"""One duration syntax in every command and variable: ``500ms``, ``10s``, ``5m``, ``1d12h``.

A plain number keeps the unit its option always had (seconds, milliseconds or
hours), so what was written before means what it meant; anything else that is
no duration is one line naming the flag (or variable) and the value.
"""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from outbox.durations import DurationError, format_duration, parse_duration
from outbox.errors import ConfigurationError
from outbox.settings import ProducerSettings
from outbox_checker.settings import CheckerSettings
from tests.cli.support import outbox

HINT = "(use 500ms, 10s, 5m, 1d12h)"


@pytest.mark.parametrize(
    "text,unit,expected",
    [
        ("500ms", "s", 0.5),
        ("10s", "s", 10.0),
        ("5m", "s", 300.0),
        ("1d12h", "h", 36.0),
        ("1m30s", "s", 90.0),
        ("10s", "ms", 10_000.0),
        ("2 minutes", "s", 120.0),
        ("30", "s", 30.0),  # a plain number is in the option's unit
        ("6000", "ms", 6000.0),
        ("72", "h", 72.0),
        ("1.5", "s", 1.5),
        (45, "s", 45.0),
    ],
)
def test_durations_in_the_options_unit(text, unit, expected):
    assert parse_duration(text, unit) == expected


@pytest.mark.parametrize("text", ["10x", "", "h", "ms", "-1d", "7d junk", "5mss", "1d-2h"])
def test_what_is_no_duration_is_named_with_the_examples(text):
    with pytest.raises(DurationError) as caught:
        parse_duration(text)
    assert str(caught.value) == f"{text!r} is not a duration {HINT}"


def test_a_plain_number_is_refused_where_a_unit_is_required():
    with pytest.raises(DurationError, match=r"'7' has no unit"):
        parse_duration("7", unit=None)


@pytest.mark.parametrize("seconds", [0.5, 6, 90, 3600, 129_600, 7 * 86400])
def test_format_reads_back(seconds):
    assert parse_duration(format_duration(seconds)) == seconds


# ---------------------------------------------------------------------- settings objects


def test_variables_take_durations(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OUTBOX_BOOTSTRAP_SERVERS", "h:1")
    monkeypatch.setenv("OUTBOX_SEND_TIMEOUT_SECONDS", "500ms")
    monkeypatch.setenv("OUTBOX_SESSION_TIMEOUT_MS", "10s")
    monkeypatch.setenv("OUTBOX_RETENTION_HOURS", "3d")
    monkeypatch.setenv("OUTBOX_CHECK_INTERVAL_SECONDS", "45")  # the old plain form
    assert ProducerSettings().send_timeout_seconds == 0.5
    checker = CheckerSettings()
    assert (checker.session_timeout_ms, checker.retention_hours) == (10_000, 72.0)
    assert checker.check_interval_seconds == 45.0


def test_a_bad_variable_names_it_and_the_value(monkeypatch: pytest.MonkeyPatch):
    from outbox import LocalTransactionState, TransactionProducer

    class Listener:
        def execute_local_transaction(self, message, arg):
            return LocalTransactionState.COMMIT_MESSAGE

        def check_local_transaction(self, message):
            return LocalTransactionState.COMMIT_MESSAGE

    monkeypatch.setenv("OUTBOX_BOOTSTRAP_SERVERS", "h:1")
    monkeypatch.setenv("OUTBOX_SEND_TIMEOUT_SECONDS", "soon")
    with pytest.raises(ConfigurationError) as caught:
        TransactionProducer("orders", Listener())
    assert (
        f"send_timeout_seconds (OUTBOX_SEND_TIMEOUT_SECONDS): 'soon' is not a duration {HINT}"
        in str(caught.value)
    )


# ---------------------------------------------------------------------- command line


def test_checker_flags_take_durations_and_the_old_plain_numbers(checker_runs):
    app, runs = checker_runs
    base = ["checker", "--bootstrap-servers", "h:1"]
    new = [
        *("--check-interval", "1m30s", "--session-timeout", "10s"),
        *("--retention", "1d12h", "--transaction-timeout", "500ms"),
    ]
    old = [
        *("--check-interval-seconds", "45", "--session-timeout-ms", "7000"),
        *("--retention-hours", "2", "--transaction-timeout-seconds", "1.5"),
    ]
    for args in (new, old):
        result = CliRunner().invoke(app, [*base, *args])
        assert result.exit_code == 0, result.output
    first, second = runs
    assert (first.check_interval_seconds, first.session_timeout_ms) == (90.0, 10_000)
    assert (first.retention_hours, first.transaction_timeout_seconds) == (36.0, 0.5)
    assert (second.check_interval_seconds, second.session_timeout_ms) == (45.0, 7000)
    assert (second.retention_hours, second.transaction_timeout_seconds) == (2.0, 1.5)


CHECKER = ["checker", "--bootstrap-servers", "h:1"]
SINK = [
    "sink",
    "--bootstrap-servers",
    "h:1",
    "--topics",
    "t",
    "--output",
    "/o",
    "--checkpoint",
    "/c",
]


@pytest.mark.parametrize(
    "args,env,named,value",
    [
        ([*CHECKER, "--check-interval", "10x"], {}, "'--check-interval'", "'10x'"),
        ([*CHECKER, "--session-timeout-ms", "6 s s"], {}, "'--session-timeout-ms'", "'6 s s'"),
        (
            CHECKER,
            {"OUTBOX_RETENTION_HOURS": "3 days ago"},
            "'OUTBOX_RETENTION_HOURS'",
            "'3 days ago'",
        ),
        (["db", "prune", "--older-than", "soon"], {}, "'--older-than'", "'soon'"),
        ([*SINK, "--trigger", "1x"], {}, "'--trigger'", "'1x'"),
        (SINK, {"OUTBOX_SINK_TRIGGER": "soon"}, "'OUTBOX_SINK_TRIGGER'", "'soon'"),
        (["dev", "kafka", "start", "--timeout", "ninety"], {}, "'--timeout'", "'ninety'"),
    ],
)
def test_a_bad_duration_is_one_line_naming_the_flag_and_value(args, env, named, value):
    result = outbox(*args, **env)
    assert result.returncode == 2, result.stderr
    error = next(line for line in result.stderr.splitlines() if line.startswith("Error: "))
    assert named in error and f"{value} is not a duration {HINT}" in error, error
    assert "Traceback" not in result.stderr


def test_prune_still_wants_a_unit():
    """``--older-than 7`` never was 7 seconds (nor 7 days): it asks for the unit."""
    result = outbox("db", "prune", "--older-than", "7", "--url", "sqlite://")
    assert result.returncode == 2, result.stderr
    assert f"'7' has no unit {HINT}" in result.stderr
