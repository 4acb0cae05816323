"""``outbox sink``'s generated flags: which value wins, and what ``--help`` shows.

The command runs as a user runs it, through typer, but with
``spark_sink.job.run_sink`` replaced by a stub that keeps the settings it was
given, so no Spark driver starts: these tests are about the command line alone.
"""

from __future__ import annotations

import os
import types
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from outbox.errors import ConfigurationError
from outbox_cli import app
from spark_sink.cli import run_standalone
from spark_sink.settings import SinkSettings

SOURCE = ["--topics", "orders", "--output", "/data/table", "--checkpoint", "/data/checkpoint"]


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[SinkSettings]:
    """The settings each sink run got, in an environment without OUTBOX_* variables
    and without a dev broker to fall back on."""
    for name in list(os.environ):
        if name.startswith("OUTBOX_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("OUTBOX_DEV_HOME", str(tmp_path / "no-dev-broker"))
    seen: list[SinkSettings] = []

    def run_sink(settings: SinkSettings, on_progress: Any = None) -> Any:
        seen.append(settings)
        return types.SimpleNamespace(line=lambda: "sink: batches=0")

    monkeypatch.setattr("spark_sink.job.run_sink", run_sink)
    return seen


def sink(*args: str) -> Result:
    return CliRunner().invoke(app, ["sink", *args], env={"COLUMNS": "300"})


def run_with(runs: list[SinkSettings], *args: str) -> SinkSettings:
    result = sink(*args)
    assert result.exit_code == 0, result.output
    return runs[-1]


# field, a flag for it, the sink's variable, the shared variable, a valid value per source
SHARED_FIELDS = [
    pytest.param(
        "bootstrap_servers",
        "--bootstrap",
        "OUTBOX_SINK_BOOTSTRAP_SERVERS",
        "OUTBOX_BOOTSTRAP_SERVERS",
        "{}:9092",
        id="bootstrap",
    ),
    pytest.param(
        "topic_prefix",
        "--prefix",
        "OUTBOX_SINK_TOPIC_PREFIX",
        "OUTBOX_TOPIC_PREFIX",
        "{}-prefix",
        id="prefix",
    ),
]


@pytest.mark.parametrize(("field", "flag", "own", "shared", "value"), SHARED_FIELDS)
@pytest.mark.parametrize(
    ("sources", "winner"),
    [
        (("flag", "own", "shared"), "flag"),
        (("own", "shared"), "own"),
        (("shared",), "shared"),
    ],
)
def test_flag_then_sink_variable_then_shared_variable(
    runs: list[SinkSettings],
    monkeypatch: pytest.MonkeyPatch,
    field: str,
    flag: str,
    own: str,
    shared: str,
    value: str,
    sources: tuple[str, ...],
    winner: str,
) -> None:
    if field != "bootstrap_servers":
        monkeypatch.setenv("OUTBOX_BOOTSTRAP_SERVERS", "broker:9092")
    for source, variable in (("own", own), ("shared", shared)):
        if source in sources:
            monkeypatch.setenv(variable, value.format(source))
    args = [flag, value.format("flag")] if "flag" in sources else []

    settings = run_with(runs, *SOURCE, *args)

    assert getattr(settings, field) == value.format(winner)


def test_without_any_source_the_defaults_apply(runs: list[SinkSettings]) -> None:
    settings = run_with(runs, *SOURCE, "--bootstrap", "broker:9092")

    given = {"bootstrap_servers", "topics", "output", "checkpoint"}
    for name, info in SinkSettings.model_fields.items():
        if name not in given:
            assert getattr(settings, name) == info.get_default(call_default_factory=True), name
    assert settings.topic_prefix == "outbox"


def test_no_bootstrap_anywhere_says_how_to_give_one(runs: list[SinkSettings]) -> None:
    result = sink(*SOURCE)

    assert isinstance(result.exception, ConfigurationError)
    assert str(result.exception) == (
        "no Kafka to talk to: pass --bootstrap-servers HOST:PORT, set "
        "OUTBOX_SINK_BOOTSTRAP_SERVERS or OUTBOX_BOOTSTRAP_SERVERS, or start a local broker "
        "with `outbox dev kafka start`"
    )
    assert runs == []


def test_old_and_generated_spellings_and_model_parsing(runs: list[SinkSettings]) -> None:
    settings = run_with(
        runs,
        "--bootstrap-servers", "broker:9092",
        "--topic-prefix", "shop",
        "--topics", "orders, payments",
        "--output", "/t", "--checkpoint", "/c",
        "--kafka-timeout-seconds", "2",
        "-X", "security.protocol=SSL",
        "--kafka-property", "ssl.ca.location=/ca.pem",
        "--conf", "spark.ui.enabled=false",
        "--trigger", "500ms",
        "--dedup-window", "7d",
        "--state-store", "memory",
        "--no-fail-on-data-loss",
        "--once",
        "--max-offsets-per-trigger", "1000",
    )  # fmt: skip

    assert settings.bootstrap_servers == "broker:9092"
    assert settings.topic_prefix == "shop"
    assert settings.topics == ("orders", "payments")
    assert settings.kafka_timeout_seconds == 2
    assert settings.kafka_options == {"security.protocol": "SSL", "ssl.ca.location": "/ca.pem"}
    assert settings.spark_conf == {"spark.ui.enabled": "false"}
    assert (settings.trigger, settings.dedup_window) == (0.5, 7 * 86400)
    assert settings.state_store == "memory"
    assert settings.fail_on_data_loss is False
    assert settings.once is True
    assert settings.max_offsets_per_trigger == 1000
    old_spelling = run_with(runs, *SOURCE, "--bootstrap", "b:1", "--kafka-timeout", "3")
    assert old_spelling.kafka_timeout_seconds == 3


def test_variables_are_parsed_by_the_model(
    runs: list[SinkSettings], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTBOX_BOOTSTRAP_SERVERS", "broker:9092")
    monkeypatch.setenv("OUTBOX_SINK_TRIGGER", "1m")
    monkeypatch.setenv("OUTBOX_SINK_ONCE", "true")
    monkeypatch.setenv("OUTBOX_SINK_FAIL_ON_DATA_LOSS", "false")
    monkeypatch.setenv("OUTBOX_SINK_KAFKA_OPTIONS", '{"security.protocol": "SSL"}')

    settings = run_with(runs, *SOURCE)

    assert settings.trigger == 60
    assert settings.once is True and settings.fail_on_data_loss is False
    assert settings.kafka_options == {"security.protocol": "SSL"}
    assert run_with(runs, *SOURCE, "--trigger", "5s", "--no-once").trigger == 5
    assert runs[-1].once is False


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (
            ("--topics", "a"),
            {"OUTBOX_BOOTSTRAP_SERVERS": "nohost"},
            "bootstrap_servers (OUTBOX_SINK_BOOTSTRAP_SERVERS or OUTBOX_BOOTSTRAP_SERVERS): "
            "expected host:port",
        ),
        (("--topics", "a", "-X", "novalue"), {}, "--kafka-property: Kafka property 'novalue'"),
        (("--topics", "a", "--state-store", "disk"), {}, "OUTBOX_SINK_STATE_STORE"),
        (("--topics", "outbox.half"), {}, "outbox protocol topics"),
        (("--topics", "a", "--pattern", "b.*"), {}, "exactly one of topics"),
    ],
)
def test_bad_values_are_one_error_naming_the_variable(
    runs: list[SinkSettings],
    monkeypatch: pytest.MonkeyPatch,
    args: tuple[str, ...],
    env: dict[str, str],
    message: str,
) -> None:
    monkeypatch.setenv("OUTBOX_BOOTSTRAP_SERVERS", "broker:9092")
    for name, value in env.items():
        monkeypatch.setenv(name, value)

    result = sink("--output", "/t", "--checkpoint", "/c", *args)

    assert isinstance(result.exception, ConfigurationError), result.output
    assert message in str(result.exception)
    assert runs == []


def test_help_shows_each_default_and_variable(runs: list[SinkSettings]) -> None:
    result = sink("--help")

    assert result.exit_code == 0
    for shown in (
        "[default: parquet]",
        "[default: earliest]",
        "[default: rocksdb]",
        "[default: 10]",
        "[default: 3600]",
        "[default: 8]",
        "[default: outbox]",
        "[default: 30]",
        "[default: fail-on-data-loss]",
        "[default: no-once]",
        "[default: WARNING]",
        "OUTBOX_SINK_BOOTSTRAP_SERVERS, OUTBOX_BOOTSTRAP_SERVERS",
        "OUTBOX_SINK_TOPIC_PREFIX, OUTBOX_TOPIC_PREFIX",
        "local[*]",
    ):
        assert shown in result.output, shown
    for name in SinkSettings.model_fields:
        assert f"OUTBOX_SINK_{name.upper()}" in result.output, name


def test_spark_submit_takes_the_same_flags(
    runs: list[SinkSettings], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as ran:
        run_standalone([*SOURCE, "--bootstrap", "broker:9092", "--trigger", "2s"])
    assert ran.value.code == 0
    assert runs[-1].trigger == 2 and runs[-1].topics == ("orders",)

    with pytest.raises(SystemExit) as failed:
        run_standalone(SOURCE)
    assert failed.value.code == 1
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            "outbox: error: no Kafka to talk to: pass --bootstrap-servers HOST:PORT, set "
            "OUTBOX_SINK_BOOTSTRAP_SERVERS or OUTBOX_BOOTSTRAP_SERVERS, or start a local broker "
            "with `outbox dev kafka start`"
        )
    )
