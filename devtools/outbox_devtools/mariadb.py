"""A throwaway MariaDB server run as a plain local process.

The transaction log is tested on MySQL's protocol as on PostgreSQL's: against a
real server, with no Docker engine needed. Debian's ``mariadb-server`` package
carries ``mariadb-install-db`` and ``mariadbd``; this module creates a fresh data
directory in a temporary directory, serves it on a free loopback port and throws
it away afterwards, like :class:`~outbox_devtools.postgres.LocalPostgres`.

Every program runs with ``--no-defaults``: the package's ``/etc/mysql`` files
(its socket, its data directory, its log) belong to the system's server, never
to this one. The server is tuned for speed, not durability
(``innodb_flush_log_at_trx_commit=0``, no binary log, ``innodb_doublewrite=0``):
the data is deleted on ``stop()`` anyway; never point it at data you want to keep.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Self

from outbox_devtools import processes

SERVER_PACKAGE = "mariadb-server"
"""The Debian/Ubuntu package that carries ``mariadb-install-db`` and ``mariadbd``."""

SUPERUSER = "root"
"""Created without a password (``--auth-root-authentication-method=normal``), for
127.0.0.1 only: nothing but local processes can reach the server."""

_SEARCH_DIRS = ("/usr/sbin", "/usr/bin", "/usr/local/sbin", "/usr/local/bin")
_BIND_FAILURE = re.compile(r"Can't start server: Bind on TCP/IP port|Address already in use")
_PORT_ATTEMPTS = 3
_ROOT_PREFIX = "outbox-mariadb-"
# Unix socket paths are limited to 107 bytes.
_MAX_SOCKET_PATH = 100


class MariaDBNotFound(RuntimeError):
    """No MariaDB server binaries on this machine; the message names the package."""


class MariaDBStartError(RuntimeError):
    """The server was found but did not come up; the message carries its log tail."""


class MariaDBDumpError(RuntimeError):
    """``mariadb-dump`` could not write the database where asked; its own words say why."""


def find_binary(name: str) -> Path | None:
    """``name`` on ``PATH`` or in the system directories (``/usr/sbin`` is often off PATH)."""
    found = shutil.which(name) or shutil.which(name, path=os.pathsep.join(_SEARCH_DIRS))
    return Path(found) if found else None


def _require_binaries() -> tuple[Path, Path]:
    install_db, server = find_binary("mariadb-install-db"), find_binary("mariadbd")
    missing = [
        name
        for name, path in (("mariadb-install-db", install_db), ("mariadbd", server))
        if path is None
    ]
    if install_db is None or server is None:
        raise MariaDBNotFound(
            f"MariaDB server binaries not found ({', '.join(missing)}, on PATH or in "
            f"{', '.join(_SEARCH_DIRS)}): install them with "
            f"'sudo apt-get install --no-install-recommends {SERVER_PACKAGE}' (Debian/Ubuntu)"
        )
    return install_db, server


def _sweep_stale(parent: Path) -> None:
    """Delete servers' directories left by sessions killed before ``stop()`` could run.

    The kernel kills the server with its parent, but nothing deletes the directory
    then. A directory whose ``mariadbd.pid`` names a dead process is such a leftover;
    one without that file may be mid-install in another session and is left alone.
    """
    for root in parent.glob(f"{_ROOT_PREFIX}*"):
        try:
            pid = int((root / "mariadbd.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        if not processes.pid_alive(pid):
            shutil.rmtree(root, ignore_errors=True)


class LocalMariaDB:
    """One throwaway server: own data directory, own socket, own loopback port, own database.

    ``mariadbd`` is started directly and attached, so the kernel kills it when this
    Python process dies, however it dies; ``stop()`` (also run at exit) shuts it down
    and deletes the directory. As root the server runs as root (``--user=root``): its
    files live in a directory nobody else needs to reach.
    """

    def __init__(
        self,
        *,
        database: str = "outbox",
        port: int | None = None,
        base_dir: Path | str | None = None,
        settings: Mapping[str, str] | None = None,
        start_timeout: float = 60.0,
    ) -> None:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", database):
            raise ValueError(f"invalid database name {database!r}")
        self.database = database
        self._requested_port = port
        self._base_dir = Path(base_dir).expanduser() if base_dir is not None else None
        self._settings = dict(settings or {})
        self._start_timeout = start_timeout
        # mariadbd refuses root unless told so; as anyone else the switch is not wanted.
        self._user_args = ["--user=root"] if os.geteuid() == 0 else []
        self._root: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._port: int | None = None

    # -- what callers use -------------------------------------------------

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("LocalMariaDB is not started")
        return self._port

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the created database (PyMySQL driver, no password)."""
        return f"mysql+pymysql://{SUPERUSER}@127.0.0.1:{self.port}/{self.database}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def root_dir(self) -> Path | None:
        """The temporary directory holding data, socket and logs (gone after stop)."""
        return self._root

    @property
    def socket_path(self) -> Path:
        return self._dir() / "mariadbd.sock"

    @property
    def log_path(self) -> Path:
        return self._dir() / "mariadbd.log"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def __repr__(self) -> str:
        where = f"port={self._port}" if self._port is not None else "not started"
        return f"<LocalMariaDB {self.database} {where}>"

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
        """Install the system tables, start the server, wait until it answers, create the db."""
        if self._process is not None:
            raise RuntimeError(f"{self!r} is already started")
        install_db, server = _require_binaries()
        self._root = self._make_root()
        atexit.register(self.stop)
        try:
            self._install_db(install_db)
            self._start_server(server)
            self._create_database()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, grace_seconds: float = 15.0) -> None:
        """Shut down and delete the data; safe to call twice or after a failed start.

        SIGTERM is mariadbd's normal shutdown: it ends client connections itself,
        so a leaked connection pool cannot hold it; SIGKILL only if it overruns.
        """
        atexit.unregister(self.stop)
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=grace_seconds)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        root, self._root = self._root, None
        self._port = None
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)

    def dump(self, path: Path | str) -> Path:
        """Write the database as a plain SQL script (``mariadb-dump``) to ``path``.

        The server is deleted when it stops; a chaos run whose verdict failed keeps
        what its database said this way, for the post-mortem.
        """
        dump = find_binary("mariadb-dump")
        if not self.running or dump is None:
            raise MariaDBDumpError(f"{self!r}: no running server or no mariadb-dump to dump it")
        target = Path(path)
        processes.run_dump(
            [
                str(dump),
                "--no-defaults",
                f"--socket={self.socket_path}",
                f"--user={SUPERUSER}",
                f"--result-file={target}",
                self.database,
            ],
            MariaDBDumpError,
            f"mariadb-dump of {self.database} to {target}",
        )
        return target

    # -- steps ------------------------------------------------------------

    def _dir(self) -> Path:
        if self._root is None:
            raise RuntimeError("LocalMariaDB is not started")
        return self._root

    def _make_root(self) -> Path:
        parent = self._base_dir or Path(tempfile.gettempdir())
        parent.mkdir(parents=True, exist_ok=True)
        _sweep_stale(parent)
        root = Path(tempfile.mkdtemp(prefix=_ROOT_PREFIX, dir=parent))
        if len(str(root / "mariadbd.sock")) > _MAX_SOCKET_PATH:
            shutil.rmtree(root, ignore_errors=True)
            raise MariaDBStartError(
                f"{root} is too long a path for a Unix socket; pass a shorter base_dir"
            )
        return root

    def _env(self) -> dict[str, str]:
        """The caller's environment minus the client variables that would override ours."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MYSQL", "MARIADB"))}
        env["LC_ALL"] = "C"
        return env

    def _tmp_dir(self) -> Path:
        """The server's temporary tables, in its own directory: servers sharing ``TMPDIR``
        (one per suite worker) deleted each other's while ``mariadb-install-db`` ran."""
        tmp = self._dir() / "tmp"
        tmp.mkdir(exist_ok=True)
        return tmp

    def _install_db(self, install_db: Path) -> None:
        root = self._dir()
        log_path = root / "install-db.log"
        argv = [
            str(install_db),
            "--no-defaults",
            f"--datadir={root / 'data'}",
            f"--tmpdir={self._tmp_dir()}",
            *self._user_args,
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            "--skip-name-resolve",
        ]
        with log_path.open("wb") as log:
            result = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self._env(),
                cwd=root,
                timeout=120,
            )
        if result.returncode != 0:
            raise MariaDBStartError(
                f"mariadb-install-db failed with exit code {result.returncode}:\n"
                + processes.log_tail(log_path)
            )

    def _server_argv(self, server: Path, port: int) -> list[str]:
        root = self._dir()
        settings = {
            "datadir": str(root / "data"),
            "tmpdir": str(self._tmp_dir()),
            "socket": str(self.socket_path),
            "pid-file": str(root / "mariadbd.pid"),
            "log-error": str(self.log_path),
            "port": str(port),
            "bind-address": "127.0.0.1",
            "skip-name-resolve": "ON",
            "innodb-flush-log-at-trx-commit": "0",
            "innodb-doublewrite": "0",
            "innodb-buffer-pool-size": "64M",
            "max-connections": "200",
            "character-set-server": "utf8mb4",
            "collation-server": "utf8mb4_bin",
            **self._settings,
        }
        options = [f"--{key}={value}" for key, value in settings.items()]
        return [str(server), "--no-defaults", *options, *self._user_args]

    def _start_server(self, server: Path) -> None:
        """Start and wait; on a lost port race (free_port is only a snapshot) try another."""
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            port = self._requested_port or processes.free_port()
            log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
            self._process = processes.spawn(
                self._server_argv(server, port),
                log_path=self._dir() / "mariadbd.out",
                env=self._env(),
                cwd=self._root,
            )
            self._port = port
            try:
                self._wait_ready()
                return
            except MariaDBStartError:
                died = self._process.poll() is not None
                new_log = self._log_bytes()[log_offset:].decode(errors="replace")
                bind_lost = died and _BIND_FAILURE.search(new_log) is not None
                if not bind_lost or self._requested_port or attempt == _PORT_ATTEMPTS:
                    raise
                self._process = None
                self._port = None

    def _log_bytes(self) -> bytes:
        try:
            return self.log_path.read_bytes()
        except FileNotFoundError:
            return b""

    def _log_tails(self) -> str:
        return "\n".join(
            processes.log_tail(path) for path in (self.log_path, self._dir() / "mariadbd.out")
        )

    def _wait_ready(self) -> None:
        """Connect until the server accepts; fail at once with its log if it died."""
        pymysql = _import_pymysql()
        assert self._process is not None and self._port is not None
        deadline = time.monotonic() + self._start_timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise MariaDBStartError(
                    f"mariadbd exited with code {self._process.returncode} during startup "
                    f"(port {self._port}):\n{self._log_tails()}"
                )
            try:
                pymysql.connect(**self._connect_args(), connect_timeout=2).close()
                return
            except pymysql.err.OperationalError as exc:
                last_error = exc
                time.sleep(0.05)
        raise MariaDBStartError(
            f"mariadbd did not accept connections on 127.0.0.1:{self._port} within "
            f"{self._start_timeout:.0f}s (last error: {last_error}):\n{self._log_tails()}"
        )

    def _connect_args(self) -> dict[str, object]:
        return {"host": "127.0.0.1", "port": self.port, "user": SUPERUSER}

    def _create_database(self) -> None:
        connection = _import_pymysql().connect(**self._connect_args(), autocommit=True)
        try:
            with connection.cursor() as cursor:
                cursor.execute(f"CREATE DATABASE IF NOT EXISTS `{self.database}`")
        finally:
            connection.close()


def _import_pymysql() -> ModuleType:
    """PyMySQL is the ``mysql`` extra; say so instead of a bare ImportError."""
    try:
        import pymysql
    except ImportError as exc:
        raise MariaDBStartError(
            "LocalMariaDB needs PyMySQL: pip install 'kafka-outbox[mysql]'"
        ) from exc
    return pymysql
