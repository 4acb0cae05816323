"""Reading the halves that commit decisions name, for the relay to re-publish.

A decision names its half by offset, and the relay must restore the real record
from that half (RocketMQ's ``EndTransactionProcessor`` looks the half up in the
commit log the same way). Decisions trail their halves closely, so the lookup
reads forward through the half partition and keeps what it read in a bounded
cache: the next batch of decisions mostly names halves already read. Offsets
far apart are read as separate runs rather than through everything between.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

from checker.kafka_reader import TopicCursor
from outbox.protocol import RawRecord

_READ = 500
_GAP = 2_000
"""Needed offsets closer than this are read as one run, through the halves between."""


class HalfLookup:
    """Halves by (partition, offset), read committed, through one cursor and an LRU cache."""

    def __init__(self, cursor: TopicCursor, capacity: int = 20_000) -> None:
        self._cursor = cursor
        self._capacity = capacity
        self._cache: OrderedDict[tuple[int, int], RawRecord] = OrderedDict()

    def fetch(self, partition: int, offsets: Iterable[int]) -> dict[int, RawRecord]:
        """The halves stored at ``offsets``; an offset with no half there is left out."""
        wanted = sorted(set(offsets))
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
        self._cursor.close()

    def forget(self, partition: int) -> None:
        """Drop a partition's cached halves (it moved to another replica)."""
        for key in [key for key in self._cache if key[0] == partition]:
            del self._cache[key]

    def _read_run(self, partition: int, first: int, last: int) -> None:
        position = first
        while position <= last:
            batch = self._cursor.read(partition, position, _READ)
            if not batch:
                return
            for record in batch:
                self._cache[(partition, record.offset)] = record
            position = batch[-1].offset + 1
        while len(self._cache) > self._capacity:
            self._cache.popitem(last=False)
