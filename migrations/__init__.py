"""Alembic migrations for the outbox transaction-log table."""
