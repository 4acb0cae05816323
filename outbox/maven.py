"""Resolve a generated pom's runtime classpath into a cache directory, once.

The Spark sink's Kafka source (:mod:`spark_sink.jars`) and the development
tooling's local Kafka broker (``outbox_devtools.kafka``) both need official
jars from Maven Central on machines that have Maven but no Docker. The sink
needs them in production too, so the rules live in the core, the floor both
stand on (neither reaches into the other; no service imports this): the pom is
written by Python (so it works from an installed wheel), Maven copies the
runtime dependencies into a staging directory that is renamed into place only
when complete, a marker file lists the jars so a half-deleted cache is noticed
and resolved again, and a file lock serialises two processes (a CLI and a test
run) resolving at the same time.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

MARKER = "resolved.txt"
DEPENDENCY_PLUGIN_VERSION = "3.8.1"
MAVEN_TIMEOUT_SECONDS = 900


def cache_dir() -> Path:
    """Where downloaded runtimes live: ``$OUTBOX_CACHE_DIR``, else the XDG cache."""
    explicit = os.environ.get("OUTBOX_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kafka-outbox"


def pom_xml(
    artifact_id: str,
    version: str,
    dependencies: list[tuple[str, str, str]],
    exclusions: dict[str, list[tuple[str, str]]] | None = None,
) -> str:
    """A ``pom``-packaged project whose runtime dependencies are ``group:artifact:version``.

    ``exclusions`` maps an artifact id of ``dependencies`` to ``(group, artifact)``
    pairs Maven must leave out of that dependency's tree.
    """
    blocks = []
    for group, artifact, dep_version in dependencies:
        excluded = ""
        if exclusions and exclusions.get(artifact):
            items = "".join(
                f"\n        <exclusion><groupId>{g}</groupId><artifactId>{a}</artifactId>"
                "</exclusion>"
                for g, a in exclusions[artifact]
            )
            excluded = f"\n      <exclusions>{items}\n      </exclusions>"
        blocks.append(
            f"""    <dependency>
      <groupId>{group}</groupId>
      <artifactId>{artifact}</artifactId>
      <version>{dep_version}</version>
      <scope>runtime</scope>{excluded}
    </dependency>"""
        )
    deps = "\n".join(blocks)
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>kafka-outbox.dev</groupId>
  <artifactId>{artifact_id}</artifactId>
  <version>{version}</version>
  <packaging>pom</packaging>
  <dependencies>
{deps}
  </dependencies>
  <build>
    <pluginManagement>
      <plugins>
        <plugin>
          <groupId>org.apache.maven.plugins</groupId>
          <artifactId>maven-dependency-plugin</artifactId>
          <version>{DEPENDENCY_PLUGIN_VERSION}</version>
        </plugin>
      </plugins>
    </pluginManagement>
  </build>
</project>
"""


def resolved_libs(home: Path) -> Path | None:
    """The libs dir if a previous resolution completed and no jar has gone missing."""
    marker = home / MARKER
    libs = home / "libs"
    if not marker.is_file():
        return None
    names = [line for line in marker.read_text().splitlines() if line]
    if not names or not all((libs / name).is_file() for name in names):
        return None
    return libs


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Serialise resolution between processes (a CLI and a test run at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure_resolved(
    home: Path,
    pom: str,
    *,
    what: str,
    coordinates: str,
    required_glob: str,
    error: type[Exception] = RuntimeError,
) -> Path:
    """Directory with ``pom``'s runtime classpath under ``home``; Maven runs only once.

    ``what`` names the jars in messages ("Kafka 4.1.1"), ``coordinates`` the
    main artifact in a failure, and ``required_glob`` a jar that must be among
    the results for the resolution to count. Failures raise ``error``.
    """
    libs = resolved_libs(home)
    if libs is not None:
        return libs
    with locked(home / ".lock"):
        libs = resolved_libs(home)  # another process may have finished meanwhile
        if libs is not None:
            return libs
        return _resolve_with_maven(home, pom, what, coordinates, required_glob, error)


def _resolve_with_maven(
    home: Path,
    pom: str,
    what: str,
    coordinates: str,
    required_glob: str,
    error: type[Exception],
) -> Path:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise error(
            f"Maven ('mvn') is not on PATH; it is needed once to fetch the {what} jars into {home}"
        )
    home.mkdir(parents=True, exist_ok=True)
    (home / "pom.xml").write_text(pom)
    staging = home / "libs.partial"
    shutil.rmtree(staging, ignore_errors=True)
    argv = [
        mvn,
        "-q",
        "-B",
        "-f",
        str(home / "pom.xml"),
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={staging}",
    ]
    print(f"resolving {what} jars with Maven… ", end="", file=sys.stderr, flush=True)
    began = time.monotonic()
    try:
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=MAVEN_TIMEOUT_SECONDS, check=False
        )
    except subprocess.TimeoutExpired as exc:
        print("timed out", file=sys.stderr)
        raise error(f"Maven did not finish within {exc.timeout}s") from exc
    jars = sorted(p.name for p in staging.glob("*.jar")) if staging.is_dir() else []
    if result.returncode != 0 or not any(staging.glob(required_glob)):
        print("failed", file=sys.stderr)
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-40:])
        raise error(
            f"Maven could not resolve {coordinates} "
            f"(exit {result.returncode}, pom {home / 'pom.xml'}):\n{tail}"
        )
    libs = home / "libs"
    shutil.rmtree(libs, ignore_errors=True)
    staging.rename(libs)
    (home / MARKER).write_text("\n".join(jars) + "\n")
    print(f"done in {time.monotonic() - began:.1f}s", file=sys.stderr, flush=True)
    return libs
