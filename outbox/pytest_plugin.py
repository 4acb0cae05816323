"""The outbox's pytest fixture, registered through the ``pytest11`` entry point.

A service that depends on ``kafka-outbox`` gets ``outbox_in_memory_producer`` in
its tests with nothing to configure: a factory of started
:class:`~outbox.testing.InMemoryTransactionProducer`\\ s, shut down after the test.
pytest loads this module; the library never imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from outbox.testing import InMemoryTransactionProducer


@pytest.fixture
def outbox_in_memory_producer() -> Iterator[Callable[..., InMemoryTransactionProducer]]:
    """``make(listener, group="test", **options)``: a started in-memory producer.

    ``options`` are :class:`~outbox.testing.InMemoryTransactionProducer`'s
    (``broker``, ``config``, ``key_serializer``, ``value_serializer``, ``clock``...).
    """
    made: list[InMemoryTransactionProducer] = []

    def make(listener: Any, group: str = "test", **options: Any) -> InMemoryTransactionProducer:
        producer = InMemoryTransactionProducer(group, listener, **options)
        made.append(producer)
        return producer.start()

    yield make
    for producer in made:
        producer.shutdown()
