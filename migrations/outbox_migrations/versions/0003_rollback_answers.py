"""Keep every ROLLBACK answer, one row per half, beside the log.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24

Revision 0002 wrote a check-back's ROLLBACK answer into the log row of its
transaction id. An id has one log row, so with a reused id the ROLLBACK answer
for a second half replaced the first half's: the first half's local
transaction, late past its time check (a clock stepped back, host skew), could
then commit, committed in the database and never published. Each ROLLBACK
answer is now also kept in ``<table>_rollback``, one row per half, which the
local transaction reads before it commits.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from outbox.sql.migration_target import current

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    target = current()
    table = f"{target.table}_rollback"
    op.create_table(
        table,
        sa.Column("transaction_id", sa.String(128), nullable=False),
        sa.Column("half_partition", sa.Integer(), nullable=False),
        sa.Column("half_offset", sa.BigInteger(), nullable=False),
        sa.Column("producer_group", sa.String(249), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.func.current_timestamp(),
        ),
        sa.PrimaryKeyConstraint(
            "transaction_id", "half_partition", "half_offset", name=f"{table}_pkey"
        ),
        schema=target.schema,
    )
    # Pruning deletes by age, as in the log table.
    op.create_index(f"{table}_at", table, ["created_at"], schema=target.schema)


def downgrade() -> None:
    target = current()
    table = f"{target.table}_rollback"
    op.drop_index(f"{table}_at", table_name=table, schema=target.schema)
    op.drop_table(table, schema=target.schema)
