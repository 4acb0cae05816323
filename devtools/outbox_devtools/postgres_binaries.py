"""The PostgreSQL server binaries a local cluster runs: found, or installed once.

:class:`~outbox_devtools.postgres.LocalPostgres` needs ``initdb`` and
``postgres``. Debian puts them under ``/usr/lib/postgresql/<version>/bin``,
other layouts elsewhere, and a fresh CI machine may have none: this module
looks in the usual places (newest version first), honours an explicit
``$OUTBOX_POSTGRES_BIN_DIR``, and may install the ``postgresql`` package with
``apt-get`` when it is allowed to.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from outbox.maven import cache_dir
from outbox_devtools import processes

SERVER_PACKAGE = "postgresql"
"""The Debian/Ubuntu package that carries ``initdb`` and ``postgres``."""

BIN_DIR_ENV = "OUTBOX_POSTGRES_BIN_DIR"
"""Names the server binaries directory outright, for non-Debian layouts."""

_REQUIRED_BINARIES = ("initdb", "postgres")


class PostgresNotFound(RuntimeError):
    """No PostgreSQL server binaries, and no way (or no permission) to install them."""


def _missing_binaries(bin_dir: Path) -> list[str]:
    return [name for name in _REQUIRED_BINARIES if not os.access(bin_dir / name, os.X_OK)]


def _version_key(path: Path) -> tuple[int, ...]:
    """``/usr/lib/postgresql/9.6/bin`` sorts below ``.../16/bin``: compare numbers, not text."""
    return tuple(int(part) for part in re.findall(r"\d+", path.parent.name)) or (-1,)


def _pg_config_bin_dir() -> Path | None:
    pg_config = shutil.which("pg_config")
    if pg_config is None:
        return None
    try:
        out = subprocess.run(
            [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return Path(out) if out else None


def _candidate_bin_dirs() -> Iterator[Path]:
    """Where server binaries live, most specific first.

    ``pg_config`` can belong to the client-only ``libpq-dev``, so every
    candidate is checked for ``initdb`` and ``postgres`` before it is used.
    """
    from_pg_config = _pg_config_bin_dir()
    if from_pg_config is not None:
        yield from_pg_config
    yield from sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=_version_key, reverse=True)
    yield from sorted(Path("/usr").glob("pgsql-*/bin"), key=_version_key, reverse=True)
    on_path = shutil.which("initdb")
    if on_path is not None:
        yield Path(on_path).resolve().parent


def find_bin_dir() -> Path | None:
    """The newest directory holding ``initdb`` and ``postgres``, or None.

    ``$OUTBOX_POSTGRES_BIN_DIR`` wins when set; a wrong value is an error rather
    than a silent fall-back, since whoever set it meant that build.
    """
    explicit = os.environ.get(BIN_DIR_ENV)
    if explicit:
        return check_bin_dir(Path(explicit).expanduser(), f"${BIN_DIR_ENV}")
    for candidate in _candidate_bin_dirs():
        if not _missing_binaries(candidate):
            return candidate
    return None


def check_bin_dir(bin_dir: Path, origin: str) -> Path:
    """``bin_dir`` if it holds the server binaries; else an error naming where it came from."""
    missing = _missing_binaries(bin_dir)
    if missing:
        raise PostgresNotFound(
            f"{origin} {bin_dir} is not a PostgreSQL server binaries directory: "
            f"missing or not executable: {', '.join(missing)}"
        )
    return bin_dir


def _progress(message: str) -> None:
    print(f"outbox: {message}", file=sys.stderr, flush=True)


def _install_with_apt() -> None:
    """``apt-get install postgresql``, serialised across processes by a lock file.

    Parallel test sessions would otherwise race for dpkg's own lock and one
    would fail; with ours the second one waits and then finds the binaries.
    """
    apt_get = shutil.which("apt-get")
    if apt_get is None:
        raise PostgresNotFound(
            "PostgreSQL server binaries not found and apt-get is not available: install "
            f"the PostgreSQL server (package {SERVER_PACKAGE!r} on Debian/Ubuntu) or set "
            f"${BIN_DIR_ENV} to its bin directory"
        )
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    log_path = cache / "postgres-apt-install.log"
    with (cache / "postgres-install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if find_bin_dir() is not None:
            return
        _progress(
            f"PostgreSQL server binaries not found; installing Debian package "
            f"{SERVER_PACKAGE!r} with apt-get (log: {log_path}) ..."
        )
        started = time.monotonic()
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        with log_path.open("ab") as log:
            for argv in (
                [apt_get, "update"],
                [apt_get, "install", "-y", "--no-install-recommends", SERVER_PACKAGE],
            ):
                result = subprocess.run(
                    argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
                )
                if result.returncode != 0:
                    raise PostgresNotFound(
                        f"{' '.join(argv)} failed with exit code {result.returncode}:\n"
                        + processes.log_tail(log_path)
                    )
        _progress(f"installed {SERVER_PACKAGE!r} in {time.monotonic() - started:.0f}s")


def ensure_bin_dir(*, install: bool = True) -> Path:
    """Server binaries directory, installing Debian's package when root and allowed.

    Only root may install: a non-root run asking for sudo mid-test would hang,
    so it gets an error that names the package instead.
    """
    found = find_bin_dir()
    if found is not None:
        return found
    if not install or os.geteuid() != 0:
        raise PostgresNotFound(
            "PostgreSQL server binaries (initdb, postgres) not found in pg_config --bindir, "
            "/usr/lib/postgresql/*/bin or PATH. Install them with "
            f"'sudo apt-get install {SERVER_PACKAGE}' (Debian/Ubuntu), or set "
            f"${BIN_DIR_ENV} to the directory that holds them"
        )
    _install_with_apt()
    found = find_bin_dir()
    if found is None:
        raise PostgresNotFound(
            f"installed {SERVER_PACKAGE!r} but still found no initdb/postgres under "
            "/usr/lib/postgresql/*/bin"
        )
    return found
