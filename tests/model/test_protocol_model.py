"""A model of the protocol, checked by Hypothesis against the real pure code.

The rules are what happens to transactions in production: sends (with reused
idempotency keys), local commits and rollbacks, producers dying before their
local transaction or losing their end, time passing, check-backs answered from
the SQL log, the relay consuming decisions, its restarts (the memory rebuilt
from its committed metadata) and the memory's floor rising past old halves.
They drive the real code: :class:`~checker.decision_memory.DecisionMemory` and
:class:`~checker.decision_memory.SharedScan` as the relay uses them, and the
SQL listener's execute and check rules on a real (in-memory SQLite) log table.
Kafka is replaced by lists: what Kafka guarantees (order within a partition,
atomic transactions) is not what is checked here.

After every step: no half published twice, no key published twice, nothing
published whose local transaction did not commit for that very half, the
relay's judgement equal to a replay of the whole op log; and a half past the
grace period always gets an answer (nothing pending for ever).

``make model`` runs a long profile (``OUTBOX_MODEL_EXAMPLES``); the suite a short one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import sqlalchemy as sa
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from outbox_checker.decision_memory import DecisionMemory, SharedScan
from sqlalchemy.orm import sessionmaker
from sqlalchemy.pool import StaticPool

from outbox import LocalTransactionState, Message
from outbox.sql import SqlTransactionListener
from outbox.sql.log import transaction_log_table

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW
GRACE = 60.0
TABLE = "model_log"
KEYS = ["k0", "k1", "k2"]


@dataclass
class Half:
    identity: int
    key: str
    born_s: float
    ran: bool = False
    """Its local transaction ran (whatever it concluded)."""


class ProtocolModel(RuleBasedStateMachine):
    @initialize(capacity=st.integers(2, 4))
    def start(self, capacity: int) -> None:
        self.now = 1_900_000_000.0
        self.engine = sa.create_engine(
            "sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False}
        )
        transaction_log_table(TABLE).create(self.engine)
        self.listener = SqlTransactionListener(
            sessionmaker(self.engine),
            lambda session, message, arg: None,
            group="model",
            table=TABLE,
            grace_seconds=GRACE,
            clock=lambda: self.now,
        )
        self.capacity = capacity
        self.halves: list[Half] = []
        self.ops: list[tuple[int, bool]] = []
        """The op partition: (half identity, is a commit)."""
        self.committed_metadata: str | None = None
        self.committed_position = 0
        self.published: list[int] = []
        self.memory = DecisionMemory(capacity)
        self.position = 0

    def teardown(self) -> None:
        self.engine.dispose()

    # ------------------------------------------------------------ producers

    def _message(self, half: Half) -> Message:
        return Message(
            "events",
            b"v",
            transaction_id=half.key,
            born_ms=int(half.born_s * 1000),
            half_partition=0,
            half_offset=half.identity,
        )

    @rule(key=st.sampled_from(KEYS))
    def send(self, key: str) -> None:
        """A half is stored (its identity: the next half offset); nothing else yet."""
        self.halves.append(Half(len(self.halves) * 2 + 1, key, self.now))

    @precondition(lambda self: any(not h.ran for h in self.halves))
    @rule(data=st.data(), commit=st.booleans(), end_lost=st.booleans())
    def local_transaction(self, data: st.DataObject, commit: bool, end_lost: bool) -> None:
        """A pending half's local transaction runs; its own end may be lost."""
        half = data.draw(st.sampled_from([h for h in self.halves if not h.ran]))
        half.ran = True
        if commit:
            state = self.listener.execute_local_transaction(self._message(half), None)
        else:
            state = ROLLBACK
        if state is not UNKNOW and not end_lost:
            self.ops.append((half.identity, state is COMMIT))

    @rule(seconds=st.sampled_from([1.0, 30.0, GRACE]))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    @precondition(lambda self: self.halves)
    @rule(data=st.data())
    def check(self, data: st.DataObject) -> None:
        """A check-back about any half (the checker asks about every undecided one, and may
        ask again about one whose answer was lost or is still in flight)."""
        half = data.draw(st.sampled_from(self.halves))
        answer = self.listener.check_local_transaction(self._message(half))
        if self.now - half.born_s >= GRACE:
            assert answer is not UNKNOW, "a half past the grace period got no answer"
        if answer is not UNKNOW:
            self.ops.append((half.identity, answer is COMMIT))

    # ------------------------------------------------------------ the relay

    @precondition(lambda self: self.position < len(self.ops))
    @rule(size=st.integers(1, 6), crash=st.booleans())
    def relay_batch(self, size: int, crash: bool) -> None:
        """One relay transaction: judge the next ops, publish first commits, commit the
        offset with the memory's metadata; or crash before the commit (nothing of it)."""
        batch = list(enumerate(self.ops))[self.position : self.position + size]
        memory = self.memory
        wanted = {identity for _, (identity, _) in batch if identity < memory.origin_floor}

        def read(start: int, end: int) -> list[tuple[int, int]]:
            return [(o, self.ops[o][0]) for o in range(start, min(end, len(self.ops)))]

        scan = SharedScan(read, wanted)
        publishing = []
        for offset, (identity, is_commit) in batch:
            if memory.is_first(identity, offset, scan) and is_commit:
                publishing.append(identity)
        next_offset = batch[-1][0] + 1
        memory.shrink(next_offset)
        if crash:  # the Kafka transaction aborts: restart from what was committed
            self._restore()
            return
        self.published.extend(publishing)
        self.position = next_offset
        self.committed_position, self.committed_metadata = next_offset, memory.metadata()

    @rule()
    def relay_restarts(self) -> None:
        self._restore()

    def _restore(self) -> None:
        """What ``Relay._restore`` does: the memory from metadata, then its window re-read."""
        memory = DecisionMemory.from_metadata(self.committed_metadata, self.capacity, 0)
        for offset in range(memory.op_floor, self.committed_position):
            memory.learn(self.ops[offset][0], offset)
        memory.shrink(self.committed_position)
        self.memory, self.position = memory, self.committed_position

    # ------------------------------------------------------------ invariants

    @invariant()
    def each_half_and_each_key_published_at_most_once(self) -> None:
        assert len(self.published) == len(set(self.published))
        keys = [self._half(i).key for i in self.published]
        assert len(keys) == len(set(keys)), f"a key published twice: {keys}"

    @invariant()
    def the_relay_judges_as_a_replay_of_the_whole_op_log(self) -> None:
        first: dict[int, bool] = {}
        for identity, is_commit in self.ops[: self.position]:
            first.setdefault(identity, is_commit)
        assert sorted(self.published) == sorted(i for i, c in first.items() if c)

    @invariant()
    def nothing_published_that_did_not_commit_for_its_half(self) -> None:
        table = transaction_log_table(TABLE)
        with self.engine.connect() as connection:
            rows = {r.transaction_id: r for r in connection.execute(sa.select(table))}
        for identity in self.published:
            row = rows.get(self._half(identity).key)
            assert row is not None and not row.rolled_back, f"half {identity}: no commit"
            assert row.half_offset == identity, f"half {identity} published for another's row"

    def _half(self, identity: int) -> Half:
        return self.halves[(identity - 1) // 2]


_EXAMPLES = int(os.environ.get("OUTBOX_MODEL_EXAMPLES", "40"))
ProtocolModel.TestCase.settings = settings(
    max_examples=_EXAMPLES,
    stateful_step_count=40,
    deadline=None,
    derandomize=_EXAMPLES <= 40,  # the suite's short run is the same every time
)
TestProtocolModel = ProtocolModel.TestCase


def test_a_reused_key_whose_first_attempt_was_rolled_back_can_commit_later() -> None:
    """A step sequence the model found worth keeping as a plain regression."""
    model = ProtocolModel()
    model.start(capacity=2)
    try:
        model.send("k0")
        model.time_passes(GRACE)
        first = model.halves[0]
        assert model.listener.check_local_transaction(model._message(first)) is ROLLBACK
        model.send("k0")
        second = model.halves[1]
        assert model.listener.execute_local_transaction(model._message(second), None) is COMMIT
        assert model.listener.check_local_transaction(model._message(first)) is ROLLBACK
        late = replace(model._message(first), born_ms=int(model.now * 1000))
        assert model.listener.execute_local_transaction(late, None) is ROLLBACK  # id taken
    finally:
        model.teardown()
