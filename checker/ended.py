"""Transaction ids known to have an outcome, so their put-back copies are never asked about.

RocketMQ matches ops to halves by queue offset only, so a copy put back just
before its op arrived is checked again (apache/rocketmq#1517, #2117). Ops here
carry the transaction id; remembering recent ones closes that hole. The set is
bounded (oldest forgotten first) and rebuilt from op history after a restart.
"""

from __future__ import annotations

from collections import OrderedDict


class EndedTransactions:
    """A bounded, insertion-ordered set of transaction ids."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self._capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()

    def add(self, transaction_id: str) -> None:
        self._ids[transaction_id] = None
        self._ids.move_to_end(transaction_id)
        if len(self._ids) > self._capacity:
            self._ids.popitem(last=False)

    def __contains__(self, transaction_id: object) -> bool:
        return transaction_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)
