"""A throwaway PostgreSQL cluster run as a plain local process.

Tests, the demo and the benchmarks need a real PostgreSQL (the outbox's whole
point is the transaction the business write shares with the half record), and
many machines have no Docker engine. Debian ships the server binaries
(:mod:`outbox_devtools.postgres_binaries` finds or installs them); this module
creates a fresh cluster in a temporary directory, serves it on a free loopback
port and throws it away afterwards.

The cluster is tuned for speed, not durability: ``initdb --no-sync`` and
``fsync=off`` / ``synchronous_commit=off`` / ``full_page_writes=off``. A crash
of the machine may corrupt it, which does not matter for data that is deleted
on ``stop()`` anyway; never point it at data you want to keep.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Self

from outbox_devtools import processes
from outbox_devtools.postgres_binaries import (
    SERVER_PACKAGE,
    PostgresNotFound,
    check_bin_dir,
    ensure_bin_dir,
)

SUPERUSER = "postgres"
SYSTEM_USER = "postgres"
"""The account the Debian package creates; the server refuses to run as root."""

_BIND_FAILURE = re.compile(r"could not bind|Address already in use|could not create listen socket")
_PORT_ATTEMPTS = 3
_ROOT_PREFIX = "outbox-pg-"
# Unix socket paths are limited to 107 bytes; leave room for "/.s.PGSQL.NNNNN".
_MAX_SOCKET_DIR = 90


class PostgresDumpError(RuntimeError):
    """``pg_dump`` could not write the database where asked; its own words say why."""


class PostgresStartError(RuntimeError):
    """The server was found but did not come up; the message carries its log tail."""


def _traversable_by_others(path: Path) -> bool:
    """Whether a non-root user can reach inside ``path`` (every ancestor has o+x)."""
    for part in [path, *path.parents]:
        try:
            mode = part.stat().st_mode
        except OSError:
            return False
        if not mode & stat.S_IXOTH:
            return False
    return True


def _sweep_stale(parent: Path) -> None:
    """Delete clusters left by sessions that were killed before ``stop()`` could run.

    The kernel kills the server with its parent, but nothing deletes the
    directory then. A cluster whose ``postmaster.pid`` names a dead process is
    such a leftover; one without that file may be mid-initdb in another session
    and is left alone. initdb's standalone backends write their own pid negated there
    (PostgreSQL's ``CreateLockFile``), so the sign is dropped: read as a process group, a
    live initdb in another session looked dead and had its directory deleted under it.
    """
    for root in parent.glob(f"{_ROOT_PREFIX}*"):
        pid_file = root / "data" / "postmaster.pid"
        try:
            pid = abs(int(pid_file.read_text().split("\n", 1)[0]))
        except (OSError, ValueError):
            continue
        if _process_gone(pid):
            shutil.rmtree(root, ignore_errors=True)


def _process_gone(pid: int) -> bool:
    """Dead, or a zombie nobody reaped yet (a minimal container init may never reap)."""
    if not processes.pid_alive(pid):
        return True
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The state letter follows the parenthesised command name, which may hold spaces.
    return stat_line.rpartition(")")[2].split()[:1] == ["Z"]


class LocalPostgres:
    """One throwaway cluster: own data directory, own loopback port, own database.

    The ``postgres`` server process is started directly and attached, so the
    kernel kills it when this Python process dies, however it dies; ``stop()``
    (also run at exit) shuts it down and deletes the directory. When running as
    root the cluster belongs to the ``postgres`` system user, because the server
    refuses to run as root.

    Authentication is ``trust`` on 127.0.0.1 only: nothing but local processes
    can reach it, and tests need no password plumbing.
    """

    def __init__(
        self,
        *,
        database: str = "outbox",
        bin_dir: Path | str | None = None,
        port: int | None = None,
        base_dir: Path | str | None = None,
        settings: Mapping[str, str] | None = None,
        start_timeout: float = 60.0,
        install: bool = True,
    ) -> None:
        if not database or "\x00" in database:
            raise ValueError(f"invalid database name {database!r}")
        self.database = database
        self._explicit_bin_dir = Path(bin_dir).expanduser() if bin_dir is not None else None
        self._requested_port = port
        self._base_dir = Path(base_dir).expanduser() if base_dir is not None else None
        self._settings = dict(settings or {})
        self._start_timeout = start_timeout
        self._install = install
        self._run_as = SYSTEM_USER if os.geteuid() == 0 else None
        self._root: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._port: int | None = None
        self.bin_dir: Path | None = None

    # -- what callers use -------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("LocalPostgres is not started")
        return self._port

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the created database (psycopg 3 driver, trust auth)."""
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/{self.database}"

    @property
    def conninfo(self) -> str:
        """libpq connection string, for psycopg or psql directly."""
        return f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname={self.database}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def root_dir(self) -> Path | None:
        """The temporary directory holding data, socket and logs (gone after stop)."""
        return self._root

    @property
    def log_path(self) -> Path:
        if self._root is None:
            raise RuntimeError("LocalPostgres is not started")
        return self._root / "postgres.log"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def __repr__(self) -> str:
        where = f"port={self._port}" if self._port is not None else "not started"
        return f"<LocalPostgres {self.database} {where}>"

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- lifecycle --------------------------------------------------------

    def start(self) -> Self:
        """initdb, start the server, wait until it answers, create the database."""
        if self._process is not None:
            raise RuntimeError(f"{self!r} is already started")
        if self._explicit_bin_dir is not None:
            self.bin_dir = check_bin_dir(self._explicit_bin_dir, "bin_dir")
        else:
            self.bin_dir = ensure_bin_dir(install=self._install)
        owner = self._owner()
        self._root = self._make_root(owner)
        atexit.register(self.stop)
        try:
            self._initdb(owner)
            self._start_server()
            self._create_database()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, grace_seconds: float = 15.0) -> None:
        """Shut down and delete the cluster; safe to call twice or after a failed start.

        SIGTERM is PostgreSQL's smart shutdown, which waits for clients to
        disconnect. A leaked connection pool would hold it forever, so after a
        third of the grace it escalates to SIGINT (fast shutdown: still clean,
        disconnects clients), and only then to SIGKILL, which would leave
        backends and shared memory behind for the kernel to reap.
        """
        atexit.unregister(self.stop)
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            for sig, share in ((signal.SIGTERM, 1 / 3), (signal.SIGINT, 2 / 3)):
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(sig)
                try:
                    process.wait(timeout=grace_seconds * share)
                    break
                except subprocess.TimeoutExpired:
                    continue
            else:
                process.kill()
                process.wait(timeout=10)
        root, self._root = self._root, None
        self._port = None
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)

    def dump(self, path: Path | str) -> Path:
        """Write the database as a plain SQL script (``pg_dump``) to ``path``.

        The cluster is deleted when it stops; a run whose verdict failed keeps
        what its database said this way, for the post-mortem.
        """
        if self._process is None or self.bin_dir is None:
            raise RuntimeError(f"{self!r} is not started: there is no database to dump")
        target = Path(path)
        processes.run_dump(
            [str(self.bin_dir / "pg_dump"), "--dbname", self.conninfo, "--file", str(target)],
            PostgresDumpError,
            f"pg_dump of {self.database} to {target}",
        )
        return target

    # -- steps ------------------------------------------------------------

    def _owner(self) -> pwd.struct_passwd | None:
        if self._run_as is None:
            return None
        try:
            return pwd.getpwnam(self._run_as)
        except KeyError:
            raise PostgresNotFound(
                f"running as root, and PostgreSQL refuses to; but there is no {self._run_as!r} "
                f"system user to run it as (the Debian package {SERVER_PACKAGE!r} creates it)"
            ) from None

    def _make_root(self, owner: pwd.struct_passwd | None) -> Path:
        parent = self._base_dir or Path(tempfile.gettempdir())
        parent.mkdir(parents=True, exist_ok=True)
        if owner is not None and not _traversable_by_others(parent):
            if self._base_dir is not None:
                raise PostgresStartError(
                    f"base_dir {parent} is not reachable by the {owner.pw_name!r} user "
                    "(some ancestor lacks o+x)"
                )
            parent = Path("/tmp")
        _sweep_stale(parent)
        root = Path(tempfile.mkdtemp(prefix=_ROOT_PREFIX, dir=parent))
        if len(str(root / "run")) > _MAX_SOCKET_DIR:
            shutil.rmtree(root, ignore_errors=True)
            raise PostgresStartError(
                f"{root} is too long a path for a Unix socket directory; pass a shorter base_dir"
            )
        (root / "run").mkdir()
        if owner is not None:
            for path in (root, root / "run"):
                os.chown(path, owner.pw_uid, owner.pw_gid)
        return root

    def _env(self) -> dict[str, str]:
        """The caller's environment minus libpq/server variables that would override ours."""
        env = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
        env["LC_ALL"] = "C"
        if self._run_as is not None:
            env["HOME"] = pwd.getpwnam(self._run_as).pw_dir
        return env

    def _initdb(self, owner: pwd.struct_passwd | None) -> None:
        assert self._root is not None and self.bin_dir is not None
        log_path = self._root / "initdb.log"
        argv = [
            str(self.bin_dir / "initdb"),
            "-D",
            str(self._root / "data"),
            "--auth=trust",
            "-U",
            SUPERUSER,
            "--encoding=UTF8",
            "--no-locale",
            "--no-sync",
        ]
        ids: dict[str, object] = {}
        if owner is not None:
            ids = {"user": owner.pw_uid, "group": owner.pw_gid, "extra_groups": []}
        with log_path.open("wb") as log:
            result = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env(),
                cwd=self._root,
                timeout=120,
                **ids,  # type: ignore[arg-type]
            )
        if result.returncode != 0:
            raise PostgresStartError(
                f"initdb failed with exit code {result.returncode}:\n"
                + processes.log_tail(log_path)
            )

    def _server_argv(self, port: int) -> list[str]:
        assert self._root is not None and self.bin_dir is not None
        settings = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self._root / "run"),
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": "200",
            **self._settings,
        }
        argv = [str(self.bin_dir / "postgres"), "-D", str(self._root / "data"), "-p", str(port)]
        for key, value in settings.items():
            argv += ["-c", f"{key}={value}"]
        return argv

    def _start_server(self) -> None:
        """Start and wait; on a lost port race (free_port is only a snapshot) try another."""
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            port = self._requested_port or processes.free_port()
            log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
            self._process = processes.spawn(
                self._server_argv(port),
                log_path=self.log_path,
                env=self._env(),
                cwd=self._root,
                user=self._run_as,
            )
            self._port = port
            try:
                self._wait_ready()
                return
            except PostgresStartError:
                died = self._process.poll() is not None
                new_log = self.log_path.read_bytes()[log_offset:].decode(errors="replace")
                bind_lost = died and _BIND_FAILURE.search(new_log) is not None
                if not bind_lost or self._requested_port or attempt == _PORT_ATTEMPTS:
                    raise
                self._process = None
                self._port = None

    def _wait_ready(self) -> None:
        """Connect until the server accepts; fail at once with its log if it died."""
        psycopg = _import_psycopg()
        assert self._process is not None and self._port is not None
        deadline = time.monotonic() + self._start_timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise PostgresStartError(
                    f"postgres exited with code {self._process.returncode} during startup "
                    f"(port {self._port}):\n{processes.log_tail(self.log_path)}"
                )
            try:
                with psycopg.connect(
                    host="127.0.0.1",
                    port=self._port,
                    user=SUPERUSER,
                    dbname="postgres",
                    connect_timeout=2,
                ) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError as exc:
                last_error = exc
                time.sleep(0.05)
        raise PostgresStartError(
            f"postgres did not accept connections on 127.0.0.1:{self._port} within "
            f"{self._start_timeout:.0f}s (last error: {last_error}):\n"
            f"{processes.log_tail(self.log_path)}"
        )

    def _create_database(self) -> None:
        psycopg = _import_psycopg()
        from psycopg import sql

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user=SUPERUSER, dbname="postgres", autocommit=True
        ) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (self.database,)
            ).fetchone()
            if exists is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.database)))


def _import_psycopg() -> ModuleType:
    """psycopg is the ``postgres`` extra; say so instead of a bare ImportError."""
    try:
        import psycopg
    except ImportError as exc:
        raise PostgresStartError(
            "LocalPostgres needs psycopg 3: pip install 'kafka-outbox[postgres]'"
        ) from exc
    return psycopg
