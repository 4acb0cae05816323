"""The producers take ``settings=``, as the checker and the sink do; ``config=`` still works.

``config`` was the producers' name for their settings object while every other
component said ``settings``. Code written against the old name keeps running, with
a ``DeprecationWarning`` saying what to write instead.
"""

from __future__ import annotations

import pytest

from outbox import (
    AsyncTransactionProducer,
    ConfigurationError,
    ProducerSettings,
    TransactionProducer,
)
from tests.producer.conftest import Awaited, ScriptedListener

PRODUCERS = {"sync": TransactionProducer, "async": AsyncTransactionProducer}


def _listener(kind: str) -> object:
    listener = ScriptedListener()
    return Awaited(listener) if kind == "async" else listener


@pytest.mark.parametrize("kind", PRODUCERS)
def test_settings_by_their_name(kind: str) -> None:
    settings = ProducerSettings(bootstrap_servers="h:1")
    producer = PRODUCERS[kind]("g", _listener(kind), settings=settings)
    assert producer.settings is settings
    assert producer.config is settings


@pytest.mark.parametrize("kind", PRODUCERS)
def test_config_still_works_and_says_its_new_name(kind: str) -> None:
    settings = ProducerSettings(bootstrap_servers="h:1")
    with pytest.warns(DeprecationWarning, match="now settings="):
        producer = PRODUCERS[kind]("g", _listener(kind), config=settings)
    assert producer.settings is settings


@pytest.mark.parametrize("kind", PRODUCERS)
def test_both_names_at_once_is_an_error(kind: str) -> None:
    settings = ProducerSettings(bootstrap_servers="h:1")
    with pytest.raises(ConfigurationError, match="give settings= only"):
        PRODUCERS[kind]("g", _listener(kind), settings, config=settings)
