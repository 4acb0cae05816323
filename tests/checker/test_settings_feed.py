"""Each checker default is written once: in ``CheckerSettings``, which the rules and the relay take.

The rounds' ``RoundRules`` and the relay's ``RelaySettings`` are built from the
settings; standing alone (tests, benchmarks) they take the settings' defaults. The
transaction timeout, which producer and checker must agree on, is one constant.
"""

from __future__ import annotations

import dataclasses

import pytest

from outbox import ProducerSettings
from outbox.protocol import TRANSACTION_TIMEOUT_SECONDS
from outbox_checker.relay import RelaySettings
from outbox_checker.rules import RoundRules
from outbox_checker.settings import CheckerSettings

CHANGED = {
    "transaction_timeout_seconds": 7.5,
    "check_max": 4,
    "max_process_seconds": 9.0,
    "op_read_batch": 5,
    "max_ops_per_round": 77,
    "retention_hours": 2.0,
    "relay_batch": 9,
    "relay_memory": 1234,
    "relay_transaction_timeout_ms": 4321,
    "session_timeout_ms": 7000,
}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in CheckerSettings.model_fields:
        monkeypatch.delenv(f"OUTBOX_{name.upper()}", raising=False)


def test_the_rules_and_the_relay_take_every_setting_they_read(clean_env: None) -> None:
    settings = CheckerSettings(bootstrap_servers="localhost:9092", **CHANGED)
    rules = RoundRules.from_settings(settings)
    relay = RelaySettings.from_settings(settings)
    assert rules.transaction_timeout_ms == 7_500
    assert (rules.check_max, rules.op_read_batch, rules.max_ops_per_round) == (4, 5, 77)
    assert (rules.max_process_ms, rules.retention_ms) == (9_000, 2 * 3_600_000)
    assert (relay.batch, relay.memory, relay.transaction_timeout_ms) == (9, 1234, 4321)
    assert relay.session_timeout_ms == 7000


def test_standing_alone_they_take_the_settings_defaults(clean_env: None) -> None:
    settings = CheckerSettings(bootstrap_servers="localhost:9092")
    assert RoundRules() == RoundRules.from_settings(settings)
    assert RelaySettings() == RelaySettings.from_settings(settings)


def test_the_defaults_read_no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The environment sets a running checker, not the defaults of every rules object."""
    monkeypatch.setenv("OUTBOX_CHECK_MAX", "3")
    assert CheckerSettings(bootstrap_servers="localhost:9092").check_max == 3
    assert RoundRules().check_max == CheckerSettings.model_fields["check_max"].default


def test_producer_and_checker_default_to_one_transaction_timeout() -> None:
    fields = (ProducerSettings.model_fields, CheckerSettings.model_fields)
    defaults = {f["transaction_timeout_seconds"].default for f in fields}
    assert defaults == {TRANSACTION_TIMEOUT_SECONDS}


def test_no_knob_of_the_rules_is_left_out_of_the_builder() -> None:
    """A field added to RoundRules or RelaySettings is either set from the settings or
    one of the few that are not settings at all."""
    not_settings = {
        "chunk_size",
        "pending_scan_limit",
        "timeout",
        "silence_seconds",
        "transaction_deadline",
        "recheck_after_ms",  # set per early round, from check_interval_seconds
    }
    settings = CheckerSettings.model_construct(**CHANGED)
    for built in (RoundRules.from_settings(settings), RelaySettings.from_settings(settings)):
        default = type(built)()
        same = {
            f.name
            for f in dataclasses.fields(built)
            if getattr(built, f.name) == getattr(default, f.name)
        }
        assert same <= not_settings, f"{type(built).__name__} ignores the settings of {same}"
