"""The chaos run's child processes: producers and checker replicas that can be killed and restarted.

Each is started from the controller's main thread with PR_SET_PDEATHSIG (the
signal follows the thread that forked), so a controller that dies takes its
children with it. Their output goes to one log file per process and incarnation.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import Path

from outbox_devtools.chaos.checker_process import (
    ARM_FILE_VARIABLE,
    DRAIN_ARM_FILE_VARIABLE,
    MID_CHUNK,
    MID_DRAIN,
)
from outbox_devtools.chaos.worker import WorkerConfig
from outbox_devtools.processes import die_with_parent

CLIENT_TIMEOUTS = {"session.timeout.ms": "6000", "heartbeat.interval.ms": "1000"}
"""For the producers' check responders: a killed member's partitions move on after 6 s instead
of 10. Not for the checker, whose consumers have their own ``--session-timeout-ms`` (6 s) and
whose producers would log each property as ignored."""


@dataclass(frozen=True)
class SendCounts:
    """A producer's ``SENT`` report: sends that returned, that raised, that were parked."""

    sent: int = 0
    failed: int = 0
    parked: int = 0

    def __add__(self, other: SendCounts) -> SendCounts:
        return SendCounts(
            self.sent + other.sent, self.failed + other.failed, self.parked + other.parked
        )


class ProducerProcess:
    """One producer slot: the live process and the counts of its dead incarnations."""

    def __init__(self, config: WorkerConfig, log_dir: Path, launcher: Sequence[str] = ()) -> None:
        """``launcher`` prefixes the command (``ip netns exec``: a host of the chaos network)."""
        self.config = config
        self.log_dir = log_dir
        self.launcher = list(launcher)
        self.incarnation = 0
        self.earlier = SendCounts()
        """What the dead incarnations last reported."""
        self._current = SendCounts()
        self.failures: list[tuple[float, int]] = []
        """(epoch s of a report, sends that failed since the one before): when sends failed."""
        self._ready = threading.Event()
        self.answering = threading.Event()
        """Set when the armed process announces it is inside a check-back answer."""
        self._armed = False
        self.process: subprocess.Popen[str] | None = None

    @property
    def counts(self) -> SendCounts:
        """Sends of every incarnation so far (as each last reported)."""
        return self.earlier + self._current

    @property
    def sent(self) -> int:
        return self.counts.sent

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        self.incarnation += 1
        self._current = SendCounts()
        self._ready.clear()
        self.answering.clear()
        config = replace(self.config, incarnation=self.incarnation)
        log = (self.log_dir / f"producer-{config.worker}.{self.incarnation}.log").open("w")
        self.process = subprocess.Popen(
            [
                *self.launcher,
                sys.executable,
                "-m",
                "outbox_devtools.chaos.worker",
                config.to_json(),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            preexec_fn=die_with_parent,
        )
        log.close()
        threading.Thread(target=self._read_reports, args=(self.process,), daemon=True).start()
        if self._armed:  # killed by another fault while armed: the next incarnation is armed
            self._command("arm-check\n")

    def wait_ready(self, timeout: float) -> bool:
        return self._ready.wait(timeout)

    def _read_reports(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            words = line.split()
            if words[:1] == ["READY"]:
                self._ready.set()
            elif words[:1] == ["SENT"] and process is self.process:
                counts = SendCounts(int(words[1]), int(words[5]), int(words[6]))
                if counts.failed > self._current.failed:
                    self.failures.append((time.time(), counts.failed - self._current.failed))
                self._current = counts
            elif words[:1] == ["CHECKING"] and process is self.process:
                self.answering.set()

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.earlier += self._current
            self._current = SendCounts()

    def stop_sending(self) -> None:
        self._command("stop\n")

    def arm_check(self) -> None:
        """Have the next check-back this slot answers announce itself and pause."""
        self._armed = True
        self.answering.clear()
        self._command("arm-check\n")

    def disarm_check(self) -> None:
        self._armed = False
        self._command("disarm-check\n")

    def finish(self, timeout: float) -> None:
        """Close stdin (the process shuts its producer down and exits), then wait."""
        if self.process is None:
            return
        if self.process.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.process.stdin.close()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def _command(self, text: str) -> None:
        if self.alive and self.process is not None and self.process.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self.process.stdin.write(text)
                self.process.stdin.flush()


class Pause(Enum):
    """Where an armed replica pauses inside a Kafka transaction (see ``checker_process``)."""

    CHUNK = (ARM_FILE_VARIABLE, MID_CHUNK)
    """A round chunk with put-backs: its copies stored, its check requests not written."""
    DRAIN = (DRAIN_ARM_FILE_VARIABLE, MID_DRAIN)
    """A parked drain: its halves stored, their COMMIT ops not written."""

    @property
    def variable(self) -> str:
        return self.value[0]

    @property
    def marker(self) -> str:
        return self.value[1]


class CheckerProcess:
    """One checker replica (``outbox checker``) with a stable instance id."""

    def __init__(
        self, index: int, env: Mapping[str, str], log_dir: Path, launcher: Sequence[str] = ()
    ) -> None:
        """``launcher`` prefixes the command (``ip netns exec``: a host of the chaos network)."""
        self.index = index
        self.launcher = list(launcher)
        self.instance_id = f"checker-{index}"
        self.arm_files = {
            pause: log_dir / f"arm-{pause.name.lower()}-checker-{index}" for pause in Pause
        }
        self.env = {
            **os.environ,
            **env,
            "OUTBOX_INSTANCE_ID": self.instance_id,
            **{pause.variable: str(self.arm_files[pause]) for pause in Pause},
        }
        self.log_dir = log_dir
        self.incarnation = 0
        self.process: subprocess.Popen[bytes] | None = None
        self._armed_at = dict.fromkeys(Pause, 0)
        """Where the current log stood when the replica was armed: a marker counts past it."""

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"checker-{self.index}.{self.incarnation}.log"

    def arm(self, pause: Pause) -> None:
        """Have this replica announce itself and pause at ``pause``'s point, once."""
        self._armed_at[pause] = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.arm_files[pause].touch()

    def disarm(self, pause: Pause) -> None:
        self.arm_files[pause].unlink(missing_ok=True)

    def paused_at(self, pause: Pause) -> bool:
        """Whether the armed replica announced it is pausing at ``pause``'s point."""
        if not self.alive or not self.log_path.exists():
            return False
        with self.log_path.open("rb") as log:
            log.seek(self._armed_at[pause])
            return pause.marker.encode() in log.read()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        self.incarnation += 1
        self._armed_at = dict.fromkeys(Pause, 0)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [*self.launcher, sys.executable, "-m", "outbox_devtools.chaos.checker_process"],
                env=self.env,
                stdout=log,
                stderr=log,
                preexec_fn=die_with_parent,
            )

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()

    def freeze(self) -> None:
        """SIGSTOP: the replica stops mid-work, its connections open and silent."""
        if self.alive:
            assert self.process is not None
            self.process.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT (a replica killed meanwhile was restarted, and that one runs anyway)."""
        if self.alive:
            assert self.process is not None
            self.process.send_signal(signal.SIGCONT)

    def stop(self, timeout: float) -> None:
        """SIGTERM: the replica finishes its round and exits."""
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
