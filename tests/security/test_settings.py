"""The security block: one set of fields, read the same way by every component, checked
as a whole, translated into both clients' names, and never showing a password."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from pydantic import ValidationError
from typer.testing import CliRunner

from outbox.config import KafkaSettings
from outbox.errors import ConfigurationError
from outbox.settings import ProducerSettings
from outbox_checker.settings import CheckerSettings
from outbox_cli import app
from outbox_cli.settings_flags import settings_from_flags
from outbox_devtools import config_reference
from spark_sink.settings import SinkSettings

PASSWORD = 'pa$$w"ord-4711'
SASL = {
    "bootstrap_servers": "127.0.0.1:9093",
    "security_protocol": "SASL_SSL",
    "sasl_username": "orders-producer",
    "sasl_password": PASSWORD,
}
SINK_PATHS = {"topics": "orders", "output": "/tmp/table", "checkpoint": "/tmp/checkpoint"}


@pytest.fixture
def ca_file(tmp_path: Path) -> Path:
    path = tmp_path / "ca.pem"
    path.write_text("-----BEGIN CERTIFICATE-----\n")
    return path


def test_librdkafka_and_java_names_of_one_block(ca_file: Path):
    settings = ProducerSettings(**SASL, ssl_ca_file=ca_file)
    assert settings.client_config()["sasl.password"] == PASSWORD
    assert {k: v for k, v in settings.client_config().items() if k != "logger"} == {
        "bootstrap.servers": "127.0.0.1:9093",
        "security.protocol": "sasl_ssl",
        "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "orders-producer",
        "sasl.password": PASSWORD,
        "ssl.ca.location": str(ca_file),
        "ssl.endpoint.identification.algorithm": "https",
    }
    assert settings.java() == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required"
        ' username="orders-producer" password="pa$$w\\"ord-4711";',
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(ca_file),
        "ssl.endpoint.identification.algorithm": "https",
    }
    assert settings.principal == "User:orders-producer"


def test_plaintext_adds_nothing_and_pass_through_properties_win():
    assert "security.protocol" not in KafkaSettings(bootstrap_servers="a:1").client_config()
    settings = KafkaSettings(**SASL, kafka_properties={"sasl.mechanisms": "PLAIN"})
    assert settings.client_config()["sasl.mechanisms"] == "PLAIN"


def test_the_sink_reads_the_shared_variables_and_its_own_win(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OUTBOX_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("OUTBOX_SASL_USERNAME", "shared")
    monkeypatch.setenv("OUTBOX_SINK_SASL_USERNAME", "sink-user")
    monkeypatch.setenv("OUTBOX_SASL_PASSWORD", PASSWORD)
    sink = SinkSettings(bootstrap_servers="a:1", **SINK_PATHS)
    assert sink.sasl_username == "sink-user"
    options = sink.java_kafka_properties()
    assert 'username="sink-user"' in options["sasl.jaas.config"]
    assert CheckerSettings(bootstrap_servers="a:1").sasl_username == "shared"


@pytest.mark.parametrize(
    "values,fragment",
    [
        ({"security_protocol": "SASL_SSL", "sasl_username": "u"}, "needs sasl_password"),
        (
            {"security_protocol": "SASL_PLAINTEXT"},
            "security protocol SASL_PLAINTEXT needs sasl_username and sasl_password",
        ),
        ({"sasl_username": "u"}, "does not use SASL; use SASL_SSL or SASL_PLAINTEXT"),
        (
            {"security_protocol": "SSL", "ssl_ca_file": "/no/such/ca.pem"},
            "'/no/such/ca.pem' does not",
        ),
        ({"ssl_ca_file": __file__}, "does not use TLS; use SSL or SASL_SSL"),
        (
            {"security_protocol": "SSL", "ssl_certificate_file": __file__},
            "give ssl_certificate_file and ssl_key_file together",
        ),
        ({"security_protocol": "TLS"}, "security_protocol (OUTBOX_SECURITY_PROTOCOL)"),
        ({"sasl_mechanism": "GSSAPI"}, "sasl_mechanism (OUTBOX_SASL_MECHANISM)"),
    ],
)
def test_bad_combinations_are_one_clear_line(values: dict[str, str], fragment: str):
    with pytest.raises(ConfigurationError) as caught:
        settings_from_flags(ProducerSettings, {"bootstrap_servers": "a:1", **values})
    assert fragment in str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_password_is_in_no_repr_error_or_log(caplog: pytest.LogCaptureFixture):
    settings = CheckerSettings(**SASL)
    sink = SinkSettings(**SASL, **SINK_PATHS)
    shown = [repr(settings), str(settings), repr(sink), settings.model_dump_json(), str(sink)]
    with pytest.raises(ValidationError) as caught:
        ProducerSettings(**{**SASL, "sasl_username": ""})
    shown.append(str(caught.value))
    with pytest.raises(ConfigurationError) as flagged:
        settings_from_flags(ProducerSettings, {**SASL, "sasl_username": "", "check_threads": 0})
    shown.append(str(flagged.value))
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("outbox").info("settings %s %r", settings, sink)
    shown.append(caplog.text)
    for text in shown:
        assert PASSWORD not in text
    assert "sasl_password" not in repr(settings)


def test_the_password_is_in_no_help_screen_or_config_reference(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OUTBOX_SASL_PASSWORD", PASSWORD)
    monkeypatch.setenv("OUTBOX_SINK_SASL_PASSWORD", PASSWORD)
    runner = CliRunner()
    admin_commands = (["topics", "create"], ["topics", "describe"], ["status"], ["discard", "list"])
    for command in (
        ["checker", "--help"],
        ["sink", "--help"],
        *([*c, "--help"] for c in admin_commands),
    ):
        result = runner.invoke(app, command, env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        assert "--sasl-password" in result.output
        assert PASSWORD not in result.output
    reference = config_reference.render(typer.main.get_command(app))
    assert "OUTBOX_SASL_PASSWORD" in reference
    assert PASSWORD not in reference


def test_a_cli_error_with_a_password_set_is_one_line_without_it():
    env = {
        **os.environ,
        "OUTBOX_BOOTSTRAP_SERVERS": "127.0.0.1:9",
        "OUTBOX_SECURITY_PROTOCOL": "SASL_SSL",
        "OUTBOX_SASL_PASSWORD": PASSWORD,
    }
    done = subprocess.run(
        [sys.executable, "-m", "outbox", "checker", "--http-address", ""],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "outbox: error: invalid settings: security protocol SASL_SSL needs sasl_username"
        " (mechanism SCRAM-SHA-512)"
    ]
