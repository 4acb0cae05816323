"""The Dockerfile read as data: its stages, and for each image target what an engine runs.

The tests of docker-compose.yml and of the Debian packages read the same file; a
stage inherits its parent stage's entry point, default command, user, health check
and environment, as an engine does, so a target is judged by what it really gets.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"


def instructions(text: str) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = "\n".join(lines).replace("\\\n", " ")
    return [" ".join(part.split()) for part in joined.splitlines() if part.strip()]


def global_args(text: str) -> dict[str, str]:
    """The ``ARG NAME=default`` lines before the first ``FROM``: what ``FROM ${NAME}`` means."""
    found: dict[str, str] = {}
    for line in instructions(text):
        if line.startswith("FROM "):
            break
        match = re.fullmatch(r"ARG (\w+)=(\S+)", line)
        if match:
            found[match[1]] = match[2]
    return found


def exec_form(value: str) -> list[str] | None:
    """``["a", "b"]`` as a list; None for the shell form, which none of ours uses."""
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        return None
    return [str(part) for part in parsed] if isinstance(parsed, list) else None


@dataclass
class Stage:
    """One ``FROM ... AS name`` and what it sets, its parent's settings included."""

    name: str
    base: str
    parent: Stage | None
    lines: list[str] = field(default_factory=list)
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    user: str | None = None
    workdir: str | None = None
    healthcheck: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)

    def chain(self) -> list[Stage]:
        """This stage and its ancestors among the file's stages, this one first."""
        return [self, *(self.parent.chain() if self.parent else [])]

    def all_lines(self) -> list[str]:
        """Every instruction that built this stage, the first stage's first."""
        return [line for stage in reversed(self.chain()) for line in stage.lines]

    def copied_from(self, path: str) -> Stage | None:
        """The stage whose ``path`` a ``COPY --from=STAGE path path`` brought in."""
        for line in self.all_lines():
            match = re.fullmatch(rf"COPY --from=(\S+) {re.escape(path)} {re.escape(path)}", line)
            if match:
                return stages_by_name().get(match[1])
        return None


def stages(text: str | None = None) -> list[Stage]:
    """Every stage of the Dockerfile, in order."""
    text = DOCKERFILE.read_text() if text is None else text
    args = global_args(text)
    found: dict[str, Stage] = {}
    ordered: list[Stage] = []
    current: Stage | None = None
    for line in instructions(text):
        keyword, _, rest = line.partition(" ")
        if keyword == "FROM":
            match = re.fullmatch(r"(\S+)(?: AS (\S+))?", rest, re.IGNORECASE)
            assert match, f"unparsed {line!r}"
            base = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m[1] or m[2]], match[1])
            parent = found.get(base)
            current = Stage(match[2] or f"stage-{len(ordered)}", base, parent)
            if parent is not None:
                current.entrypoint, current.cmd = parent.entrypoint, parent.cmd
                current.user, current.workdir = parent.user, parent.workdir
                current.healthcheck, current.env = parent.healthcheck, dict(parent.env)
            found[current.name] = current
            ordered.append(current)
            continue
        if current is None:
            continue
        current.lines.append(line)
        if keyword == "ENTRYPOINT":
            current.entrypoint = exec_form(rest)
            current.cmd = None  # an engine drops an inherited CMD with a new ENTRYPOINT
        elif keyword == "CMD":
            current.cmd = exec_form(rest)
        elif keyword == "USER":
            current.user = rest
        elif keyword == "WORKDIR":
            current.workdir = rest
        elif keyword == "HEALTHCHECK":
            test = rest.split(" CMD ", 1)
            current.healthcheck = ["CMD", *(exec_form(test[1]) or [])] if len(test) == 2 else None
        elif keyword == "ENV":
            current.env.update(re.findall(r"(\w+)=(\S+)", rest))
    return ordered


def stages_by_name() -> dict[str, Stage]:
    """The Dockerfile's stages by name."""
    return {stage.name: stage for stage in stages()}


def first_base(text: str) -> str:
    """The image the file's first stage starts from, its ``ARG`` default resolved."""
    return stages(text)[0].base


def apt_packages(lines: list[str]) -> list[str]:
    """Every package an ``apt-get install`` in these RUN instructions names."""
    names: list[str] = []
    for line in lines:
        if not line.startswith("RUN "):
            continue
        for command in re.split(r"&&|;", line.removeprefix("RUN ")):
            words = command.split()
            if words[:2] == ["apt-get", "install"]:
                names += [word for word in words[2:] if not word.startswith("-")]
    return names


def installed_extras(stage: Stage) -> set[str]:
    """The library's extras in the venv an image target copies in (``/opt/outbox``): every
    ``requirements.py pyproject.toml EXTRA...`` in the chain of the stage it came from."""
    venv = stage.copied_from("/opt/outbox")
    if venv is None:
        return set()
    extras: set[str] = set()
    for line in venv.all_lines():
        for match in re.finditer(r"requirements\.py pyproject\.toml((?: [\w-]+)*)", line):
            extras.update(match[1].split())
    return extras
