"""How the operator commands (``outbox status``, ``outbox discard``) show times in tables."""

from __future__ import annotations

from datetime import UTC, datetime


def format_age(seconds: float | None) -> str:
    """A short human age: 42s, 5m03s, 2h10m, 3d04h."""
    if seconds is None:
        return "-"
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, mins = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{mins:02d}m"
    days, hrs = divmod(hours, 24)
    return f"{days}d{hrs:02d}h"


def iso_ms(epoch_ms: int | None) -> str:
    """A UTC timestamp to the second, for tables."""
    if epoch_ms is None:
        return "-"
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%SZ")
