"""Every ```python block of README.md and docs/ is a complete program, and runs as one.

A reader copies a block and runs it, so a block must run as written: every name
imported or defined, and an end of its own. Each block (its snippet includes
resolved by pymdownx.snippets with mkdocs.yml's own settings, as the site shows
it) runs as ``python block.py`` in an empty directory, against the session's
broker (``OUTBOX_BOOTSTRAP_SERVERS``, a topic prefix of this module's) and, when
it reads ``OUTBOX_DATABASE_URL``, a new PostgreSQL database whose log table is
migrated (``outbox db upgrade``'s part). A checker runs for the module, so a
block that waits for its event on the real topic gets it. A name left undefined
is a NameError, so the block fails here, named by its page and its index there.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import markdown
import pytest
import yaml

from outbox.sql import DATABASE_URL_ENV, create_engine, upgrade
from outbox_devtools.processes import free_port
from tests.fixtures.postgres import fresh_database

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
PYTHON = {"python", "py", "python3"}
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*\{?\.?(?P<lang>[\w+-]*)")
BLOCK_TIMEOUT = 120  # seconds; a block on Spark takes about 10
CHECKER_READY_TIMEOUT = 90
BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Block:
    """One Python block as the site shows it: its page, its index there (from 1), its code."""

    page: str
    index: int
    code: str

    @property
    def name(self) -> str:
        return f"{self.page}#{self.index}"


def snippet_settings() -> dict[str, Any]:
    """pymdownx.snippets' settings from mkdocs.yml, base paths made absolute: the test
    resolves includes as the site build does, so it runs what readers see."""
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    for extension in config["markdown_extensions"]:
        if isinstance(extension, dict) and "pymdownx.snippets" in extension:
            settings = dict(extension["pymdownx.snippets"] or {})
            break
    else:
        raise AssertionError("mkdocs.yml does not enable pymdownx.snippets")
    base = settings.get("base_path", ["."])
    settings["base_path"] = [
        str(REPO / path) for path in ([base] if isinstance(base, str) else base)
    ]
    return settings


def resolved(text: str, settings: dict[str, Any]) -> str:
    """``text`` with its ``--8<--`` includes replaced by what they name (a missing file
    raises, with ``check_paths``); a Markdown instance per page, as the preprocessor
    remembers the files it has included."""
    converter = markdown.Markdown(
        extensions=["pymdownx.snippets"], extension_configs={"pymdownx.snippets": settings}
    )
    return "\n".join(converter.preprocessors["snippet"].run(text.split("\n")))


def python_blocks(text: str) -> list[str]:
    """The code of each fenced Python block of ``text`` (indented fences too, dedented)."""
    blocks: list[str] = []
    opened: re.Match[str] | None = None
    lines: list[str] = []
    for line in text.split("\n"):
        if opened is None:
            opened = FENCE.match(line)
            lines = []
            continue
        fence = opened["fence"]
        if line.strip().startswith(fence[0] * len(fence)) and not line.strip().strip(fence[0]):
            if opened["lang"].lower() in PYTHON:
                blocks.append("\n".join(lines).rstrip() + "\n")
            opened = None
            continue
        indent = opened["indent"]
        lines.append(line.removeprefix(indent) if line.startswith(indent) else line.lstrip())
    return blocks


def collect_blocks() -> list[Block]:
    """Every Python block of the README and the docs; a block included on two pages (the
    README's five-minute section in getting-started.md) is run once, under its first page."""
    settings = snippet_settings()
    seen: set[str] = set()
    blocks: list[Block] = []
    for page in PAGES:
        text = resolved(page.read_text(encoding="utf-8"), settings)
        for index, code in enumerate(python_blocks(text), start=1):
            if code not in seen:
                seen.add(code)
                blocks.append(Block(str(page.relative_to(REPO)), index, code))
    return blocks


BLOCKS = collect_blocks()


def run_program(code: str, cwd: Path, env: dict[str, str]) -> tuple[int, str, str]:
    """``python block.py`` in ``cwd``: exit code, stdout, stderr. Its process group is
    killed on a timeout, so a Spark JVM it started does not outlive it."""
    (cwd / "block.py").write_text(code, encoding="utf-8")
    process = subprocess.Popen(
        [sys.executable, "block.py"],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=BLOCK_TIMEOUT)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        return -1, stdout, f"{stderr}\n(killed: still running after {BLOCK_TIMEOUT}s)"
    return process.returncode, stdout, stderr


@pytest.fixture(scope="module")
def block_env(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """What a reader's shell would hold: the broker, and a topic prefix no other test uses,
    whose outbox topics and the ``orders`` topic exist (``outbox topics create``)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("OUTBOX_")}
    env |= {
        "OUTBOX_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "OUTBOX_TOPIC_PREFIX": f"docs{uuid.uuid4().hex[:8]}",
    }
    created = subprocess.run(
        [BIN / "outbox", "topics", "create", "--partitions", "1", "--topic", "orders"],
        cwd=tmp_path_factory.mktemp("topics"),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert created.returncode == 0, created.stdout + created.stderr
    return env


@pytest.fixture(scope="module")
def checker(block_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One ``outbox checker`` for the module, ready (``/readyz``) before the first block:
    its relay publishes what the blocks commit, for a block that reads it back."""
    address = f"127.0.0.1:{free_port()}"  # not 9464: another checker may hold it
    log = tmp_path_factory.mktemp("checker") / "checker.log"
    with log.open("w") as output:
        process = subprocess.Popen(
            [BIN / "outbox", "checker", "--http-address", address],
            env=block_env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + CHECKER_READY_TIMEOUT
        while not _ready(f"http://{address}/readyz"):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the checker did not get ready:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@pytest.mark.kafka
@pytest.mark.postgres
@pytest.mark.parametrize("block", BLOCKS, ids=[block.name for block in BLOCKS])
def test_the_block_runs_as_a_program(
    block: Block,
    block_env: dict[str, str],
    checker: None,
    postgres_url: str,
    tmp_path: Path,
) -> None:
    env = dict(block_env)
    with contextlib.ExitStack() as cleanup:
        if DATABASE_URL_ENV in block.code:
            url = cleanup.enter_context(fresh_database(postgres_url))
            engine = create_engine(url)
            try:
                upgrade(engine)  # what `outbox db upgrade` does before the first send
            finally:
                engine.dispose()
            env[DATABASE_URL_ENV] = url
        code, stdout, stderr = run_program(block.code, tmp_path, env)
    assert code == 0, (
        f"{block.name} failed (exit {code})\n--- stdout ---\n{stdout[-3000:]}"
        f"\n--- stderr ---\n{stderr[-5000:]}"
    )


def test_every_page_is_searched_and_includes_are_resolved() -> None:
    pages = {block.page for block in BLOCKS}
    assert "README.md" in pages
    assert {"docs/guides/caller-transaction.md", "docs/guides/typed-events.md"} <= pages
    assert len(BLOCKS) >= 12, [block.name for block in BLOCKS]
    unresolved = [block.name for block in BLOCKS if "--8<--" in block.code]
    assert not unresolved, f"snippet includes left in: {unresolved}"


def test_blocks_are_found_indented_included_and_in_longer_fences(tmp_path: Path) -> None:
    (tmp_path / "program.py").write_text("print('included')\n")
    page = "\n".join(
        [
            "```bash",
            "echo not python",
            "```",
            "- a list item:",
            "",
            "    ```py",
            "    if True:",
            "        print('indented')",
            "    ```",
            "````python",
            "print('''```''')",
            "````",
            "```python",
            '--8<-- "program.py"',
            "```",
        ]
    )
    settings = {"base_path": [str(tmp_path)], "check_paths": True}
    assert python_blocks(resolved(page, settings)) == [
        "if True:\n    print('indented')\n",
        "print('''```''')\n",
        "print('included')\n",
    ]


def test_a_block_with_an_undefined_name_fails(tmp_path: Path) -> None:
    code, _, stderr = run_program("print(Message)\n", tmp_path, dict(os.environ))
    assert code != 0
    assert "NameError: name 'Message' is not defined" in stderr
