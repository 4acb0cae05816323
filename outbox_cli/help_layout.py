"""Help screens that hold every flag and variable name whole, whatever the terminal's width.

Typer draws ``--help`` as rich tables (an option's help is a ``Columns`` of its
text, its variable and its default, itself a table). Squeezed by an 80-column
terminal, rich cuts a long cell short with an ellipsis: ``--security-proto…``,
``OUTBOX_SSL_CA_FI…``, names a user then cannot type. Here the tables of the help
screens fold such a cell onto the next line instead.
"""

from __future__ import annotations

from typing import Any

from rich import columns
from rich.table import Table
from typer import rich_utils


class _FoldingTable(Table):
    """A table whose columns fold long text, unless told otherwise, rather than cut it."""

    def add_column(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("overflow", "fold")
        super().add_column(*args, **kwargs)

    def add_row(self, *renderables: Any, **kwargs: Any) -> None:
        while len(self.columns) < len(renderables):
            self.add_column()
        super().add_row(*renderables, **kwargs)


def fold_long_names() -> None:
    """Make every help screen of this process fold its cells (idempotent)."""
    rich_utils.Table = _FoldingTable  # type: ignore[misc]
    columns.Table = _FoldingTable  # type: ignore[misc]
