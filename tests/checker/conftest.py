"""Checker tests reuse the producer tests' topics, listener and producer fixtures."""

import pytest

from outbox import TransactionProducer
from tests.checker.test_checker_processes import processes  # noqa: F401
from tests.producer.conftest import listener, outbox_topics, producer  # noqa: F401


@pytest.fixture
def producer_type() -> type[TransactionProducer]:
    """The checker's tests need one producer, the threaded one (tests/producer runs both)."""
    return TransactionProducer
