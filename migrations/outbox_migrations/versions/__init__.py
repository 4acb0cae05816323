"""Revisions of the transaction-log table (a package, so wheels carry it)."""
