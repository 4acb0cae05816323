"""Keep a parked send's half in its log row until the checker drains it.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-28

With ``park_when_unavailable`` a send whose half Kafka did not acknowledge in
time stores the half in ``parked_half``, in the same database transaction as
the business change; the checker writes it to Kafka when Kafka takes writes
again and clears the column. ``drain_from_offset`` is the half partition's end
when the checker first set out to drain the row: were it to crash between
Kafka's commit and the row's update, the half it wrote is found from there,
never written twice. A partial index finds the parked rows in a log of millions.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from outbox.sql.migration_target import current

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    target = current()
    with op.batch_alter_table(target.table, schema=target.schema) as table:
        table.add_column(sa.Column("parked_half", sa.LargeBinary(), nullable=True))
        table.add_column(sa.Column("drain_from_offset", sa.BigInteger(), nullable=True))
    parked = sa.text("parked_half IS NOT NULL")
    op.create_index(
        f"ix_{target.table}_parked",
        target.table,
        ["half_partition", "created_at"],
        schema=target.schema,
        postgresql_where=parked,
        sqlite_where=parked,
    )


def downgrade() -> None:
    target = current()
    op.drop_index(f"ix_{target.table}_parked", table_name=target.table, schema=target.schema)
    with op.batch_alter_table(target.table, schema=target.schema) as table:
        table.drop_column("drain_from_offset")
        table.drop_column("parked_half")
