"""Reading the halves that commit decisions name, for the relay to re-publish.

A decision names its half by offset, and the relay must restore the real record
from that half (RocketMQ's ``EndTransactionProcessor`` looks the half up in the
commit log the same way). Decisions trail their halves closely, so the lookup
reads forward through the half partition and keeps what it read in a bounded
cache: the next batch of decisions mostly names halves already read. Offsets
far apart are read as separate runs rather than through everything between.

Each half partition has a cursor of its own: one cursor moved from partition
to partition re-assigns and starts a cold fetch at every move, which, with a
batch of decisions spread over eight partitions, cost about a second a batch.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable

from outbox.protocol import RawRecord
from outbox_checker.kafka_reader import TopicCursor

_READ = 500
_GAP = 2_000
"""Needed offsets closer than this are read as one run, through the halves between."""


class HalfLookup:
    """Halves by (partition, offset), read committed, a cursor per partition and an LRU cache."""

    def __init__(self, new_cursor: Callable[[], TopicCursor], capacity: int = 20_000) -> None:
        self._new_cursor = new_cursor
        self._cursors: dict[int, TopicCursor] = {}
        self._read_to: dict[int, int] = {}
        """Per partition, the offset its cursor continues from without a seek."""
        self._capacity = capacity
        self._cache: OrderedDict[tuple[int, int], RawRecord] = OrderedDict()

    def fetch(self, partition: int, offsets: Iterable[int]) -> dict[int, RawRecord]:
        """The halves stored at ``offsets``; an offset with no half there is left out.

        An offset the first reading missed is read once more with a fresh
        cursor before it is reported missing: a cursor that stood at the end
        of its partition only takes a short look for what came since (0.1 s),
        and right after a broker restart or freeze that look can come back
        empty although the half is there (a committed transaction was then
        discarded as unpublishable, "its half is not in the half topic").
        """
        wanted = sorted(set(offsets))
        found = self._read(partition, wanted)
        missing = [offset for offset in wanted if offset not in found]
        if missing:
            self.forget(partition)
            found.update(self._read(partition, missing))
        return found

    def _read(self, partition: int, wanted: list[int]) -> dict[int, RawRecord]:
        found: dict[int, RawRecord] = {}
        missing = []
        for offset in wanted:
            cached = self._cache.get((partition, offset))
            if cached is None:
                missing.append(offset)
            else:
                found[offset] = cached
        start = 0
        while start < len(missing):
            end = start
            while end + 1 < len(missing) and missing[end + 1] - missing[end] <= _GAP:
                end += 1
            self._read_run(partition, missing[start], missing[end])
            for offset in missing[start : end + 1]:
                record = self._cache.get((partition, offset))
                if record is not None:
                    found[offset] = record
            start = end + 1
        return found

    def close(self) -> None:
        for cursor in self._cursors.values():
            cursor.close()
        self._cursors.clear()

    def forget(self, partition: int) -> None:
        """Drop a partition's cursor and cached halves (it moved to another replica)."""
        cursor = self._cursors.pop(partition, None)
        self._read_to.pop(partition, None)
        if cursor is not None:
            cursor.close()
        for key in [key for key in self._cache if key[0] == partition]:
            del self._cache[key]

    def _read_run(self, partition: int, first: int, last: int) -> None:
        cursor = self._cursors.get(partition)
        if cursor is None:
            cursor = self._cursors[partition] = self._new_cursor()
        position = first
        warm = self._read_to.get(partition)
        if warm is not None and warm <= first <= warm + _GAP:
            # Read on from where the cursor is (halves between are cached for
            # decisions still to come) rather than seek: a seek costs a cold fetch.
            position = warm
        while position <= last:
            # No more than the run needs: reading on to the end of the partition would
            # wait there for halves not written yet (the cursor's short look, 0.1 s).
            batch = cursor.read(partition, position, min(_READ, last - position + 1))
            if not batch:
                return
            for record in batch:
                self._cache[(partition, record.offset)] = record
            position = batch[-1].offset + 1
            self._read_to[partition] = position
        while len(self._cache) > self._capacity:
            self._cache.popitem(last=False)
