"""librdkafka's own log lines, held back when they repeat.

While a broker is away every client retries every connection many times a second,
and librdkafka logs each attempt (``FAIL ... Connection refused``) at ERROR: one
checker gave about 58 lines a second, 3 485 a minute, for as long as the broker was
down, burying the lines that say something. :class:`RepeatedLineFilter` lets the
first of each line through, holds back the same line from any client for a while,
then lets it through again saying how many like it were held back, so an outage
reads as a handful of lines that still name every broker that cannot be reached.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable

REPEAT_WINDOW_SECONDS = 30.0
"""How long a line is held back after it was let through."""

_CLIENT = re.compile(r"\[rdkafka#[\w-]+\] ")
"""The client's name (``[rdkafka#consumer-11] ``): twelve clients saying one thing is one line."""
_DURATION = re.compile(r"\d+ ?ms\b")
"""Timings in a line (``after 0ms``, ``after 6008 ms``), which differ between repeats."""
_KEPT_LINES = 1000
"""Distinct lines remembered at most; the oldest are forgotten first."""


def line_shape(message: str) -> str:
    """``message`` without what differs between two repeats of one failure.

    Broker addresses and node ids are kept: a cluster with two nodes down says so twice.
    """
    return _DURATION.sub("N ms", _CLIENT.sub("", message))


class RepeatedLineFilter(logging.Filter):
    """A line through, the same line (by :func:`line_shape`) held back for ``window`` s."""

    def __init__(
        self,
        window: float = REPEAT_WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.window = window
        self._clock = clock
        self._lock = threading.Lock()
        self._shown: dict[tuple[int, str], tuple[float, int]] = {}
        """(level, shape) -> (when it was last let through, how many held back since)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.INFO:
            return True  # a ``debug=`` trace is asked for line by line
        key = (record.levelno, line_shape(record.getMessage()))
        now = self._clock()
        with self._lock:
            shown = self._shown.pop(key, None)  # popped and put back: the newest last
            if shown is not None and now - shown[0] < self.window:
                self._shown[key] = (shown[0], shown[1] + 1)
                return False
            self._shown[key] = (now, 0)
            while len(self._shown) > _KEPT_LINES:
                del self._shown[next(iter(self._shown))]
        held = shown[1] if shown is not None else 0
        if held:
            record.msg = f"{record.getMessage()} ({held} more like it since last shown)"
            record.args = ()
        return True


def hold_back_repeats(logger: logging.Logger) -> None:
    """Give ``logger`` a :class:`RepeatedLineFilter` unless it has one; idempotent."""
    if not any(isinstance(existing, RepeatedLineFilter) for existing in logger.filters):
        logger.addFilter(RepeatedLineFilter())
