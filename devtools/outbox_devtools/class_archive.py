"""A class-data sharing archive of the broker's classes, so a local broker starts on less CPU.

Most of a local broker's start is the JVM loading and verifying Kafka's classes. Java's
dynamic class-data sharing (JEP 350, Java 13+) keeps them ready: a JVM run with
``-XX:ArchiveClassesAtExit`` writes the classes it loaded into an archive as it exits,
and a later JVM given ``-XX:SharedArchiveFile`` maps them instead of loading them.
Measured 2026-12-02 on the 2-core machine, a one-node broker's start until it answered
(3 starts each): 4.8 CPU seconds and 3.9 s without the archive, 3.0 CPU seconds and
2.8 s with it; the JIT and the broker's running speed are unchanged. The test suite
starts brokers all along, mostly while other tests take the cores.

The first broker a machine starts for a Kafka version writes the archive as it stops
(once, about 50 MB next to the jars); a broker killed or frozen past its stop's grace
writes none, and the next clean stop does. An archive belongs to one JVM build and one
class path, so its name carries both; a JVM that still finds it unusable says so in its
log and starts as it would without it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from pathlib import Path


def archive_path(libs: Path, java: str) -> Path:
    """Where the archive of ``java`` over the jars in ``libs`` lives."""
    executable = Path(os.path.realpath(java))
    stat = executable.stat()
    build = f"{executable}:{stat.st_size}:{stat.st_mtime_ns}:{libs.resolve()}"
    return libs.parent / f"classes-{hashlib.sha256(build.encode()).hexdigest()[:12]}.jsa"


class ClassArchive:
    """The archive flags of one JVM launch, and the archive it may leave when it stops."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._staging: Path | None = None

    def jvm_flags(self, *, may_write: bool = True) -> list[str]:
        """Map the archive when there is one; else, if ``may_write``, write one under a name
        of this launch's own (brokers starting together each write theirs; the first to
        stop keeps it). A launch that will not see its JVM stop (a detached broker, stopped
        from another process) must not write one: nobody would keep or remove it."""
        self._staging = None
        if self.path.is_file():
            return [f"-XX:SharedArchiveFile={self.path}"]
        if not may_write:
            return []
        self._staging = self.path.with_name(
            f".{self.path.name}-{os.getpid()}-{secrets.token_hex(4)}"
        )
        return [f"-XX:ArchiveClassesAtExit={self._staging}"]

    def settle(self, *, exited_cleanly: bool) -> None:
        """After the JVM has gone: keep what a clean exit wrote, drop a killed one's part."""
        staging, self._staging = self._staging, None
        if staging is None:
            return
        if exited_cleanly and staging.is_file() and staging.stat().st_size > 0:
            with contextlib.suppress(OSError):
                if not self.path.exists():
                    staging.rename(self.path)
        staging.unlink(missing_ok=True)
