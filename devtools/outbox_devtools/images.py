"""``make image``: the checker and sink images, with Docker where an engine answers, else buildah.

The Dockerfile has two targets, ``checker`` (the sidecar: no JRE, no pyspark) and
``sink``. Where a Docker engine answers they are built with ``docker build`` from the
official ``python:3.11-slim-bookworm``. Where none does (this project's machines and
CI), buildah builds them daemonless (``--isolation chroot``), and since no image
registry may answer either, the base is made here: Debian bookworm's own python3.11
from Debian's own packages with ``debootstrap``, committed once as :data:`LOCAL_BASE`
and passed as the Dockerfile's ``BASE``. buildah keeps the base and every layer in
its storage (``/var/lib/containers/storage`` for root), so a second build reuses them.

Run as ``python -m outbox_devtools.images build [--target checker|sink]``; the tests
build through :func:`build_image` and run containers through :class:`BuildahContainer`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
TARGETS = ("checker", "sink")
IMAGE_NAMES = {"checker": "kafka-outbox-checker", "sink": "kafka-outbox-sink"}
DEBIAN_RELEASE = "bookworm"
LOCAL_BASE = f"localhost/kafka-outbox-python:3.11-slim-{DEBIAN_RELEASE}"
"""The base buildah builds on where no registry answers: the same release as the
Dockerfile's default ``python:3.11-slim-bookworm``, from Debian's own python3.11."""
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
"""On top of debootstrap's minbase: the interpreter, ``python3 -m venv`` (ensurepip),
and the CA certificates TLS clients need, which python:3.11-slim ships too."""
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
APT_TOOLS = {"buildah": "buildah", "debootstrap": "debootstrap"}
"""The programs a daemonless build needs, by the Debian package that brings each."""
BUILDAH_TMPDIR = "/var/tmp"
"""buildah's scratch space: its default, set explicitly because a test session's TMPDIR
(outbox_devtools.leftovers) is checked for leftovers and buildah's are not ours to judge."""


class ImageBuildError(RuntimeError):
    """A build step failed; the message says which and ends with its output's tail."""


def project_version() -> str:
    """The version pyproject.toml gives the library: the images' version label and tag."""
    with (REPO / "pyproject.toml").open("rb") as file:
        return str(tomllib.load(file)["project"]["version"])


def image_tag(target: str) -> str:
    """``kafka-outbox-<target>:<version>``, the name docker-compose.yml uses."""
    return f"{IMAGE_NAMES[target]}:{project_version()}"


def docker_engine_answers() -> bool:
    """Whether a Docker engine (not only the client) answers ``docker info``."""
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def ensure_build_tools() -> None:
    """Install buildah and debootstrap from Debian when they are missing and apt can.

    The project's own scripts install what it needs (a new machine has nothing a
    session installed by hand); ``.ci/run`` installs the same two packages."""
    missing = [package for program, package in APT_TOOLS.items() if shutil.which(program) is None]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise ImageBuildError(
            f"no Docker engine answers and {', '.join(missing)} is missing: install it"
            " (Debian: apt-get install buildah debootstrap)"
        )
    log.info("installing %s from Debian", " ".join(missing))
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    _run(["apt-get", "update", "-q"], "apt-get update", env=environment)
    _run(
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
        "apt-get install",
        env=environment,
    )


def _run(
    argv: Sequence[str],
    what: str,
    *,
    env: dict[str, str] | None = None,
    timeout: float = 3600,
    echo: bool = False,
) -> str:
    """Run a build step; its output (stdout and stderr together) is returned, or raised."""
    log.debug("running %s", " ".join(argv))
    process = subprocess.Popen(
        list(argv),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines: list[str] = []
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    for line in process.stdout:
        lines.append(line)
        if echo:
            sys.stderr.write(line)
        if time.monotonic() > deadline:
            process.kill()
            break
    returncode = process.wait()
    output = "".join(lines)
    if returncode != 0:
        tail = "".join(lines[-40:])
        raise ImageBuildError(f"{what} failed (exit {returncode}):\n{tail}")
    return output


def buildah_env() -> dict[str, str]:
    """The environment buildah runs in (see :data:`BUILDAH_TMPDIR`)."""
    return {**os.environ, "TMPDIR": BUILDAH_TMPDIR}


def buildah_image_exists(name: str) -> bool:
    """Whether buildah's storage holds an image by this name."""
    return (
        subprocess.run(
            ["buildah", "inspect", "--type", "image", name],
            capture_output=True,
            env=buildah_env(),
        ).returncode
        == 0
    )


def debian_mirror() -> str:
    """The archive this machine's apt uses (deb.debian.org where none is configured)."""
    sources = Path("/etc/apt/sources.list.d")
    files = [*sorted(sources.glob("*.sources")), *sorted(sources.glob("*.list"))]
    files.append(Path("/etc/apt/sources.list"))
    for file in files:
        if not file.is_file():
            continue
        for line in file.read_text().splitlines():
            words = line.split()
            if words[:1] == ["URIs:"] and words[1].rstrip("/").endswith("/debian"):
                return words[1]
            if words[:1] == ["deb"]:
                uri = next((word for word in words[1:] if "://" in word), "")
                if uri.rstrip("/").endswith("/debian"):
                    return uri
    return "http://deb.debian.org/debian"


def build_local_base(name: str = LOCAL_BASE, *, echo: bool = False) -> bool:
    """Make the base image from Debian's packages unless buildah has it; True if made now.

    debootstrap writes a minbase bookworm straight into a scratch container's root;
    the apt lists and the downloaded .debs are dropped before it is committed."""
    if buildah_image_exists(name):
        return False
    started = time.monotonic()
    log.info("making the base image %s from Debian %s with debootstrap", name, DEBIAN_RELEASE)
    if shutil.which("debootstrap") is None:
        raise ImageBuildError("debootstrap is needed to make the base image (apt-get install it)")
    environment = buildah_env()
    container = _run(["buildah", "from", "scratch"], "buildah from scratch", env=environment)
    container = container.strip().splitlines()[-1]
    try:
        root = _run(["buildah", "mount", container], "buildah mount", env=environment).strip()
        mirror = debian_mirror()
        _run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                DEBIAN_RELEASE,
                root,
                mirror,
            ],
            "debootstrap",
            env=environment,
            echo=echo,
        )
        security = mirror.rstrip("/") + "-security"
        Path(root, "etc/apt/sources.list").write_text(
            f"deb {mirror} {DEBIAN_RELEASE} main\n"
            f"deb {mirror} {DEBIAN_RELEASE}-updates main\n"
            f"deb {security} {DEBIAN_RELEASE}-security main\n"
        )
        for leftover in ("var/lib/apt/lists", "var/cache/apt/archives"):
            for entry in Path(root, leftover).glob("*"):
                if entry.is_file():
                    entry.unlink()
        for cache in Path(root, "var/cache/apt").glob("*.bin"):
            cache.unlink()
        _run(
            [
                "buildah",
                "config",
                "--env",
                "LANG=C.UTF-8",
                "--cmd",
                "python3",
                "--label",
                f"org.opencontainers.image.description=Debian {DEBIAN_RELEASE} minbase"
                " with its python3.11 (debootstrap)",
                container,
            ],
            "buildah config",
            env=environment,
        )
        _run(["buildah", "commit", "--rm", container, name], "buildah commit", env=environment)
        container = ""
        log.info("base image %s made in %.0fs", name, time.monotonic() - started)
    finally:
        if container:
            subprocess.run(["buildah", "rm", container], capture_output=True, env=environment)
    return True


def _git(*args: str) -> str:
    """A git answer about the clone, or '' where there is none (an exported tree)."""
    try:
        result = subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=30
        )
    except OSError:
        return ""
    return result.stdout.strip() if result.returncode == 0 else ""


def labels() -> dict[str, str]:
    """The build arguments behind the images' version, source and revision labels."""
    revision = _git("rev-parse", "HEAD") or "unknown"
    if revision != "unknown" and _git("status", "--porcelain", "--untracked-files=no"):
        revision += "-dirty"
    return {
        "VERSION": project_version(),
        "SOURCE": _git("remote", "get-url", "origin") or "kafka-outbox (a local clone)",
        "REVISION": revision,
    }


@dataclass(frozen=True)
class BuiltImage:
    """One image as built: its tag, id, size, how long the build took and how much came
    from the layer cache."""

    target: str
    tag: str
    image_id: str
    size_bytes: int
    seconds: float
    cached_steps: int
    steps: int

    def summary(self) -> str:
        """One line for the console: ``checker kafka-outbox-checker:0.1.0 236 MB ...``."""
        return (
            f"{self.target}: {self.tag} {self.size_bytes / 1e6:.0f} MB, id {self.image_id[:12]},"
            f" built in {self.seconds:.0f}s ({self.cached_steps}/{self.steps} steps from cache)"
        )


def _inspect(tag: str) -> dict[str, Any]:
    """``buildah inspect`` of the image ``tag``, decoded."""
    output = subprocess.run(
        ["buildah", "inspect", "--type", "image", tag],
        capture_output=True,
        text=True,
        check=True,
        env=buildah_env(),
    ).stdout
    return json.loads(output)


def image_size(tag: str) -> int:
    """The image's size unpacked, in bytes: its layers' tar sizes, as buildah stores them
    (``buildah images`` shows the same figure, rounded, in MB)."""
    manifest = json.loads(_inspect(tag)["Manifest"])
    return sum(int(layer["size"]) for layer in manifest["layers"])


def image_config(tag: str) -> dict[str, object]:
    """The image's Docker-format config: Entrypoint, Cmd, User, Env, Labels, Healthcheck."""
    return dict(_inspect(tag)["Docker"]["config"])


def _step_counts(output: str) -> tuple[int, int]:
    """(steps taken from the cache, steps) in a build's output: buildah says
    ``--> Using cache`` and Docker ``CACHED`` for a step it did not run again."""
    steps = len(re.findall(r"^(?:\[\d+/\d+\] )?STEP \d+/\d+: (?!FROM )", output, re.M))
    cached = len(re.findall(r"^--> Using cache ", output, re.M))
    if not steps:  # BuildKit's plain progress
        steps = len(re.findall(r"^#\d+ \[[^\]]+\] (?:RUN|COPY)", output, re.M))
        cached = len(re.findall(r"^#\d+ CACHED$", output, re.M))
    return cached, steps


def build_image(target: str, *, echo: bool = False, docker: bool | None = None) -> BuiltImage:
    """Build one target of the Dockerfile as :func:`image_tag` names it."""
    if target not in TARGETS:
        raise ValueError(f"no such image target {target!r}; one of {TARGETS}")
    tag = image_tag(target)
    arguments = [f"--build-arg={key}={value}" for key, value in labels().items()]
    started = time.monotonic()
    if docker is None:
        docker = docker_engine_answers()
    if docker:
        argv = ["docker", "build", "--progress=plain", "--target", target, "--tag", tag]
        if CA_BUNDLE.is_file():
            argv.append(f"--secret=id=ca-bundle,src={CA_BUNDLE}")
        output = _run(
            [*argv, *arguments, str(REPO)],
            f"docker build {target}",
            env={**os.environ, "DOCKER_BUILDKIT": "1"},
            echo=echo,
        )
        inspected = subprocess.run(
            ["docker", "image", "inspect", "--format", "{{.Id}} {{.Size}}", tag],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        image_id, size = inspected[0], int(inspected[1])
    else:
        ensure_build_tools()
        build_local_base(echo=echo)
        argv = [
            "buildah",
            "build",
            "--isolation=chroot",
            "--layers",
            "--format=docker",  # OCI images have no HEALTHCHECK
            f"--target={target}",
            f"--tag={tag}",
            f"--build-arg=BASE={LOCAL_BASE}",
            f"--file={DOCKERFILE}",
        ]
        if CA_BUNDLE.is_file():
            argv.append(f"--secret=id=ca-bundle,src={CA_BUNDLE}")
        previous = _buildah_image_id(tag)
        output = _run(
            [*argv, *arguments, str(REPO)], f"buildah build {target}", env=buildah_env(), echo=echo
        )
        image_id = _buildah_image_id(tag)
        if previous and previous != image_id:
            # The image the tag named before, now nameless: each rebuild would leave one
            # behind (hundreds of MB for the sink). Refused while a container uses it.
            subprocess.run(["buildah", "rmi", previous], capture_output=True, env=buildah_env())
        size = image_size(tag)
    cached, steps = _step_counts(output)
    return BuiltImage(target, tag, image_id, size, time.monotonic() - started, cached, steps)


def _buildah_image_id(tag: str) -> str:
    """The id of the image ``tag`` names in buildah's storage, '' if none."""
    found = subprocess.run(
        ["buildah", "inspect", "--type", "image", "--format", "{{.FromImageID}}", tag],
        capture_output=True,
        text=True,
        env=buildah_env(),
    )
    return found.stdout.strip() if found.returncode == 0 else ""


class BuildahContainer:
    """A container of an image run daemonlessly: ``buildah run --isolation chroot``.

    buildah's chroot isolation shares the host's network (like ``--network host``) and
    process namespace, and applies the image's user, environment and working directory.
    It runs a command, not the image's entry point, so :meth:`start` runs the image's
    ``Entrypoint`` + ``Cmd`` exactly as an engine would; with ``as_pid_1`` in a PID
    namespace of its own, where the entry point is PID 1 (the kernel then delivers only
    the signals it has a handler for) under the image's user, as under an engine. Its
    ``buildah run`` kills the command on SIGTERM rather than passing it on, so
    :meth:`terminate` signals the entry point's own process as an engine's stop would."""

    def __init__(self, image: str) -> None:
        self.image = image
        self.name = subprocess.run(
            ["buildah", "from", "--pull=never", image],
            capture_output=True,
            text=True,
            check=True,
            env=buildah_env(),
        ).stdout.strip()
        self.process: subprocess.Popen[str] | None = None

    def command(self, *overrides: str) -> list[str]:
        """The image's entry point and ``overrides`` (else its default ``Cmd``)."""
        config = image_config(self.image)
        entrypoint = list(config.get("Entrypoint") or [])  # type: ignore[call-overload]
        cmd = list(overrides) or list(config.get("Cmd") or [])  # type: ignore[call-overload]
        return [*entrypoint, *cmd]

    def run(
        self, argv: Sequence[str], env: dict[str, str], timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in the container to its end (output captured)."""
        return subprocess.run(
            self._argv(argv, env),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=buildah_env(),
        )

    def start(
        self, env: dict[str, str], *overrides: str, as_pid_1: bool = False
    ) -> subprocess.Popen[str]:
        """Start the image's entry point in the background; stderr and stdout in a pipe.

        ``as_pid_1``: util-linux's ``unshare --pid --fork`` (the image's, as root with
        CAP_SYS_ADMIN) makes a PID namespace and ``setpriv`` drops to the image's user
        before the entry point is exec'd as that namespace's PID 1."""
        argv = self.command(*overrides)
        extra: list[str] = []
        if as_pid_1:
            user, _, group = str(image_config(self.image).get("User") or "root").partition(":")
            argv = [
                *("unshare", "--pid", "--fork", "--kill-child"),
                *("setpriv", f"--reuid={user}", f"--regid={group or user}", "--init-groups"),
                *argv,
            ]
            extra = ["--user=0:0", "--cap-add=CAP_SYS_ADMIN"]
        self.process = subprocess.Popen(
            self._argv(argv, env, extra),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=buildah_env(),
        )
        return self.process

    def _argv(
        self, argv: Sequence[str], env: dict[str, str], extra: Sequence[str] = ()
    ) -> list[str]:
        settings = [f"--env={key}={value}" for key, value in env.items()]
        return [
            "buildah",
            "run",
            "--isolation=chroot",
            "--network=host",
            *extra,
            *settings,
            self.name,
            "--",
            *argv,
        ]

    def entry_point_pid(self, timeout: float = 60) -> int:
        """The host pid of the entry point's process: the first of buildah's descendants
        running the image's entry point program (``unshare`` and ``setpriv`` exec it)."""
        assert self.process is not None
        program = self.command()[0]
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for pid in _descendants(self.process.pid):
                with contextlib.suppress(OSError):
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                    if Path(argv[0].decode()).name == program:
                        return pid
            time.sleep(0.2)
        raise ImageBuildError(f"no process of {program!r} under buildah run after {timeout}s")

    def terminate(self, timeout: float = 120) -> int:
        """SIGTERM to the entry point, as ``docker stop`` sends it; buildah's exit code."""
        assert self.process is not None
        os.kill(self.entry_point_pid(), signal.SIGTERM)
        return self.process.wait(timeout)

    def remove(self) -> None:
        """Stop what still runs and remove the container (its writable layer).

        SIGTERM to ``buildah run`` first: it kills its command and removes its scratch
        directory under :data:`BUILDAH_TMPDIR`, which a SIGKILL would leave behind."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(OSError):
                self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                for pid in reversed(_descendants(self.process.pid)):
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                self.process.kill()
                self.process.wait(30)
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()
        subprocess.run(["buildah", "rm", self.name], capture_output=True, env=buildah_env())


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``, parents before children (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = (entry / "stat").read_text()
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    found: list[int] = []
    pending = [pid]
    while pending:
        current = pending.pop(0)
        for child in sorted(children.get(current, [])):
            found.append(child)
            pending.append(child)
    return found


@contextlib.contextmanager
def container(image: str) -> Iterator[BuildahContainer]:
    """A :class:`BuildahContainer`, removed (with anything it still runs) at the end."""
    made = BuildahContainer(image)
    try:
        yield made
    finally:
        made.remove()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m outbox_devtools.images build [--target T ...] [--quiet]``."""
    parser = argparse.ArgumentParser(prog="python -m outbox_devtools.images", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="build the images (both unless --target)")
    build.add_argument("--target", action="append", choices=TARGETS)
    build.add_argument("--quiet", action="store_true", help="no build output, only the summary")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        built = [build_image(target, echo=not args.quiet) for target in args.target or TARGETS]
    except ImageBuildError as exc:
        print(f"make image: {exc}", file=sys.stderr)
        return 1
    for image in built:
        print(image.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
