"""LocalPostgres against the real server binaries: no mocks, real processes and sockets.

These are the guarantees the rest of the suite leans on when there is no
Docker: it answers SQL, it keeps what was written, it leaves nothing running
or on disk, and two sessions (or xdist workers) never collide.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

from outbox_devtools import processes
from outbox_devtools.postgres import LocalPostgres, PostgresDumpError, PostgresStartError
from outbox_devtools.postgres_binaries import PostgresNotFound

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def local_pg() -> Iterator[LocalPostgres]:
    with LocalPostgres() as pg:
        yield pg


def _accepts_tcp(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_answers_sql_through_sqlalchemy(local_pg: LocalPostgres) -> None:
    assert local_pg.url == f"postgresql+psycopg://postgres@127.0.0.1:{local_pg.port}/outbox"
    engine = sa.create_engine(local_pg.url)
    try:
        with engine.connect() as conn:
            version = conn.execute(sa.text("SELECT version()")).scalar_one()
            database = conn.execute(sa.text("SELECT current_database()")).scalar_one()
    finally:
        engine.dispose()
    assert version.startswith("PostgreSQL ")
    assert database == "outbox"


def test_keeps_what_a_committed_transaction_wrote(local_pg: LocalPostgres) -> None:
    engine = sa.create_engine(local_pg.url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE greeting (id serial PRIMARY KEY, body text)"))
            conn.execute(sa.text("INSERT INTO greeting (body) VALUES ('hello'), ('world')"))
        with engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO greeting (body) VALUES ('rolled back')"))
            conn.rollback()
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT body FROM greeting ORDER BY id")).scalars().all()
    finally:
        engine.dispose()
    assert rows == ["hello", "world"]


def test_listens_on_loopback_only(local_pg: LocalPostgres) -> None:
    with psycopg.connect(local_pg.conninfo) as conn:
        listen = conn.execute("SHOW listen_addresses").fetchone()
    assert listen == ("127.0.0.1",)


def test_stop_ends_the_server_and_deletes_the_cluster() -> None:
    pg = LocalPostgres().start()
    pid, port, root = pg.pid, pg.port, pg.root_dir
    assert pid is not None and root is not None
    assert processes.pid_alive(pid) and _accepts_tcp(port) and root.is_dir()

    pg.stop()

    assert not processes.pid_alive(pid)
    assert not _accepts_tcp(port)
    assert not root.exists()
    assert not pg.running
    pg.stop()  # a second stop is harmless


def test_stop_does_not_hang_on_a_leaked_connection() -> None:
    """Smart shutdown would wait for this client forever; stop() must escalate.

    With a 6 s grace, smart shutdown gets 2 s and fast shutdown then ends it: the
    client is told so by the server itself ("terminating connection due to
    administrator command"), which a SIGKILL at the end of the grace would not say.
    """
    pg = LocalPostgres().start()
    pid = pg.pid
    assert pid is not None
    leaked = psycopg.connect(pg.conninfo)
    try:
        pg.stop(grace_seconds=6)
        assert not processes.pid_alive(pid)
        with pytest.raises(psycopg.OperationalError, match="administrator command"):
            leaked.execute("SELECT 1")
    finally:
        leaked.close()


def test_a_second_cluster_runs_beside_the_first(local_pg: LocalPostgres) -> None:
    with LocalPostgres(database="other") as second:
        assert second.port != local_pg.port
        assert second.root_dir != local_pg.root_dir
        with psycopg.connect(second.conninfo, autocommit=True) as conn:
            conn.execute("CREATE TABLE only_in_second (x int)")
        with psycopg.connect(local_pg.conninfo) as conn:
            found = conn.execute("SELECT to_regclass('only_in_second')").fetchone()
        assert found == (None,)
    assert local_pg.running


def test_server_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """A SIGKILLed pytest must not leave a postmaster behind; the next start sweeps its dir."""
    script = textwrap.dedent(
        """
        import os, sys
        from outbox_devtools.postgres import LocalPostgres
        pg = LocalPostgres(base_dir=sys.argv[1]).start()
        print(pg.pid, pg.port, pg.root_dir, flush=True)
        os.kill(os.getpid(), 9)
        """
    )
    base = Path("/tmp") / f"outbox-pg-test-{os.getpid()}"
    result = subprocess.run(
        [sys.executable, "-c", script, str(base)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == -9, result.stderr
    pid_text, port_text, root_text = result.stdout.split()
    pid, port = int(pid_text), int(port_text)

    assert processes.wait_until(lambda: not _accepts_tcp(port), 10)
    assert Path(root_text).is_dir()  # nothing could delete it: atexit never ran
    try:
        with LocalPostgres(base_dir=base) as again:
            assert again.running
            assert not Path(root_text).exists(), f"stale cluster of dead pid {pid} not swept"
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def test_a_cluster_mid_initdb_is_not_swept_by_another_start() -> None:
    """initdb's standalone backends write their pid negated into postmaster.pid; a second
    start sweeping leftovers must read that as the live process it is, not a dead one."""
    base = Path("/tmp") / f"outbox-pg-initdb-{os.getpid()}"
    mid_initdb = base / "outbox-pg-mid-initdb"
    (mid_initdb / "data").mkdir(parents=True)
    (mid_initdb / "data" / "postmaster.pid").write_text(f"-{os.getpid()}\n")
    try:
        with LocalPostgres(base_dir=base) as again:
            assert again.running
            assert mid_initdb.is_dir(), "a live standalone backend's cluster was swept"
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def test_a_bad_binaries_dir_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "initdb").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "initdb").chmod(0o755)
    pg = LocalPostgres(bin_dir=tmp_path, base_dir=tmp_path / "clusters")

    with pytest.raises(PostgresNotFound) as caught:
        pg.start()

    message = str(caught.value)
    assert str(tmp_path) in message
    assert "postgres" in message.split("missing or not executable:")[1]
    assert "initdb" not in message.split("missing or not executable:")[1]
    assert not (tmp_path / "clusters").exists(), "nothing may be created before the check"
    assert pg.pid is None


def test_a_server_that_dies_on_start_reports_its_log() -> None:
    """Fail fast with the reason, not after the whole start timeout."""
    pg = LocalPostgres(settings={"shared_buffers": "not-a-size"}, start_timeout=600)
    started = time.monotonic()
    with pytest.raises(PostgresStartError, match="shared_buffers"):
        pg.start()
    # Its log, at once: waiting the start timeout out would take 600 s.
    assert time.monotonic() - started < 300
    assert pg.root_dir is None and pg.pid is None


def test_an_empty_database_name_is_refused() -> None:
    with pytest.raises(ValueError, match="database name"):
        LocalPostgres(database="")


def test_session_fixture_gives_a_writable_database(postgres_url: str) -> None:
    engine = sa.create_engine(postgres_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TEMP TABLE probe (x int)"))
            conn.execute(sa.text("INSERT INTO probe VALUES (42)"))
            assert conn.execute(sa.text("SELECT x FROM probe")).scalar_one() == 42
    finally:
        engine.dispose()


def test_sqlite_fixture_is_a_file_shared_by_connections(sqlite_url: str) -> None:
    engine = sa.create_engine(sqlite_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE t (x int)"))
            conn.execute(sa.text("INSERT INTO t VALUES (1)"))
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM t")).scalar_one() == 1
    finally:
        engine.dispose()
    assert sqlite_url.startswith("sqlite:///")
    assert Path(sqlite_url.removeprefix("sqlite:///")).is_file()


def test_dump_keeps_the_database_as_sql_after_the_cluster_is_gone(tmp_path: Path) -> None:
    pg = LocalPostgres(database="dumped")
    with pg:
        engine = sa.create_engine(pg.url)
        with engine.begin() as connection:
            connection.execute(sa.text("CREATE TABLE kept (id int)"))
            connection.execute(sa.text("INSERT INTO kept VALUES (42)"))
        engine.dispose()
        dumped = pg.dump(tmp_path / "dumped.sql")
    text = dumped.read_text()
    assert "CREATE TABLE public.kept" in text
    assert "42" in text
    with pytest.raises(RuntimeError, match="is not started: there is no database to dump"):
        pg.dump(tmp_path / "again.sql")


def test_a_dump_to_a_missing_directory_names_the_path_and_pg_dumps_reason(
    local_pg: LocalPostgres, tmp_path: Path
) -> None:
    target = tmp_path / "no-such-dir" / "dump.sql"
    with pytest.raises(PostgresDumpError, match="No such file or directory") as caught:
        local_pg.dump(target)
    assert str(target) in str(caught.value)
