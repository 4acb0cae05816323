"""pytest plugin: under ``--dist loadfile``, hand out the longest test files first.

The suite's time on two cores is set by its longest files (a chaos file of about eight
minutes, broker-outage files of four): given out last, one of them keeps a worker busy
alone while the others have finished. xdist's own order (most tests first) puts the long
files of few tests at the end. This scheduler gives each idle worker the file with the
longest measured duration still waiting (longest processing time first, a makespan
within 4/3 of the best), and a worker its next file only once it holds one test, so a
worker never queues a second long file behind its first.

The measured durations are ``tests/file_durations.json`` (seconds a file, summed over
its tests' setup, call and teardown). A file it does not list counts as
``UNKNOWN_FILE_SECONDS``. ``pytest --store-file-durations`` writes the file anew from the
run it ends (``make test-durations``); refresh it when a file's time changes by minutes.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadFileScheduling

DURATIONS_PATH = Path(__file__).with_name("file_durations.json")
UNKNOWN_FILE_SECONDS = 5.0
"""What a file missing from the durations counts as: most files take a few seconds."""
HELD_BACK_TESTS = 1
"""A worker runs its next test only once it has another queued; so it needs more work as
soon as its queue is down to this one held test."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--store-file-durations",
        action="store_true",
        help=f"write each test file's duration in this run to {DURATIONS_PATH.name}",
    )


def load_durations(path: Path = DURATIONS_PATH) -> dict[str, float]:
    """Seconds a test file (its node id, e.g. ``tests/chaos/test_chaos_runs.py``)."""
    if not path.is_file():
        return {}
    return {str(name): float(seconds) for name, seconds in json.loads(path.read_text()).items()}


def longest_first(files: list[str], durations: dict[str, float]) -> list[str]:
    """``files`` ordered by measured duration, longest first; ties keep their order."""
    return sorted(files, key=lambda name: -durations.get(name, UNKNOWN_FILE_SECONDS))


class LongestFileFirst(LoadFileScheduling):
    """xdist's file scheduler, handing the longest waiting file to a worker that needs one."""

    def __init__(self, config: pytest.Config, log: Any, durations: dict[str, float]) -> None:
        super().__init__(config, log)
        self.durations = durations

    def _assign_work_unit(self, node: Any) -> None:
        longest = longest_first(list(self.workqueue), self.durations)[0]
        self.workqueue.move_to_end(longest, last=False)
        super()._assign_work_unit(node)

    def _reschedule(self, node: Any) -> None:
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        if self._pending_of(self.assigned_work[node]) <= HELD_BACK_TESTS:
            self._assign_work_unit(node)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LongestFileFirst | None:
    if config.getoption("dist") != "loadfile":
        return None
    return LongestFileFirst(config, log, load_durations())


class _DurationRecorder:
    """Sums each file's report durations in the process that receives every report."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid.split("::", 1)[0]] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if session.config.getoption("collectonly") or not self.seconds:
            return
        measured = {name: round(s, 1) for name, s in sorted(self.seconds.items())}
        DURATIONS_PATH.write_text(json.dumps(measured, indent=1) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    is_worker = hasattr(config, "workerinput")
    if config.getoption("store_file_durations") and not is_worker:
        config.pluginmanager.register(_DurationRecorder(), "file-durations")
