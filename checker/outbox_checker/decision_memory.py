"""Which halves of one partition already have a decision: exact, bounded, rebuilt from Kafka.

The relay publishes a half's real record on the *first* decision for it and
nothing on any later one (a late own end, a second check answer, a database
resolution). "First" is a fact about the op partition: every decision for a
half of partition p is an op record on op partition p, in the order the relay
reads them. So the memory needed is the set of half identities (origin offsets,
see :meth:`outbox.protocol.HalfRecord.identity`) with an op before the relay's
position. Kept whole it would grow without end; this keeps it exact anyway:

- a *window* holds every identity at or above ``origin_floor`` that has an op,
  with the offset of its first op;
- the invariant "every op naming an identity at or above ``origin_floor`` lies
  at op offset ``op_floor`` or later" lets the window drop its lowest
  identities when it is full: the new floor's ``op_floor`` is the first op of
  the identities kept. Dropped floors go into a short ``index`` (coarsened, so
  it stays short: a lower bound for a higher identity is still a bound);
- a decision for an identity below the floor (rare: a decision days late) is
  judged by scanning the op partition from the index's bound up to that op.
  A burst of them (a ``discard resume --all``, a database resolver catching
  up) shares one scan per batch (:class:`SharedScan`): judged one by one,
  each would reread the history, and the batch could outlast the poll
  interval, be rewound and repeat for ever.

The floor and the index ride in the metadata of the relay's committed offset,
written in the same Kafka transaction as the records published, so a restarted
or newly assigned relay rebuilds the window exactly by re-reading the op
partition from ``op_floor`` to the committed offset.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

_FORMAT = "relay1"
MAX_INDEX = 24
"""Index entries kept; with the floor they fit Kafka's default 4 KiB offset metadata."""

Scan = Callable[[int, int, int], bool]
"""``scan(identity, from_offset, to_offset)``: whether an op in [from, to) decides ``identity``."""

ReadOps = Callable[[int, int], Iterable[tuple[int, int]]]
"""``read(from_offset, to_offset)``: (op offset, identity) of each decision in [from, to)."""


class SharedScan:
    """One reading of an op partition's history, shared by the below-floor decisions of a batch.

    Only ``wanted`` identities (the batch's decisions below the floor) are noted,
    so what it holds is bounded by the batch. The first question reads the whole
    ``span`` the batch needs; a question beyond it widens the range read, never
    rereads it: a batch reads each op of the history at most once.
    """

    def __init__(
        self, read: ReadOps, wanted: Collection[int], span: tuple[int, int] | None = None
    ) -> None:
        """``span``: the range the batch's questions will cover, read at the first one."""
        self._read = read
        self._wanted = set(wanted)
        self._span = span
        self._range: tuple[int, int] | None = None
        self._first: dict[int, int] = {}

    def __call__(self, identity: int, start: int, end: int) -> bool:
        """A :data:`Scan`: whether an op in [start, end) decides ``identity``.

        ``start`` is the memory's lower bound: no op before it names ``identity``.
        """
        if identity not in self._wanted:
            raise ValueError(f"identity {identity} was not announced to this scan")
        self._cover(start, end)
        first = self._first.get(identity)
        return first is not None and start <= first < end

    def _cover(self, start: int, end: int) -> None:
        if self._range is None:
            if self._span is not None:
                start, end = min(start, self._span[0]), max(end, self._span[1])
            self._note(start, end)
            self._range = (start, end)
            return
        low, high = self._range
        if start < low:
            self._note(start, low)
        if end > high:
            self._note(high, end)
        self._range = (min(low, start), max(high, end))

    def _note(self, start: int, end: int) -> None:
        for offset, identity in self._read(start, end):
            if identity in self._wanted and offset < self._first.get(identity, end + 1):
                self._first[identity] = offset


@dataclass
class DecisionMemory:
    """First decisions of one op partition; see the module docs for why it is exact."""

    capacity: int
    origin_floor: int = 0
    op_floor: int = 0
    index: list[tuple[int, int]] = field(default_factory=list)
    """Older (origin floor, op floor) pairs, ascending."""
    _first: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.capacity < 2:
            raise ValueError(f"capacity must be at least 2, got {self.capacity}")

    def __len__(self) -> int:
        return len(self._first)

    def learn(self, identity: int, op_offset: int) -> None:
        """Note an op read while rebuilding (ops before the committed position)."""
        if identity >= self.origin_floor and identity not in self._first:
            self._first[identity] = op_offset

    def is_first(self, identity: int, op_offset: int, scan: Scan) -> bool:
        """Whether the op at ``op_offset`` is the first decision of ``identity``; remembers it.

        ``scan`` is called only for an identity below the window's floor.
        """
        if identity >= self.origin_floor:
            if identity in self._first:
                return False
            self._first[identity] = op_offset
            return True
        return not scan(identity, self.lower_bound(identity), op_offset)

    def lower_bound(self, identity: int) -> int:
        """An op offset before which no op names ``identity`` (for one below the floor)."""
        position = bisect.bisect_right(self.index, (identity, float("inf"))) - 1
        return self.index[position][1] if position >= 0 else 0

    def shrink(self, next_offset: int) -> None:
        """Drop the lowest quarter of the window once it holds more than ``capacity``.

        ``next_offset`` is the op offset the relay reads next: the floor's op
        offset when no identity is left in the window.
        """
        if len(self._first) <= self.capacity:
            return
        identities = sorted(self._first)
        new_floor = identities[len(identities) - (self.capacity * 3) // 4]
        kept = {i: o for i, o in self._first.items() if i >= new_floor}
        self.index.append((self.origin_floor, self.op_floor))
        while len(self.index) > MAX_INDEX:
            del self.index[1::2]  # every other entry: the bounds left stay valid, only looser
        self.origin_floor = new_floor
        self.op_floor = min(kept.values(), default=next_offset)
        self._first = kept

    def metadata(self) -> str:
        """The floor and the index, for the relay's committed offset."""
        pairs = ",".join(f"{o}:{w}" for o, w in self.index)
        return f"{_FORMAT};o={self.origin_floor};w={self.op_floor};i={pairs}"

    @classmethod
    def from_metadata(cls, metadata: str | None, capacity: int, low_offset: int) -> DecisionMemory:
        """The memory a committed offset describes, before its window is re-read.

        No metadata (a first start): nothing is decided yet and the window starts
        at the partition's first op. Unreadable metadata is refused rather than
        guessed at: a wrong floor would publish a half twice.
        """
        if not metadata:
            return cls(capacity, 0, low_offset)
        parts = dict(part.split("=", 1) for part in metadata.split(";")[1:] if "=" in part)
        if not metadata.startswith(_FORMAT + ";") or not {"o", "w", "i"} <= parts.keys():
            raise ValueError(f"relay checkpoint metadata not understood: {metadata[:80]!r}")
        index = [
            (int(o), int(w)) for o, w in (pair.split(":") for pair in parts["i"].split(",") if pair)
        ]
        return cls(capacity, int(parts["o"]), max(int(parts["w"]), low_offset), index)
