"""MySQL and MariaDB: log times to the microsecond, parked halves up to Kafka's record size.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03

The generic types of revisions 0001-0004 mean other things on MySQL: ``DateTime``
is ``DATETIME``, whole seconds, so rows written in the same second tie (the parked
drain's order, the prune horizon); ``LargeBinary`` is ``BLOB``, at most 64 KiB, so
a parked half of a larger record is refused. MySQL's columns become ``DATETIME(6)``
and ``LONGBLOB``. ``DATETIME`` keeps no time zone: the log writes UTC digits, as on
SQLite. Other databases are left as they are.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from outbox.sql.migration_target import current

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_MYSQL = ("mysql", "mariadb")


def _times(fsp: int) -> dict[str, object]:
    now = "CURRENT_TIMESTAMP" + (f"({fsp})" if fsp else "")
    return {
        "type_": mysql.DATETIME(fsp=fsp),
        "existing_nullable": False,
        "nullable": False,
        "server_default": sa.text(now),
    }


def _alter(fsp: int, blob: sa.types.TypeEngine[bytes]) -> None:
    if op.get_bind().dialect.name not in _MYSQL:
        return
    target = current()
    for table in (target.table, target.rollback_table):
        op.alter_column(table, "created_at", schema=target.schema, **_times(fsp))  # type: ignore[arg-type]
    op.alter_column(target.table, "parked_half", type_=blob, schema=target.schema)


def upgrade() -> None:
    _alter(6, mysql.LONGBLOB())


def downgrade() -> None:
    _alter(0, mysql.BLOB())
