"""The console tables and progress lines are printed on.

Piped output (CI logs, ``| tee``) has no terminal width; rich would then squeeze
tables into 80 columns and cut transaction ids, so give it room instead.
"""

from __future__ import annotations

import sys

from rich.console import Console

PIPED_WIDTH = 160


def make_console(stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else PIPED_WIDTH)
