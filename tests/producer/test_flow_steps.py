"""The drivers of :mod:`outbox.flow_steps` on plain generator flows: no Kafka.

Each mode has one driver: :func:`run_blocking` in a thread, :func:`drive` on an event
loop. Both start a flow, resume a paused one with a value (in another thread or task),
stop at the step ``pause_at`` names, throw ``take``'s errors into the flow and close it
when they leave it; :func:`run_blocking_together` starts the first steps of
a batch together and carries each flow on with :func:`run_blocking`.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from outbox.errors import HalfWriteError
from outbox.flow_steps import (
    Flow,
    LocalTransaction,
    Paused,
    Step,
    TopicLookup,
    drive,
    run_blocking,
    run_blocking_together,
)
from outbox.message import Message

MARKER = object()


def _flow(log: list[str]) -> Flow[tuple[Any, Any]]:
    """A lookup, then a local transaction (the pause point when its arg is MARKER)."""
    try:
        looked_up = yield TopicLookup("t")
        log.append(f"looked up {looked_up}")
        answered = yield LocalTransaction(Message("t", b"v"), MARKER)
        log.append(f"answered {answered}")
        return looked_up, answered
    finally:
        log.append("closed")


def _at_marker(step: Step) -> bool:
    return isinstance(step, LocalTransaction) and step.arg is MARKER


def test_the_blocking_driver_pauses_and_resumes_in_another_thread():
    log: list[str] = []
    flow = _flow(log)
    paused = run_blocking(flow, lambda step: "facts", pause_at=_at_marker)
    assert isinstance(paused, Paused)
    assert isinstance(paused.step, LocalTransaction)
    assert log == ["looked up facts"]  # paused: not closed
    results: list[Any] = []

    def resume() -> None:
        results.append(run_blocking(flow, lambda step: "facts", 7, pause_at=_at_marker))

    thread = threading.Thread(target=resume)
    thread.start()
    thread.join()
    assert results == [("facts", 7)]
    assert log == ["looked up facts", "answered 7", "closed"]


def test_the_asyncio_driver_pauses_and_resumes_in_another_task():
    log: list[str] = []

    async def take(step: Step) -> Any:
        await asyncio.sleep(0)
        return "facts"

    async def main() -> Any:
        flow = _flow(log)
        paused = await drive(flow, take, pause_at=_at_marker)
        assert isinstance(paused, Paused)
        assert isinstance(paused.step, LocalTransaction)
        assert log == ["looked up facts"]
        return await asyncio.create_task(drive(flow, take, 8, pause_at=_at_marker))

    assert asyncio.run(main()) == ("facts", 8)
    assert log == ["looked up facts", "answered 8", "closed"]


@pytest.mark.parametrize("mode", ["blocking", "asyncio"])
def test_an_error_taking_a_step_is_thrown_into_the_flow(mode: str):
    def flow() -> Flow[str]:
        try:
            yield TopicLookup("t")
        except HalfWriteError as exc:
            return f"handled {exc}"
        return "not thrown"

    def take(step: Step) -> Any:
        raise HalfWriteError("away")

    result = run_blocking(flow(), take) if mode == "blocking" else asyncio.run(drive(flow(), take))
    assert result == "handled away"


@pytest.mark.parametrize("mode", ["blocking", "asyncio"])
def test_an_interrupt_while_waiting_closes_the_flow(mode: str):
    log: list[str] = []

    def take(step: Step) -> Any:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        if mode == "blocking":
            run_blocking(_flow(log), take)
        else:
            asyncio.run(drive(_flow(log), take))
    assert log == ["closed"]


def test_a_batch_has_its_first_steps_under_way_together():
    events: list[str] = []

    def flow(name: str) -> Flow[str]:
        first = yield TopicLookup(name)
        second = yield TopicLookup(f"{name}-2")
        events.append(f"{name} got {first}, {second}")
        return name

    def start(step: Step) -> Any:
        assert isinstance(step, TopicLookup)
        events.append(f"started {step.topic}")
        if step.topic == "b":
            raise HalfWriteError("refused")
        return lambda: f"waited {step.topic}"

    def take(step: Step) -> Any:
        assert isinstance(step, TopicLookup)
        events.append(f"took {step.topic}")
        return step.topic

    def empty() -> Flow[str]:
        return "nothing"
        yield  # a generator

    flows = [flow("a"), flow("b"), empty(), flow("c")]
    failures = run_blocking_together(flows, start, take)
    assert [type(f) if f else f for f in failures] == [None, HalfWriteError, None, None]
    assert events == [
        *("started a", "started b", "started c"),
        *("took a-2", "a got waited a, a-2"),
        *("took c-2", "c got waited c, c-2"),
    ]
