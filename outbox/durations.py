"""One duration syntax for every option and variable: ``500ms``, ``10s``, ``5m``, ``1d12h``.

The commands had three: the checker's ``--*-seconds`` floats and ``*_ms`` integers,
the sink's ``10s``/``500ms``, and ``outbox db prune``'s ``1d12h``. A user who learnt
one was refused by the next. Every duration now goes through :func:`parse_duration`:
numbers with units, summed (``1d12h``, ``1m30s``), or a plain number read in the
unit the option always had (seconds for ``--check-interval``, milliseconds for
``--session-timeout``, hours for ``--retention``), so values written before still
mean what they meant.

Settings fields declare their unit with :data:`Seconds`, :data:`Milliseconds` or
:data:`Hours`; the command line parses a flag the same way
(:func:`outbox_cli.settings_flags.settings_command`), and its error names the flag.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator

from outbox.errors import ConfigurationError

Unit = Literal["ms", "s", "h"]

HINT = "use 500ms, 10s, 5m, 1d12h"
"""The examples every duration error gives."""

_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_UNIT_NAMES = {
    "ms": "ms|msecs?|milliseconds?",
    "s": "s|secs?|seconds?",
    "m": "m|mins?|minutes?",
    "h": "h|hours?",
    "d": "d|days?",
    "w": "w|weeks?",
}
# One named group per unit, milliseconds before minutes; a unit must not run on into letters.
_PART = re.compile(
    r"\s*(?P<number>\d+(?:\.\d+)?)\s*(?:"
    + "|".join(f"(?P<{unit}>{names})" for unit, names in _UNIT_NAMES.items())
    + r")(?![a-z])",
    re.IGNORECASE,
)
_PLAIN = re.compile(r"\s*[+-]?\d+(?:\.\d+)?\s*")

UNIT_WORDS: dict[str, str] = {"ms": "milliseconds", "s": "seconds", "h": "hours"}


class DurationError(ConfigurationError):
    """Text that is no duration; the message quotes it and gives the examples."""


def parse_duration(text: str | float, unit: Unit | None = "s") -> float:
    """``text`` as an amount of ``unit``: ``"1d12h"`` in hours is 36.0.

    A plain number (``"30"``, or an int or float) is already in ``unit``; with
    ``unit=None`` a plain number is refused, for options where a bare number was
    never accepted and would be ambiguous (``outbox db prune --older-than``).
    """
    if isinstance(text, bool):
        raise DurationError(f"{text!r} is not a duration ({HINT})")
    if isinstance(text, int | float):
        if unit is None:
            raise DurationError(f"{text!r} has no unit ({HINT})")
        return float(text)
    if _PLAIN.fullmatch(text):
        if unit is None:
            raise DurationError(f"{text.strip()!r} has no unit ({HINT})")
        return float(text)
    seconds, position = 0.0, 0
    for match in _PART.finditer(text):
        if match.start() != position:
            break
        unit_found = next(name for name in _UNIT_NAMES if match[name])
        seconds += float(match["number"]) * _UNIT_SECONDS[unit_found]
        position = match.end()
    if position == 0 or text[position:].strip():
        raise DurationError(f"{text!r} is not a duration ({HINT})")
    return seconds / _UNIT_SECONDS[unit or "s"]


def _reader(unit: Unit) -> BeforeValidator:
    def read(value: Any) -> Any:
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            amount = parse_duration(value, unit)
            return round(amount) if unit == "ms" else amount
        return value

    read.duration_unit = unit  # type: ignore[attr-defined]
    return BeforeValidator(read)


Seconds = Annotated[float, _reader("s")]
"""A settings field holding seconds that also takes ``500ms``, ``5m``, ``1d12h``."""
Milliseconds = Annotated[int, _reader("ms")]
"""A settings field holding milliseconds that also takes ``10s``, ``1m``."""
Hours = Annotated[float, _reader("h")]
"""A settings field holding hours that also takes ``30m``, ``3d``."""


def duration_unit(metadata: list[Any]) -> Unit | None:
    """The unit of a settings field declared with :data:`Seconds`, :data:`Milliseconds`
    or :data:`Hours` (pydantic keeps the validator in the field's metadata), else None."""
    for item in metadata:
        unit = getattr(getattr(item, "func", None), "duration_unit", None)
        if unit is not None:
            return unit  # type: ignore[no-any-return]
    return None


def in_seconds(amount: float, unit: Unit) -> float:
    """An amount of ``unit`` in seconds."""
    return amount * _UNIT_SECONDS[unit]


def format_duration(seconds: float) -> str:
    """Seconds in the same syntax, largest units first: 129600 is ``1d12h``, 0.5 is ``500ms``."""
    if seconds == 0:
        return "0s"
    left = round(seconds * 1000)
    parts = []
    for unit in ("d", "h", "m", "s", "ms"):
        size = round(_UNIT_SECONDS[unit] * 1000)
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    return "".join(parts)
