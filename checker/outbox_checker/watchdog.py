"""Calls into librdkafka that may outlive their own timeouts, bounded from outside.

A transactional producer that lived through a broker restart can block in
``send_offsets_to_transaction`` far past the timeout it was given (seen with
librdkafka 2.16, for minutes). The checker's writers cannot wait that long: a
round would never end, and the relay would stop publishing. So their
transactions run in a thread of their own with a deadline; past it the caller
gives up on that attempt, and replaces its producer, whose
``init_transactions`` fences the stuck one so it can never commit late.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from outbox_checker.errors import StuckError

T = TypeVar("T")


def call_with_deadline(call: Callable[[], T], seconds: float, name: str) -> T:
    """``call()``'s result or exception, or :class:`StuckError` after ``seconds``."""
    outcome: list[T] = []
    failure: list[BaseException] = []

    def attempt() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:
            failure.append(exc)

    worker = threading.Thread(target=attempt, name=name, daemon=True)
    worker.start()
    worker.join(seconds)
    if failure:
        raise failure[0]
    if not outcome:
        raise StuckError(f"{name} did not return within {seconds:g}s")
    return outcome[0]
