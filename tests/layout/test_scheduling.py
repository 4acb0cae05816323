"""The suite's scheduler hands out the longest files first, one at a time a worker.

The scheduler is driven as xdist's controller drives it (workers join, report their
collection, finish tests), with stand-ins for the two worker processes: what is under
test is which files go to which worker, not the processes.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from xdist.scheduler import LoadFileScheduling

from tests.scheduling import (
    DURATIONS_PATH,
    UNKNOWN_FILE_SECONDS,
    LongestFileFirst,
    load_durations,
    longest_first,
)

ROOT = Path(__file__).resolve().parents[2]

COLLECTION = [
    "tests/a/test_quick.py::test_one",
    "tests/a/test_quick.py::test_two",
    "tests/a/test_quick.py::test_three",
    "tests/b/test_demo.py::test_the_demo",
    "tests/c/test_chaos.py::test_a_run",
    "tests/c/test_chaos.py::test_another_run",
    "tests/d/test_new.py::test_never_measured",
]
DURATIONS = {
    "tests/a/test_quick.py": 3.0,
    "tests/b/test_demo.py": 80.0,
    "tests/c/test_chaos.py": 500.0,
}


class StandInWorker:
    """What the scheduler asks of a worker: run these tests, shut down when done."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.given: list[int] = []
        self.shutting_down = False

    def send_runtest_some(self, indices: list[int]) -> None:
        self.given += indices

    def shutdown(self) -> None:
        self.shutting_down = True

    def files(self) -> list[str]:
        return list(dict.fromkeys(COLLECTION[i].split("::")[0] for i in self.given))


def _started(scheduler: LoadFileScheduling) -> tuple[StandInWorker, StandInWorker]:
    workers = StandInWorker("gw0"), StandInWorker("gw1")
    for worker in workers:
        scheduler.add_node(worker)
        scheduler.add_node_collection(worker, COLLECTION)
    scheduler.schedule()
    return workers


@pytest.fixture
def two_worker_config(pytester: pytest.Pytester) -> pytest.Config:
    return pytester.parseconfig("--tx=2*popen", "--dist", "loadfile", "-p", "xdist")


def test_the_two_longest_files_start_first_on_different_workers(two_worker_config):
    first, second = _started(LongestFileFirst(two_worker_config, None, DURATIONS))
    assert first.files() == ["tests/c/test_chaos.py"]
    # A worker runs a test only once it knows the next one, so the demo's single test
    # needs a second file queued behind it: the next longest.
    assert second.files() == ["tests/b/test_demo.py", "tests/d/test_new.py"]


def test_xdists_own_order_gives_one_worker_the_two_longest_files(two_worker_config):
    """What the scheduler replaces: most tests first, and a second file queued as soon as
    a worker holds two tests, so the two longest files (few tests) went to one worker."""
    first, second = _started(LoadFileScheduling(two_worker_config, None))
    assert first.files() == ["tests/a/test_quick.py"]
    assert second.files() == ["tests/c/test_chaos.py", "tests/b/test_demo.py"]


def test_a_worker_gets_its_next_file_only_when_it_holds_its_last_test(two_worker_config):
    scheduler = LongestFileFirst(two_worker_config, None, DURATIONS)
    first, second = _started(scheduler)
    scheduler.mark_test_complete(second, second.given[0])  # the demo is done
    assert second.files() == [
        "tests/b/test_demo.py",
        "tests/d/test_new.py",
        "tests/a/test_quick.py",
    ]
    assert first.files() == ["tests/c/test_chaos.py"]
    assert not first.shutting_down
    scheduler.mark_test_complete(first, first.given[0])  # one chaos run left, held back
    assert first.shutting_down, "nothing is left to give: it must be told to run its last"


def test_files_are_ordered_by_duration_and_unknown_ones_count_a_few_seconds():
    files = ["tests/a/test_quick.py", "tests/d/test_new.py", "tests/c/test_chaos.py"]
    assert longest_first(files, DURATIONS) == [
        "tests/c/test_chaos.py",
        "tests/d/test_new.py",  # UNKNOWN_FILE_SECONDS, above the 3 s file
        "tests/a/test_quick.py",
    ]
    assert DURATIONS["tests/a/test_quick.py"] < UNKNOWN_FILE_SECONDS


def test_the_committed_durations_name_only_files_that_exist():
    durations = json.loads(DURATIONS_PATH.read_text())
    missing = [name for name in durations if not (ROOT / name).is_file()]
    assert not missing, f"{DURATIONS_PATH.name} lists files that are gone: {missing}"
    assert load_durations() == {name: float(s) for name, s in durations.items()}
