"""Alembic migrations for the outbox transaction-log table.

Installed as ``outbox_migrations`` (``pyproject.toml`` maps this folder), a name no
service's own ``migrations/`` shadows; ``outbox.sql.migrate`` finds the scripts by it.
"""
