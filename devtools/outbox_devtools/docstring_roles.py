"""A griffe extension for the API reference: Sphinx roles in docstrings shown as code.

The library's docstrings name other objects the way Sphinx does
(``:meth:`send_message_in_transaction```, ``:class:`~outbox.Message```), which reads well
in the source and in ``help()``. mkdocstrings renders docstrings as Markdown, where such a
role is literal text. This extension rewrites each role into a code span as the docs site
loads the docstrings (``mkdocs.yml``: the python handler's ``extensions``), so the source
keeps one convention and the site shows ``send_message_in_transaction``. Roles become
code, not links: a link to an object the reference does not render would fail the strict
build.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(
    r":(?:py:)?(?:meth|class|func|attr|mod|exc|data|obj|const|envvar|ref):`(?P<body>[^`]+)`"
)
"""A Sphinx cross-reference role: ``:role:`target```, ``:role:`~a.b.c```,
``:role:`title <target>``` or ``:role:`!target``` (Sphinx's forms)."""


def _shown(match: re.Match[str]) -> str:
    """What Sphinx would show for the role's body, as a Markdown code span."""
    body = match.group("body").lstrip("!")
    titled = re.fullmatch(r"(?P<title>.+?)\s*<(?P<target>[^>]+)>", body)
    if titled:
        shown = titled.group("title")
    elif body.startswith("~"):
        shown = body[1:].rsplit(".", 1)[-1]
    else:
        shown = body
    return f"`{shown}`"


def roles_as_code(text: str) -> str:
    """``text`` with every Sphinx role replaced by a code span of what Sphinx shows."""
    return ROLE.sub(_shown, text)


class SphinxRolesAsCode(griffe.Extension):
    """Rewrites the Sphinx roles of every docstring griffe loads (see the module's docstring)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Each object as griffe creates it: its docstring, if it has one."""
        if obj.docstring is not None:
            obj.docstring.value = roles_as_code(obj.docstring.value)
