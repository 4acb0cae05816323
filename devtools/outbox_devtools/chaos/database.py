"""The chaos run's database, started for the run: PostgreSQL (the default) or MariaDB.

Both hold the transaction log (the migrations) and the business ``orders`` table the
producers write. PostgreSQL also makes a share of the orders' COMMITs block past the
listener's grace (a deferred constraint trigger, as a synchronous standby would), so
that a check-back races the COMMIT; MySQL has no deferred trigger, and none block there.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Literal

import sqlalchemy as sa
from rich.console import Console

from outbox.sql import create_engine, upgrade
from outbox_devtools.chaos.worker import ORDERS_TABLE
from outbox_devtools.mariadb import LocalMariaDB
from outbox_devtools.postgres import LocalPostgres

DatabaseKind = Literal["postgresql", "mariadb"]
NAME = "chaos"


class ChaosDatabase(AbstractContextManager["ChaosDatabase"]):
    """One local server of ``kind`` with the run's database, stopped and removed after."""

    def __init__(self, kind: DatabaseKind) -> None:
        self.kind = kind
        self._server: LocalPostgres | LocalMariaDB = (
            LocalPostgres(database=NAME) if kind == "postgresql" else LocalMariaDB(database=NAME)
        )

    def __enter__(self) -> ChaosDatabase:
        self._server.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.stop()

    @property
    def url(self) -> str:
        return self._server.url

    @property
    def label(self) -> str:
        return "PostgreSQL" if self.kind == "postgresql" else "MariaDB"

    @property
    def blocks_commits(self) -> bool:
        """Whether a slow order's COMMIT can be made to block (a deferred trigger)."""
        return self.kind == "postgresql"

    def socket_url(self) -> str:
        """The database's URL through its Unix socket (a network namespace shares the
        filesystem, so a host cut from the brokers still reaches it)."""
        server = self._server
        local = f"@127.0.0.1:{server.port}/"
        assert local in server.url, server.url
        if isinstance(server, LocalMariaDB):
            return server.url.replace(local, "@localhost/") + f"?unix_socket={server.socket_path}"
        assert server.root_dir is not None
        socket_dir = server.root_dir / "run"
        return server.url.replace(local, "@/") + f"?host={socket_dir}&port={server.port}"

    def prepare(self, slow_commit_seconds: float) -> None:
        """The log's migrations and the orders table; on PostgreSQL, a deferred trigger that
        makes a slow order's COMMIT block ``slow_commit_seconds``, after the listener's own
        time check passed."""
        upgrade(self.url)
        engine = create_engine(self.url)
        id_type = "TEXT" if self.kind == "postgresql" else "VARCHAR(64)"
        with engine.begin() as connection:
            connection.execute(
                sa.text(
                    f"CREATE TABLE {ORDERS_TABLE} (id {id_type} PRIMARY KEY, total NUMERIC(12, 2)"
                    " NOT NULL, slow BOOLEAN NOT NULL DEFAULT FALSE)"
                )
            )
            if self.blocks_commits:
                connection.execute(
                    sa.text(
                        "CREATE FUNCTION chaos_slow_commit() RETURNS trigger LANGUAGE plpgsql AS "
                        f"$$ BEGIN PERFORM pg_sleep({slow_commit_seconds}); RETURN NULL; END $$"
                    )
                )
                connection.execute(
                    sa.text(
                        "CREATE CONSTRAINT TRIGGER chaos_slow_commit AFTER INSERT ON "
                        f"{ORDERS_TABLE} DEFERRABLE INITIALLY DEFERRED FOR EACH ROW "
                        "WHEN (NEW.slow) EXECUTE FUNCTION chaos_slow_commit()"
                    )
                )
        engine.dispose()

    def keep(self, console: Console, path: Path) -> None:
        """A failed verdict keeps what the database said (the transaction log, the orders)
        beside the Kafka data and the logs: the server is deleted when it stops."""
        try:
            console.print(f"    database kept as {self._server.dump(path)}", highlight=False)
        except Exception as exc:  # the verdict matters more than its evidence
            console.print(f"    [red]the database could not be kept:[/] {exc}", highlight=False)
