"""LocalMariaDB against the real server binaries: no mocks, real processes and sockets.

What the SQL tests lean on for MySQL's protocol: it answers SQL, it keeps what a
committed transaction wrote, it listens on loopback only, it leaves nothing running
or on disk, and two servers (or xdist workers) never collide.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from outbox_devtools import processes
from outbox_devtools.mariadb import LocalMariaDB, MariaDBStartError

pytestmark = pytest.mark.mariadb


@pytest.fixture(scope="module")
def local_maria() -> Iterator[LocalMariaDB]:
    with LocalMariaDB() as server:
        yield server


def _accepts_tcp(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_answers_sql_and_keeps_what_a_committed_transaction_wrote(
    local_maria: LocalMariaDB,
) -> None:
    assert local_maria.url == f"mysql+pymysql://root@127.0.0.1:{local_maria.port}/outbox"
    engine = sa.create_engine(local_maria.url)
    try:
        with engine.begin() as conn:
            version = conn.execute(sa.text("SELECT version()")).scalar_one()
            conn.execute(sa.text("CREATE TABLE greeting (id int PRIMARY KEY, body text)"))
            conn.execute(sa.text("INSERT INTO greeting VALUES (1, 'hello'), (2, 'world')"))
        with engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO greeting VALUES (3, 'rolled back')"))
            conn.rollback()
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT body FROM greeting ORDER BY id")).scalars().all()
            tables = "SELECT engine FROM information_schema.tables WHERE table_name = 'greeting'"
            engine_name = conn.execute(sa.text(tables)).scalar_one()
    finally:
        engine.dispose()
    assert "MariaDB" in version
    assert rows == ["hello", "world"]
    assert engine_name == "InnoDB"


def test_listens_on_loopback_only(local_maria: LocalMariaDB) -> None:
    engine = sa.create_engine(local_maria.url)
    try:
        with engine.connect() as conn:
            bound = conn.execute(sa.text("SELECT @@bind_address")).scalar_one()
    finally:
        engine.dispose()
    assert bound == "127.0.0.1"


def test_stop_ends_the_server_and_deletes_its_directory() -> None:
    server = LocalMariaDB().start()
    pid, port, root = server.pid, server.port, server.root_dir
    assert pid is not None and root is not None
    assert processes.pid_alive(pid) and _accepts_tcp(port) and root.is_dir()
    leaked = sa.create_engine(server.url).connect()  # a client must not hold the shutdown

    server.stop()

    assert not processes.pid_alive(pid)
    assert not _accepts_tcp(port)
    assert not root.exists()
    assert not server.running
    server.stop()  # a second stop is harmless
    leaked.invalidate()


def test_a_second_server_runs_beside_the_first(local_maria: LocalMariaDB) -> None:
    with LocalMariaDB(database="other") as second:
        assert second.port != local_maria.port
        assert second.root_dir != local_maria.root_dir
        assert local_maria.running and second.running


def test_server_dies_with_the_process_that_started_it() -> None:
    """A SIGKILLed pytest leaves no mariadbd behind; the next start sweeps its directory."""
    script = textwrap.dedent(
        """
        import os, sys
        from outbox_devtools.mariadb import LocalMariaDB
        server = LocalMariaDB(base_dir=sys.argv[1]).start()
        print(server.pid, server.port, server.root_dir, flush=True)
        os.kill(os.getpid(), 9)
        """
    )
    base = Path("/tmp") / f"outbox-mariadb-test-{os.getpid()}"
    result = subprocess.run(
        [sys.executable, "-c", script, str(base)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == -9, result.stderr
    pid_text, port_text, root_text = result.stdout.split()
    assert processes.wait_until(lambda: not processes.pid_alive(int(pid_text)), 30)
    assert not _accepts_tcp(int(port_text))
    assert Path(root_text).is_dir()  # nothing could delete it: atexit never ran
    try:
        with LocalMariaDB(base_dir=base) as again:
            assert again.running
            assert not Path(root_text).exists(), f"directory of dead pid {pid_text} not swept"
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def test_a_server_that_dies_on_start_reports_its_log() -> None:
    server = LocalMariaDB(settings={"innodb-buffer-pool-size": "not-a-size"})
    with pytest.raises(MariaDBStartError, match="innodb"):
        server.start()
    assert server.root_dir is None and server.pid is None


def test_an_invalid_database_name_is_refused() -> None:
    with pytest.raises(ValueError, match="database name"):
        LocalMariaDB(database="no-dashes")


def test_session_fixture_gives_a_writable_database(mariadb_url: str) -> None:
    engine = sa.create_engine(mariadb_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TEMPORARY TABLE probe (x int)"))
            conn.execute(sa.text("INSERT INTO probe VALUES (42)"))
            assert conn.execute(sa.text("SELECT x FROM probe")).scalar_one() == 42
    finally:
        engine.dispose()
