"""Create the transaction-log table.

Revision ID: 0001
Revises:
Create Date: 2025-01-01

The columns are spelled out rather than imported from ``outbox.sql.log``: a
revision is a snapshot, and must not change when the current model does.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from outbox.sql.migration_target import current

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    target = current()
    op.create_table(
        target.table,
        sa.Column("transaction_id", sa.String(128), nullable=False),
        sa.Column("producer_group", sa.String(249), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            nullable=False,
            server_default=sa.func.current_timestamp(),
        ),
        sa.PrimaryKeyConstraint("transaction_id", name=f"{target.table}_pkey"),
        schema=target.schema,
    )
    # Pruning deletes by age: without this index every batch scans the table.
    op.create_index(
        f"ix_{target.table}_created_at", target.table, ["created_at"], schema=target.schema
    )


def downgrade() -> None:
    target = current()
    op.drop_index(f"ix_{target.table}_created_at", table_name=target.table, schema=target.schema)
    op.drop_table(target.table, schema=target.schema)
