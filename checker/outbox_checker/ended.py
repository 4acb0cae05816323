"""Halves known to have an outcome, so their put-back copies are never asked about.

RocketMQ matches ops to halves by queue offset only, so a copy put back just
before its op arrived is checked again (apache/rocketmq#1517, #2117). Ops here
name the half's identity (its partition and origin offset, shared by every
copy); remembering recent ones closes that hole. The transaction id would not
do: it is the caller's to choose, and one reused after a rollback would make the
retry's half look ended. The set is bounded (oldest forgotten first) and rebuilt
from op history after a restart.
"""

from __future__ import annotations

from collections import OrderedDict

HalfIdentity = tuple[int, int]
"""(half partition, origin offset): one half and all its put-back copies."""


class EndedTransactions:
    """A bounded, insertion-ordered set of half identities."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self._capacity = capacity
        self._ids: OrderedDict[HalfIdentity, None] = OrderedDict()

    def add(self, identity: HalfIdentity) -> None:
        self._ids[identity] = None
        self._ids.move_to_end(identity)
        if len(self._ids) > self._capacity:
            self._ids.popitem(last=False)

    def __contains__(self, identity: object) -> bool:
        return identity in self._ids

    def __len__(self) -> int:
        return len(self._ids)
