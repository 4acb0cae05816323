"""Which table the migrations act on: passed in by ``outbox db``, or by ``-x`` arguments.

The table name and schema are not fixed, so every revision asks here instead
of naming them (the revisions and ``env.py``, in ``migrations/``, are scripts
Alembic loads by path; what they share is imported from here, by the
library's own name). ``outbox db`` sets ``config.attributes``; the plain ``alembic``
command passes ``-x table=NAME -x schema=NAME`` instead.
"""

from __future__ import annotations

from collections.abc import Mapping

from alembic import context
from alembic.config import Config

from outbox.sql.log import DEFAULT_TABLE, LogTarget

TABLE_ATTRIBUTE = "outbox_table"
SCHEMA_ATTRIBUTE = "outbox_schema"
_RESOLVED = "outbox_log_target"


def resolve(config: Config, x_arguments: Mapping[str, str]) -> LogTarget:
    """The target of this run; remembered on ``config`` for the revisions to read."""
    table = config.attributes.get(TABLE_ATTRIBUTE) or x_arguments.get("table") or DEFAULT_TABLE
    schema = config.attributes.get(SCHEMA_ATTRIBUTE) or x_arguments.get("schema") or None
    target = LogTarget(table, schema)
    config.attributes[_RESOLVED] = target
    return target


def current() -> LogTarget:
    """The target of the running migration (call from a revision's upgrade/downgrade)."""
    return context.config.attributes[_RESOLVED]
