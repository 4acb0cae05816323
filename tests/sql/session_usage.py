"""Ways people use a SQLAlchemy session around ``producer.transaction(...)``, generated and played.

``txn.join(session)`` promises that the decision follows what the database did
with the log row, however the application drives its session. Reviews found the
ORM's session events lie about that in ordinary code (a savepoint released then
the outer block raising; a session bound to an outer connection whose
transaction rolls back; a commit through ``session.connection()``), so this
module does not enumerate cases: :func:`usages` generates programs from a small
grammar of what services write (``session.begin()``, ``begin_nested()`` at any
depth, flushes, errors anywhere, every way of committing or not, the outbox
block inside or outside the session's scope, one or two sends in one session),
and :class:`Harness` plays each on a real broker and database and judges it by
the database alone:

- a send whose producer wrote COMMIT must have its log row (and its order row)
  committed, one that wrote ROLLBACK must not;
- a send left to the check-back is asked as the checker would, past the grace
  period, and the answer must match the database;
- at the end (:meth:`Harness.settle`) every undecided half is put back and asked
  for real, and the relay must have published exactly the committed sends, once.

The same program runs on the sync ``Session`` and the ``AsyncSession``: one
interpreter, written as a coroutine that awaits only what is awaitable, so the
sync form runs it without an event loop (:func:`_drive`).
"""

from __future__ import annotations

import inspect
import time
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable
from contextlib import AsyncExitStack, suppress
from dataclasses import dataclass, field
from typing import Any, TypeVar

import sqlalchemy as sa
from hypothesis import event
from hypothesis import strategies as st
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session, registry

from outbox import EndStatus, LocalTransactionState, Message
from outbox.protocol import CheckRequest, HalfRecord, RealRecord, Resolution
from outbox.sql import DEFAULT_GRACE_SECONDS, SqlTransactionListener
from outbox.sql.errors import JoinError
from outbox.sql.log import transaction_log_table
from tests.producer.conftest import OutboxTopics
from tests.producer.test_check_back import ops_of, produce, wait_for
from tests.sql.conftest import GROUP, Database, unique_name

COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE

JOIN_MODES = ("conditional_savepoint", "create_savepoint", "rollback_only", "control_fully")
"""SQLAlchemy's ``join_transaction_mode``s, for a session bound to an outside ``conn.begin()``."""
BINDINGS = ("engine", *JOIN_MODES)
"""``engine``: ``Session(engine)``; a join mode: the "join an external transaction" recipe."""

BLOCKS = ("send", "begin", "savepoint", "savepoint_commit", "savepoint_rollback", "catch", "scope")
SESSION_ENDS = ("commit", "rollback", "connection_commit", "close")
OUTER_ENDS = ("outer_commit", "outer_rollback")
MAX_DEPTH = 3


# ------------------------------------------------------------------ the programs


@dataclass(frozen=True)
class Step:
    """One statement of the program.

    ``join`` of send ``send`` inserts the order row (before the join when
    ``order_first``, else after) and calls ``txn.join(session)``; inside a
    savepoint it only calls the join, which must raise :class:`JoinError`.
    """

    op: str
    send: int = -1
    order_first: bool = True


@dataclass(frozen=True)
class Block:
    """A block of statements: ``with producer.transaction(...)``, a session's block, a savepoint,
    a ``try/except`` (``catch``), or ``with session:`` (``scope``, closing the session)."""

    kind: str
    body: tuple[Node, ...]
    send: int = -1


Node = Step | Block


_LINES = {
    "flush": "session.flush()",
    "note": "session.add(Note())  # a pending ORM object",
    "dup": "session.execute(insert(dups), [{'v': x}, {'v': x}])  # deferred UNIQUE: COMMIT fails",
    "raise": "raise Boom()",
    "commit": "session.commit()",
    "rollback": "session.rollback()",
    "connection_commit": "session.connection().commit()",
    "close": "session.close()",
    "outer_commit": "outer.commit()",
    "outer_rollback": "outer.rollback()",
}


def _render(nodes: Iterable[Node], indent: int) -> list[str]:
    pad = "    " * indent
    lines: list[str] = []
    for node in nodes:
        if isinstance(node, Step):
            if node.op == "join":
                order = f"{pad}session.execute(insert(orders))  # order of txn{node.send}"
                join = f"{pad}txn{node.send}.join(session)"
                lines += [order, join] if node.order_first else [join, order]
            else:
                lines.append(pad + _LINES[node.op])
            continue
        body = _render(node.body, indent + 1) or [pad + "    pass"]
        if node.kind == "catch":
            lines += [f"{pad}try:", *body, f"{pad}except Exception:", f"{pad}    pass"]
        elif node.kind in ("savepoint_commit", "savepoint_rollback"):
            end = node.kind.removeprefix("savepoint_")
            name = f"sp{indent}"
            lines += [f"{pad}{name} = session.begin_nested()", *_render(node.body, indent)]
            lines.append(f"{pad}{name}.{end}()  # skipped if the body raised")
        else:
            head = {
                "send": f"with producer.transaction(message{node.send}) as txn{node.send}:",
                "begin": "with session.begin():",
                "savepoint": "with session.begin_nested():",
                "scope": "with session:",
            }[node.kind]
            lines += [pad + head, *body]
    return lines


@dataclass(frozen=True)
class Usage:
    """A generated program: how the session is bound, its body, and what runs after it.

    ``tail`` runs after every block ended, each statement on its own (an error
    there is the application's, caught): the session and outer transaction
    ended after the outbox block. Then the session and connection are closed.
    """

    binding: str
    body: tuple[Node, ...]
    tail: tuple[str, ...]
    form: str = "sync"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """Hypothesis's printer: the program as code, not the dataclass's fields."""
        printer.text(repr(self))

    def __repr__(self) -> str:
        """The program as the Python a service would write (Hypothesis prints it on failure)."""
        made = "AsyncSession" if self.form == "async" else "Session"
        if self.binding == "engine":
            setup = [f"session = {made}(engine)"]
        else:
            setup = [
                "conn = engine.connect()",
                "outer = conn.begin()",
                f"session = {made}(bind=conn, join_transaction_mode={self.binding!r})",
            ]
        lines = [f"# {self.form} form", *setup, "try:"]
        lines += _render(self.body, 1) or ["    pass"]
        lines += ["except Exception:", "    pass", "# after every block:"]
        lines += [f"{_LINES[op]}  # errors caught" for op in self.tail]
        lines.append("session.close()" + ("; conn.close()" if self.binding != "engine" else ""))
        return "\n" + "\n".join(lines) + "\n"


class _Grammar:
    """Draws one program, tracking which sends are open and joined.

    A body is a few statements, then maybe one that ends the transaction
    (commit, rollback, close...), then maybe an error: statements after a
    ``raise`` would never run, so a raise only ever comes last, and each of
    the shapes a bug needs (a savepoint released, then an error; a commit,
    then the outer transaction rolled back) is a few draws away.
    """

    def __init__(self, draw: Any, backend: str, binding: str, sends: int) -> None:
        self.draw = draw
        self.backend = backend
        self.bound = binding != "engine"
        self.sends = sends
        self.placed = 0
        self.joined: set[int] = set()

    def chance(self, one_in: int) -> bool:
        """True once in ``one_in`` draws (shrinks towards False)."""
        return self.draw(st.integers(0, one_in - 1)) == one_in - 1

    def body(
        self, depth: int, open_sends: tuple[int, ...], *, joining: int | None = None
    ) -> tuple[Node, ...]:
        """A body; ``joining``: the send whose block this is, joined here unless drawn inside
        (or, once in a while, never)."""
        count = self.draw(st.integers(0, 2))
        nodes = [self.node(depth, open_sends) for _ in range(count)]
        if joining is not None and joining not in self.joined and not self.chance(6):
            nodes.insert(self.draw(st.integers(0, len(nodes))), self.join(joining))
        if self.draw(st.integers(0, 2)):  # two in three bodies end the transaction
            ends = [*SESSION_ENDS, *(OUTER_ENDS if self.bound else ())]
            nodes.append(Step(self.draw(st.sampled_from(ends))))
        if depth > 0 and self.chance(3):
            nodes.append(Step("raise"))
        return tuple(nodes)

    def node(self, depth: int, open_sends: tuple[int, ...]) -> Node:
        choices: list[str] = []
        unjoined = [send for send in open_sends if send not in self.joined]
        if unjoined:
            choices += ["join"] * 4
        if self.placed < self.sends and depth < MAX_DEPTH:
            choices += ["send"] * 3
        if depth < MAX_DEPTH:
            choices += ["savepoint"] * 3 + ["savepoint_commit", "savepoint_rollback"]
            choices += ["begin", "begin", "catch", "scope", "scope"]
        choices += ["flush", "note"]
        if self.backend == "postgresql":
            choices += ["dup", "dup"]
        kind = self.draw(st.sampled_from(choices))
        if kind == "join":
            return self.join(self.draw(st.sampled_from(unjoined)))
        if kind == "send":
            return self.send(depth, open_sends)
        if kind in BLOCKS:
            return Block(kind, self.body(depth + 1, open_sends))
        return Step(kind)

    def join(self, send: int) -> Step:
        self.joined.add(send)
        return Step("join", send, self.draw(st.booleans()))

    def send(self, depth: int, open_sends: tuple[int, ...]) -> Block:
        index = self.placed
        self.placed += 1
        return Block("send", self.body(depth + 1, (*open_sends, index), joining=index), index)


@st.composite
def usages(draw: Any, backend: str, form: str) -> Usage:
    """Programs for ``backend`` (``sqlite`` or ``postgresql``) in ``form`` (``sync``/``async``)."""
    binding = draw(st.sampled_from(("engine",) * len(JOIN_MODES) + JOIN_MODES))
    grammar = _Grammar(draw, backend, binding, draw(st.integers(1, 2)))
    body = grammar.body(0, ())
    while grammar.placed < grammar.sends:
        body = (*body, grammar.send(0, ()))
    ends = [draw(st.sampled_from((None, *SESSION_ENDS)))]
    if binding != "engine":
        ends.append(draw(st.sampled_from((None, *OUTER_ENDS))))
        if draw(st.booleans()):
            ends.reverse()
    return Usage(binding, body, tuple(end for end in ends if end), form)


# ------------------------------------------------------------------ playing them


class Boom(Exception):
    """The application's own error, raised anywhere in the program."""


class Violation(AssertionError):
    """The library broke its word; never swallowed by the program's ``try/except``."""


@dataclass
class Sent:
    """One ``producer.transaction(...)`` block that was entered (its half written)."""

    txn: Any
    order_id: str
    joined: bool = False
    ordered: bool = False
    status: EndStatus | None = None
    committed: bool = False

    @property
    def transaction_id(self) -> str:
        return str(self.txn.transaction_id)


_T = TypeVar("_T")


async def _maybe(value: Any) -> Any:
    """``value``, awaited if the async API returned an awaitable (the sync one never does)."""
    return await value if inspect.isawaitable(value) else value


async def _enter(stack: AsyncExitStack, manager: Any) -> Any:
    """Enter a sync or async context manager, so that one interpreter serves both forms."""
    if hasattr(manager, "__aenter__"):
        return await stack.enter_async_context(manager)
    return stack.enter_context(manager)


def _drive(coroutine: Coroutine[Any, Any, _T]) -> _T:
    """Run a coroutine that never suspends (the sync form awaits nothing real), loop-free,
    so the threaded producer is driven from a plain thread, as a sync service drives it."""
    try:
        coroutine.send(None)
    except StopIteration as finished:
        return finished.value  # type: ignore[no-any-return]
    coroutine.close()
    raise RuntimeError("the sync form awaited something: it must not suspend")


@dataclass
class _Play:
    """One program's run: its session, binding and the sends it entered."""

    harness: Harness
    session: Any
    outer: Any = None
    sent: dict[int, Sent] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)
    """For Hypothesis's statistics, recorded by the test's thread (not the event loop's)."""

    async def body(self, nodes: Iterable[Node]) -> None:
        for node in nodes:
            if isinstance(node, Step):
                await self.step(node)
            else:
                await self.block(node)

    async def block(self, block: Block) -> None:
        session = self.session
        if block.kind == "catch":
            try:
                await self.body(block.body)
            except AssertionError:
                raise
            except Exception:
                pass
            return
        if block.kind in ("savepoint_commit", "savepoint_rollback"):
            savepoint = await _maybe(session.begin_nested())
            await self.body(block.body)
            await _maybe(getattr(savepoint, block.kind.removeprefix("savepoint_"))())
            return
        async with AsyncExitStack() as stack:
            if block.kind == "send":
                order_id = uuid.uuid4().hex
                message = self.harness.message(order_id)
                txn = await _enter(stack, self.harness.producer_of_form.transaction(message))
                self.sent[block.send] = Sent(txn, order_id)
            else:
                manager = {
                    "begin": session.begin,
                    "savepoint": session.begin_nested,
                    "scope": lambda: session,
                }[block.kind]()
                await _enter(stack, manager)
            await self.body(block.body)

    async def step(self, step: Step) -> None:
        session, harness = self.session, self.harness
        if step.op == "join":
            await self.join(step)
        elif step.op == "flush":
            await _maybe(session.flush())
        elif step.op == "note":
            session.add(harness.note_class(id=uuid.uuid4().hex))
        elif step.op == "dup":
            value = uuid.uuid4().hex
            rows = [{"v": value}, {"v": value}]
            await _maybe(session.execute(sa.insert(harness.dups), rows))
        elif step.op == "raise":
            raise Boom(step.op)
        elif step.op == "connection_commit":
            connection = await _maybe(session.connection())
            await _maybe(connection.commit())
        elif step.op in OUTER_ENDS:
            await _maybe(getattr(self.outer, step.op.removeprefix("outer_"))())
        else:
            await _maybe(getattr(session, step.op)())

    async def join(self, step: Step) -> None:
        sent = self.sent[step.send]
        if self.session.in_nested_transaction():
            try:
                await _maybe(sent.txn.join(self.session))
            except JoinError:
                self.events.append("join inside a savepoint refused")
                raise
            raise Violation("join() inside a savepoint was accepted; it must raise JoinError")
        order = sa.insert(self.harness.database.orders).values(
            id=sent.order_id, transaction_id=sent.transaction_id
        )
        if step.order_first:
            await _maybe(self.session.execute(order))
            sent.ordered = True
        await _maybe(sent.txn.join(self.session))
        sent.joined = True
        if not step.order_first:
            await _maybe(self.session.execute(order))
            sent.ordered = True

    async def tail(self, ends: Iterable[str]) -> None:
        for end in ends:
            try:
                await self.step(Step(end))
            except AssertionError:
                raise
            except Exception:
                pass


class Harness:
    """Plays programs on one database, producer and set of topics, and keeps what they sent.

    ``producer`` is a started :class:`~outbox.TransactionProducer`, or an
    :class:`~tests.producer.conftest.OnLoop` for the async form (``database.kind``).
    """

    def __init__(self, database: Database, topics: OutboxTopics, producer: Any) -> None:
        self.database = database
        self.topics = topics
        self.producer = producer
        self.form = database.kind
        self.backend = database.backend
        self.sends: list[Sent] = []
        self.examples = 0
        self.started = time.monotonic()
        self.first_violation: str | None = None
        """When the run first found a broken promise: how fast the model finds a defect."""
        metadata = sa.MetaData()
        self.notes = sa.Table(
            unique_name("notes"), metadata, sa.Column("id", sa.String(64), primary_key=True)
        )
        deferred = sa.UniqueConstraint("v", deferrable=True, initially="DEFERRED")
        self.dups = sa.Table(
            unique_name("dups"),
            metadata,
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("v", sa.String(64), nullable=False),
            *([deferred] if self.backend == "postgresql" else []),
        )
        metadata.create_all(database.engine)
        self._metadata = metadata

        class Note:
            def __init__(self, **fields: Any) -> None:
                self.__dict__.update(fields)

        registry().map_imperatively(Note, self.notes)
        self.note_class = Note
        # The checker's view: the same log, asked after the grace period is over.
        self.checker = SqlTransactionListener(
            database.sessions,
            None,
            group=GROUP,
            table=database.target.table,
            schema=database.target.schema,
            clock=lambda: time.time() + DEFAULT_GRACE_SECONDS + 1,
        )

    def close(self) -> None:
        self._metadata.drop_all(self.database.engine)

    @property
    def producer_of_form(self) -> Any:
        """What ``producer.transaction`` is called on: the async producer inside OnLoop."""
        return self.producer.producer if self.form == "async" else self.producer

    def message(self, order_id: str) -> Message:
        return Message(self.topics.real_topic, f'{{"id": "{order_id}"}}'.encode(), key=order_id)

    # -------------------------------------------------------------- one example

    def play(self, usage: Usage) -> None:
        """Run ``usage``, then judge every send it entered by what the database holds."""
        self.examples += 1
        if self.form == "async":
            engine, loop = self.database.async_parts()
            play = loop.run(self._run(usage, engine))
        else:
            play = _drive(self._run(usage, self.database.engine))
        for happened in [f"binding: {usage.binding}", *play.events]:
            event(happened)
        try:
            self.judge([play.sent[index] for index in sorted(play.sent)])
        except AssertionError as exc:
            if self.first_violation is None:
                elapsed = time.monotonic() - self.started
                self.first_violation = (
                    f"first violation at example {self.examples}, {elapsed:.1f} s into the run: "
                    f"{exc}{usage!r}"
                )
            raise

    async def _run(self, usage: Usage, engine: Any) -> _Play:
        session_class = AsyncSession if self.form == "async" else Session
        connection = None
        play = _Play(self, None)
        try:
            if usage.binding == "engine":
                play.session = session_class(engine)
            else:
                connection = await _maybe(engine.connect())
                play.outer = await _maybe(connection.begin())
                play.session = session_class(bind=connection, join_transaction_mode=usage.binding)
            try:
                await play.body(usage.body)
            except AssertionError:
                raise
            except Exception as exc:
                play.events.append(f"the program raised {type(exc).__name__}")
            await play.tail(usage.tail)
        finally:
            if play.session is not None:
                await self._quietly(play.session.close)
            if connection is not None:
                await self._quietly(connection.close)  # rolls back what is still open
        pool = engine.sync_engine.pool if self.form == "async" else engine.pool
        assert pool.checkedout() == 0, (
            "a connection is still checked out after the program closed its session and "
            "connection: leaked by the joined send"
        )
        return play

    @staticmethod
    async def _quietly(end: Callable[[], Any]) -> None:
        """Clean-up: the program's outcome is already in the database, or dropped here."""
        with suppress(Exception):
            await _maybe(end())

    def judge(self, sent: list[Sent]) -> None:
        """The decision of each send against the database: immediately, per example."""
        logged = self._committed_log_rows([s.transaction_id for s in sent])
        orders = self._orders([s.order_id for s in sent])
        for send in sent:
            self.sends.append(send)
            send.committed = send.transaction_id in logged
            if send.joined and send.ordered:  # the two rows went into one transaction
                assert (send.order_id in orders) is send.committed, (
                    f"the order row and the log row of {send.transaction_id} disagree"
                )
            result = send.txn.result
            if result is None:
                raise Violation(f"the block of {send.transaction_id} ended without a result")
            send.status = result.end_status
            event(f"end status {send.status.name}, row committed: {send.committed}")
            if send.status is EndStatus.COMMITTED and not send.committed:
                raise Violation(
                    f"phantom: the producer wrote COMMIT for {send.transaction_id} but the "
                    "database holds no committed row: it will be published"
                )
            if send.status is EndStatus.ROLLED_BACK and send.committed:
                raise Violation(
                    f"lost: the producer wrote ROLLBACK for {send.transaction_id} but the "
                    "database committed its row: it will never be published"
                )
            if send.status not in (EndStatus.COMMITTED, EndStatus.ROLLED_BACK):
                answer = self.checker.check_local_transaction(send.txn.message)
                expected = COMMIT if send.committed else ROLLBACK
                if answer is not expected:
                    raise Violation(
                        f"the check-back past the grace period answered {answer.name} for "
                        f"{send.transaction_id} ({send.status.name}); the database says "
                        f"{expected.name}"
                    )

    def _committed_log_rows(self, transaction_ids: list[str]) -> set[str]:
        table = transaction_log_table(self.database.target.table, self.database.target.schema)
        query = sa.select(table.c.transaction_id).where(
            table.c.transaction_id.in_(transaction_ids), ~table.c.rolled_back
        )
        with self.database.engine.connect() as connection:
            return set(connection.execute(query).scalars())

    def _orders(self, order_ids: list[str]) -> set[str]:
        orders = self.database.orders
        with self.database.engine.connect() as connection:
            query = sa.select(orders.c.id).where(orders.c.id.in_(order_ids))
            return set(connection.execute(query).scalars())

    # -------------------------------------------------------------- end to end

    def settle(self, timeout: float = 120.0) -> None:
        """Ask the check-back for real about every undecided half, then check the topics.

        The first decision op of each send must match the database, and the relay
        must publish exactly the committed sends, each once.
        """
        undecided = {
            s.transaction_id
            for s in self.sends
            if s.status not in (EndStatus.COMMITTED, EndStatus.ROLLED_BACK)
        }
        if undecided:
            self._put_back_and_ask(undecided)
        every = {s.transaction_id for s in self.sends}
        first: dict[str, Resolution] = {}

        def all_decided() -> bool:
            first.clear()
            for op in ops_of(self.topics):
                first.setdefault(op.transaction_id, op.resolution)
            return every <= set(first)

        wait_for(all_decided, timeout)
        wrong = [
            (s.transaction_id, first[s.transaction_id].name, s.committed)
            for s in self.sends
            if (first[s.transaction_id] is Resolution.COMMIT) is not s.committed
        ]
        assert not wrong, f"first decision op against the database (id, op, committed): {wrong}"
        expected = Counter(s.transaction_id for s in self.sends if s.committed)
        published: Counter[str] = Counter()

        def all_published() -> bool:
            published.clear()
            raw = self.topics.read(self.topics.real_topic)
            published.update(RealRecord.from_record(r).transaction_id for r in raw)
            return set(published) >= set(expected)

        wait_for(all_published, timeout)
        time.sleep(1)  # a second publication, or a phantom one, would show by now
        all_published()
        assert published == expected, (
            f"published (id: times) {dict(published)} != committed {dict(expected)}"
        )

    def _put_back_and_ask(self, transaction_ids: set[str]) -> None:
        """What one checker round does for each pending half: copy it, then ask the group."""
        for raw in self.topics.read(self.topics.names.half):
            half = HalfRecord.from_record(raw)
            if half.transaction_id not in transaction_ids or half.origin_offset is not None:
                continue
            copy = half.put_back(raw.offset, raw.timestamp_ms)
            ((_, copy_offset),) = produce(
                self.topics, copy.to_record(self.topics.names, raw.partition)
            )
            request = CheckRequest(copy, raw.partition, copy_offset, int(time.time() * 1000))
            produce(self.topics, request.to_record(self.topics.names))


def _send(*body: Node) -> Block:
    return Block("send", body, 0)


JOIN = Step("join", 0)
KNOWN: dict[str, Usage] = {
    "A/E: savepoint released, then the outer block raises": Usage(
        "engine", (_send(Block("begin", (JOIN, Block("savepoint", ()), Step("raise")))),), ()
    ),
    "B: savepoint released, then COMMIT refused (deferred unique; PostgreSQL)": Usage(
        "engine", (_send(Block("begin", (JOIN, Block("savepoint", (Step("dup"),))))),), ()
    ),
    "C: bound to an outer transaction, session committed, outer rolled back": Usage(
        "conditional_savepoint", (_send(JOIN, Step("commit")),), ("outer_rollback",)
    ),
    "D: committed through session.connection(), then closed": Usage(
        "engine", (_send(JOIN, Step("connection_commit"), Step("close")),), ()
    ),
}
"""The defects a review found in the event-based decision, as programs of this grammar."""
