"""The documentation site builds strictly, and the README stays a front door.

``mkdocs build --strict`` fails on a broken link between pages, a page left out of
the navigation, a missing snippet or an API reference naming something that is gone,
so a change that breaks the docs fails the suite instead of the published site.
"""

from __future__ import annotations

import os
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
