"""Every Debian package the Dockerfile installs exists in the Debian release of its base image.

The images are built in the suite too (tests/compose/test_images.py, with buildah
on a bookworm base); this check is quicker, names a missing package outright, and
reads a release the build does not use. The base once floated
(``python:3.11-slim``) to a new Debian release that had dropped the JRE the file
installs, and ``docker compose up --build`` stopped at ``apt-get``.
So the base must name its release, and each package is looked up in that
release's own index with apt itself, in a private state directory (the
machine's own package database and sources are left alone). The mirror is the
one this machine's apt already uses.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from outbox_devtools.images import DEBIAN_RELEASE, LOCAL_BASE
from tests.compose.dockerfile import DOCKERFILE, first_base, instructions, stages
from tests.compose.dockerfile import apt_packages as dockerfile_apt_packages

APT_SOURCES = (Path("/etc/apt/sources.list.d"), Path("/etc/apt/sources.list"))
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


def debian_release(dockerfile: str) -> str:
    """The Debian codename the base image's tag names (``python:3.11-slim-bookworm``)."""
    base = first_base(dockerfile)
    match = re.fullmatch(r"\S+:[\w.]+-slim-([a-z]+)", base, re.IGNORECASE)
    if not match:
        raise AssertionError(f"{base!r} does not name a Debian release; a bare tag moves")
    return match[1]


def apt_packages(dockerfile: str) -> list[str]:
    """Every package an ``apt-get install`` in a RUN instruction names."""
    return dockerfile_apt_packages(instructions(dockerfile))


def debian_mirror() -> str:
    """The URI this machine's apt fetches Debian's main archive from."""
    for source in APT_SOURCES:
        files = sorted(source.glob("*.sources")) + sorted(source.glob("*.list"))
        for file in files if source.is_dir() else [source] if source.exists() else []:
            for line in file.read_text().splitlines():
                words = line.split()
                if words[:1] == ["URIs:"] and not words[1].endswith("-security"):
                    return words[1]
                if words[:1] == ["deb"] and not words[-3].endswith("-security"):
                    return next(word for word in words[1:] if "://" in word)
    raise AssertionError("no Debian archive is configured for apt on this machine")


class ReleaseIndex:
    """apt's view of one Debian release, kept in a directory of its own."""

    def __init__(self, release: str, root: Path) -> None:
        self.release = release
        (root / "sources").mkdir(parents=True, exist_ok=True)
        (root / "lists" / "partial").mkdir(parents=True, exist_ok=True)
        (root / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
        (root / "status").touch()
        (root / "sources" / f"{release}.sources").write_text(
            f"Types: deb\nURIs: {debian_mirror()}\nSuites: {release}\n"
            f"Components: main\nSigned-By: {KEYRING}\n"
        )
        self.options = [
            *("-o", "Dir::Etc::SourceList=/dev/null"),
            *("-o", f"Dir::Etc::SourceParts={root / 'sources'}"),
            *("-o", f"Dir::State::Lists={root / 'lists'}"),
            *("-o", f"Dir::State::status={root / 'status'}"),
            *("-o", f"Dir::Cache={root / 'cache'}"),
        ]
        updated = subprocess.run(
            ["apt-get", "-q", *self.options, "update"],
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert updated.returncode == 0, f"apt-get update for {release}:\n{updated.stderr}"

    def missing(self, packages: list[str]) -> list[str]:
        """The packages that have no installable version in this release."""
        policy = subprocess.run(
            ["apt-cache", *self.options, "policy", *packages],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        candidates = dict(
            re.findall(r"^(\S+):\n\s+Installed: .*\n\s+Candidate: (.*)$", policy, re.M)
        )
        return [name for name in packages if candidates.get(name, "(none)") == "(none)"]


@pytest.fixture(scope="module")
def indexes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ReleaseIndex]:
    assert shutil.which("apt-get"), "apt-get is needed to read Debian's package index"
    root = tmp_path_factory.mktemp("debian-index")
    return {
        release: ReleaseIndex(release, root / release)
        for release in {debian_release(DOCKERFILE.read_text()), "trixie"}
    }


def test_every_apt_package_exists_in_the_base_images_release(
    indexes: dict[str, ReleaseIndex],
) -> None:
    dockerfile = DOCKERFILE.read_text()
    release = debian_release(dockerfile)
    packages = apt_packages(dockerfile)
    assert packages, "the Dockerfile installs no Debian package: the sink needs a JRE"
    assert not indexes[release].missing(packages), f"not in Debian {release}"


def test_the_check_finds_the_package_the_floating_base_lost(
    indexes: dict[str, ReleaseIndex],
) -> None:
    """The base the file once had (trixie, under ``3.11-slim``) has no JRE 17: the check says so."""
    floating = "FROM python:3.11-slim-trixie\nRUN apt-get install -y openjdk-17-jre-headless\n"
    assert indexes["trixie"].missing(apt_packages(floating)) == ["openjdk-17-jre-headless"]
    assert not indexes["trixie"].missing(["openjdk-21-jre-headless"])


@pytest.mark.parametrize("base", ["python:3.11-slim", "python:3.11", "python:latest"])
def test_a_base_without_a_release_is_refused(base: str) -> None:
    with pytest.raises(AssertionError, match="does not name a Debian release"):
        debian_release(f"FROM {base}\n")


def test_the_base_argument_and_the_local_base_name_one_release() -> None:
    """``make image`` without a registry builds on LOCAL_BASE: the same Debian release."""
    dockerfile = DOCKERFILE.read_text()
    assert debian_release(dockerfile) == DEBIAN_RELEASE
    assert debian_release(f"ARG BASE={LOCAL_BASE}\nFROM ${{BASE}} AS deps\n") == DEBIAN_RELEASE


def test_every_stage_starts_from_the_base_or_an_earlier_stage() -> None:
    """A stage FROM another image would escape the release check above."""
    found = stages()
    base = found[0].base
    for stage in found:
        assert stage.parent is not None or stage.base == base, (stage.name, stage.base)
