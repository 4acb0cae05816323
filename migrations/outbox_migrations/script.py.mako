"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}

The table name and schema are configurable: take them from
``migrations.target.current()``, never write them out.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from migrations.target import current
${imports if imports else ""}
revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}


def upgrade() -> None:
    target = current()
    ${upgrades if upgrades else "pass"}


def downgrade() -> None:
    target = current()
    ${downgrades if downgrades else "pass"}
