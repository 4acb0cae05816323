"""The documentation site builds strictly, and the README stays a front door.

``mkdocs build --strict`` fails on a broken link between pages, a page left out of
the navigation, a missing snippet or an API reference naming something that is gone,
so a change that breaks the docs fails the suite instead of the published site.
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README_MAX_LINES = 200


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    for page in ("index.html", "getting-started/index.html", "reference/api/index.html"):
        assert (tmp_path / page).is_file(), page
    api = (tmp_path / "reference/api/index.html").read_text()
    assert "send_message_in_transaction" in api, "the API page documents no producer"
    assert_the_api_page_reads_as_a_reference(api)


def assert_the_api_page_reads_as_a_reference(api: str) -> None:
    """Signatures with their parameters, dataclass fields, and no Sphinx role left as text."""
    text = html.unescape(re.sub(r"<[^>]+>", "", api))
    assert api.count("doc-signature") >= 20, "the API page shows no signatures"
    assert "settings: ProducerSettings | None = None" in text, "no constructor parameters"
    assert "half_offset: int | None" in text, "TransactionSendResult's fields are missing"
    roles = sorted(set(re.findall(r":(?:meth|class|func|attr|mod|exc|data|obj):", text)))
    assert not roles, f"Sphinx roles shown as text on the API page: {roles}"


def test_the_readme_is_short_and_sends_readers_to_the_docs() -> None:
    readme = (REPO / "README.md").read_text().splitlines()
    assert len(readme) <= README_MAX_LINES, f"README.md has {len(readme)} lines"
    linked = {
        line.split("](docs/", 1)[1].split(")", 1)[0].split("#")[0]
        for line in readme
        if "](docs/" in line
    }
    missing = sorted(page for page in linked if not (REPO / "docs" / page).is_file())
    assert not missing, f"README.md links to missing pages: {missing}"
