"""Record which half a row belongs to, and rows that record a ROLLBACK answer.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24

A transaction id may be reused (an idempotency key of the caller's): several
halves then carry it, and the row alone cannot say which of them committed. The
row now records the half's identity (half partition and origin offset), so a
check-back about another half of the same id answers ROLLBACK. Rows written
before this revision have no identity and answer by id, as they did.

A check-back that answers ROLLBACK (no row past the grace period) now writes a
``rolled_back`` row for the half, so a local transaction whose COMMIT was
slower than the check cannot commit after it: one of the two rows wins.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from outbox.sql.migration_target import current

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    target = current()
    with op.batch_alter_table(target.table, schema=target.schema) as table:
        table.add_column(sa.Column("half_partition", sa.Integer(), nullable=True))
        table.add_column(sa.Column("half_offset", sa.BigInteger(), nullable=True))
        table.add_column(
            sa.Column("rolled_back", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    target = current()
    with op.batch_alter_table(target.table, schema=target.schema) as table:
        table.drop_column("rolled_back")
        table.drop_column("half_offset")
        table.drop_column("half_partition")
