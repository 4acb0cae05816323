"""Header names of the protocol and typed access to header values.

All outbox headers share the reserved ``outbox-`` prefix; user headers may not
use it, so the outbox headers on a real record are purely additive. Values are
UTF-8 text; numbers are decimal text, readable in any console consumer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from enum import StrEnum

from outbox.protocol.errors import MalformedRecordError

RESERVED_HEADER_PREFIX = "outbox-"

HeaderList = list[tuple[str, bytes | None]]


class Header(StrEnum):
    """Every header the outbox writes. RocketMQ's property names in the comments."""

    KIND = "outbox-kind"
    TRANSACTION_ID = "outbox-transaction-id"  # UNIQ_KEY
    PRODUCER_GROUP = "outbox-producer-group"  # PGROUP
    REAL_TOPIC = "outbox-real-topic"  # REAL_TOPIC
    REAL_PARTITION = "outbox-real-partition"  # REAL_QID
    BORN_MS = "outbox-born-ms"  # born timestamp
    CHECK_TIMES = "outbox-check-times"  # TRANSACTION_CHECK_TIMES
    IMMUNITY_SECONDS = "outbox-check-immunity-seconds"  # CHECK_IMMUNITY_TIME_IN_SECONDS
    END_WINDOW_MS = "outbox-end-window-ms"
    """On a half its producer wrote: how long after the half's born time that producer may
    still end the transaction itself (its transaction timeout). The checker asks about the
    half no sooner, whatever its own transaction timeout: the two settings cannot
    disagree into a check that races the producer's own end."""
    HALF_PARTITION = "outbox-half-partition"
    HALF_OFFSET = "outbox-half-offset"
    RESOLUTION = "outbox-resolution"
    ENDED_MS = "outbox-ended-ms"
    REQUESTED_MS = "outbox-requested-ms"
    DISCARD_REASON = "outbox-discard-reason"
    DISCARD_DETAIL = "outbox-discard-detail"
    DISCARDED_MS = "outbox-discarded-ms"
    DISCARD_PARTITION = "outbox-discard-partition"  # a resume marker names its discard record
    DISCARD_OFFSET = "outbox-discard-offset"
    RESUMED_MS = "outbox-resumed-ms"
    REAL_OFFSET = "outbox-real-offset"  # a resume marker names the real record it published
    ORIGIN_OFFSET = "outbox-origin-offset"
    """On put-back copies, check requests and ops: the offset of the transaction's original
    half in its half partition. (partition, origin offset) is a half's identity: every copy
    and every decision of one send share it, whatever transaction id the caller chose."""
    ORIGIN_STORED_MS = "outbox-origin-stored-ms"
    """On put-back copies: when the broker stored the original half (its log time), so ages
    are measured on the broker's clock and not on the producer's."""
    PARKED_MS = "outbox-parked-ms"
    """On a half the checker wrote for a parked send (``park_when_unavailable``): when the
    checker drained it from the transaction log. Tells it apart from a half the send wrote
    itself and that was stored too late, which carries the same transaction id."""


def is_reserved(name: str) -> bool:
    """Whether a header name belongs to the outbox rather than to the user."""
    return name.lower().startswith(RESERVED_HEADER_PREFIX)


def user_headers(headers: Iterable[tuple[str, bytes | None]]) -> HeaderList:
    """The caller's own headers, in order, with every outbox header removed."""
    return [(name, value) for name, value in headers if not is_reserved(name)]


# ``str(member)`` is a StrEnum's value as a plain str, read in C; ``member.value`` goes
# through a Python descriptor, and a send builds a dozen headers.
def text_header(name: Header, value: str) -> tuple[str, bytes]:
    return (str(name), value.encode("utf-8"))


def int_header(name: Header, value: int) -> tuple[str, bytes]:
    return (str(name), b"%d" % value)


class HeaderReader:
    """Reads typed outbox header values, naming the field in every failure."""

    def __init__(
        self,
        kind: str,
        headers: Sequence[tuple[str, bytes | None]],
        *,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> None:
        self._kind = kind
        # Indexed once: a decode reads up to ten fields, and a checker decodes
        # tens of thousands of halves a second.
        self._values: dict[str, list[bytes | None]] = {}
        for key, value in headers:
            self._values.setdefault(key, []).append(value)
        self._where = {"topic": topic, "partition": partition, "offset": offset}

    def error(self, field: str, problem: str) -> MalformedRecordError:
        return MalformedRecordError(self._kind, field, problem, **self._where)

    def _raw(self, name: Header) -> bytes | None:
        found = self._values.get(name.value, ())
        if not found:
            return None
        if len(found) > 1:
            raise self.error(name.value, f"appears {len(found)} times, expected once")
        if found[0] is None:
            raise self.error(name.value, "has a null value")
        return found[0]

    def optional_text(self, name: Header) -> str | None:
        raw = self._raw(name)
        if raw is None:
            return None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.error(name.value, "is not valid UTF-8") from None
        if not text:
            raise self.error(name.value, "is empty")
        return text

    def text(self, name: Header) -> str:
        text = self.optional_text(name)
        if text is None:
            raise self.error(name.value, "is missing")
        return text

    def optional_integer(self, name: Header, minimum: int = 0) -> int | None:
        text = self.optional_text(name)
        if text is None:
            return None
        if not text.isascii() or not text.lstrip("-").isdigit():
            raise self.error(name.value, f"is not an integer: {text[:40]!r}")
        number = int(text)
        if number < minimum:
            raise self.error(name.value, f"is {number}, below the minimum {minimum}")
        return number

    def integer(self, name: Header, minimum: int = 0) -> int:
        number = self.optional_integer(name, minimum)
        if number is None:
            raise self.error(name.value, "is missing")
        return number
