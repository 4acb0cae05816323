"""The chaos run's database on each server it starts: migrated, reached through its socket
(as a host in a network namespace reaches it), and kept as a dump after a failed verdict."""

from __future__ import annotations

import io

import pytest
import sqlalchemy as sa
from rich.console import Console

from outbox.sql import create_engine
from outbox_devtools.chaos.database import ChaosDatabase
from outbox_devtools.chaos.worker import ORDERS_TABLE


@pytest.mark.parametrize(
    "kind",
    [
        pytest.param("postgresql", marks=pytest.mark.postgres),
        pytest.param("mariadb", marks=pytest.mark.mariadb),
    ],
)
def test_the_database_is_prepared_reached_by_its_socket_and_kept(kind, tmp_path):
    with ChaosDatabase(kind) as database:
        database.prepare(slow_commit_seconds=0.1)
        engine = create_engine(database.socket_url())
        try:
            with engine.begin() as connection:
                connection.execute(
                    sa.text(
                        f"INSERT INTO {ORDERS_TABLE} (id, total, slow) VALUES ('o-1', 12.5, :s)"
                    ),
                    {"s": database.blocks_commits},  # a slow COMMIT only where one can block
                )
            with engine.connect() as connection:
                total = connection.execute(sa.text(f"SELECT total FROM {ORDERS_TABLE}")).scalar()
        finally:
            engine.dispose()
        assert float(total) == 12.5
        assert database.blocks_commits is (kind == "postgresql")
        said = io.StringIO()
        database.keep(Console(file=said), tmp_path / "database.sql")
        dump = (tmp_path / "database.sql").read_text()
    assert "database kept as" in said.getvalue(), said.getvalue()
    assert ORDERS_TABLE in dump and "outbox_transaction_log" in dump
