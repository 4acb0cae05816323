"""Checker tests reuse the producer tests' topics, listener and producer fixtures."""

from tests.producer.conftest import listener, outbox_topics, producer  # noqa: F401
