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
from outbox_checker.errors import ShortHalfRead
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
        """The halves stored at ``offsets``, which the caller knows lie below the partition's
        readable end; an offset the reading passed with no half there is left out (an
        aborted half, or one retention removed).

        A reading that ends before an offset proves nothing about it, so it is never
        reported missing: raises :class:`ShortHalfRead` (the relay reads its batch again
        after a back-off) if a second reading, with a fresh cursor, stops short too. A
        cursor that stood at the end of its partition only takes a short look for what came
        since (0.1 s), which right after a broker restart or freeze can come back empty; and
        under a network partition a cut leader, or a new one whose high watermark trails,
        answers from a log that ends earlier. Both once had the relay discard a committed
        transaction as unpublishable ("its half is not in the half topic").
        """
        wanted = sorted(set(offsets))
        found, unreached = self._read(partition, wanted)
        if unreached:
            self.forget(partition)
            again, unreached = self._read(partition, unreached)
            found.update(again)
        if unreached:
            self.forget(partition)  # the next attempt starts from fresh metadata too
            raise ShortHalfRead(partition, unreached)
        return found

    def _read(self, partition: int, wanted: list[int]) -> tuple[dict[int, RawRecord], list[int]]:
        """The halves found at ``wanted``, and the offsets the reading never got to."""
        found: dict[int, RawRecord] = {}
        missing = []
        for offset in wanted:
            cached = self._cache.get((partition, offset))
            if cached is None:
                missing.append(offset)
            else:
                found[offset] = cached
        unreached: list[int] = []
        start = 0
        while start < len(missing):
            end = start
            while end + 1 < len(missing) and missing[end + 1] - missing[end] <= _GAP:
                end += 1
            reached = self._read_run(partition, missing[start], missing[end])
            for offset in missing[start : end + 1]:
                record = self._cache.get((partition, offset))
                if record is not None:
                    found[offset] = record
                elif offset >= reached:
                    unreached.append(offset)
            start = end + 1
        return found, unreached

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

    def _read_run(self, partition: int, first: int, last: int) -> int:
        """Read ``first``..``last`` into the cache; the offset the reading got to."""
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
                break
            for record in batch:
                self._cache[(partition, record.offset)] = record
            position = batch[-1].offset + 1
            self._read_to[partition] = position
        while len(self._cache) > self._capacity:
            self._cache.popitem(last=False)
        return position
