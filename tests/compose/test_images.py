"""The Dockerfile's images, built and run: the checker sidecar against the suite's broker.

No Docker engine runs here, so the images are built as ``make image`` builds them
without one: buildah, daemonless, on a base made from Debian's own packages
(:mod:`outbox_devtools.images`). The checker then runs from its image as the
container's entry point (``tini -- outbox checker``), on the host's network, against
the session's broker: a committed transaction is published once, the probes and the
image's own HEALTHCHECK answer, and SIGTERM to the entry point ends it with exit 0.

The first build on a machine makes the base with debootstrap and downloads the
dependencies (minutes); after that buildah's layer cache answers and a build takes
seconds. The sink image (pyspark and a JRE, about 1 GB) is built in ``make test-long``.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from outbox import LocalTransactionState, Message, TransactionProducer
from outbox.protocol import RawRecord
from outbox_devtools.images import (
    BuildahContainer,
    BuiltImage,
    ImageBuildError,
    build_image,
    container,
    ensure_build_tools,
    image_config,
    labels,
    project_version,
)
from outbox_devtools.processes import free_port
from tests.producer.conftest import OutboxTopics

BUILD_TIMEOUT = 3600
"""A first build on a new machine: debootstrap, the dependencies, Debian's tini (and for
the sink a JRE and pyspark's 400 MB) all come over the network."""

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(BUILD_TIMEOUT)]


def _built(target: str) -> BuiltImage:
    """The target built as ``make image`` builds it without a Docker engine. A machine that
    cannot (not root, or no apt to install buildah) fails the test, never skips it: the
    suite's proof that the image runs must not vanish quietly."""
    try:
        ensure_build_tools()
    except ImageBuildError as exc:
        pytest.fail(f"cannot build images on this machine: {exc}")
    return build_image(target, docker=False)


@pytest.fixture(scope="module")
def checker_image() -> BuiltImage:
    return _built("checker")


class Commit:
    """A listener whose local transactions all commit (the test's only send)."""

    def execute_local_transaction(self, message: Message, arg: object) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, message: Message) -> LocalTransactionState:
        return LocalTransactionState.COMMIT_MESSAGE


class Output:
    """A container's stdout and stderr, collected line by line in a thread."""

    def __init__(self, running: BuildahContainer) -> None:
        assert running.process is not None and running.process.stdout is not None
        self.lines: list[str] = []
        self._stream = running.process.stdout
        self._thread = threading.Thread(target=self._collect, daemon=True)
        self._thread.start()

    def _collect(self) -> None:
        for line in self._stream:
            self.lines.append(line.rstrip())

    def text(self) -> str:
        return "\n".join(self.lines)


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except OSError:
        return 0, ""


def _wait_for(condition: object, seconds: float, what: str, output: Output) -> None:
    """Poll ``condition`` until true; ``seconds`` is an 'it never came' bound only."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.5)
    said = output.text()
    raise AssertionError(f"{what} never came within {seconds}s; the container said:\n{said}")


def _records_with(topics: OutboxTopics, value: bytes) -> list[RawRecord]:
    return [record for record in topics.read(topics.real_topic) if record.value == value]


def _status(pid: int, field: str) -> str:
    """A field of ``/proc/PID/status`` (``NSpid``: the pid in each namespace, own last)."""
    status = Path(f"/proc/{pid}/status").read_text()
    match = re.search(rf"^{field}:\s+(.*)$", status, re.M)
    assert match, status
    return match[1]


@pytest.fixture
def running_checker(
    checker_image: BuiltImage, outbox_topics: OutboxTopics
) -> Iterator[tuple[BuildahContainer, Output, dict[str, str]]]:
    """The checker image's entry point, started with its default command as PID 1 of a
    PID namespace, on the host's network against the suite's broker; the container is
    removed at the end."""
    port = free_port()
    environment = {
        "OUTBOX_BOOTSTRAP_SERVERS": outbox_topics.bootstrap,
        "OUTBOX_TOPIC_PREFIX": outbox_topics.names.prefix,
        # Loopback and a free port: the host's network is shared, 9464 may be taken.
        "OUTBOX_HTTP_ADDRESS": f"127.0.0.1:{port}",
        "OUTBOX_INSTANCE_ID": f"image-{uuid.uuid4().hex[:8]}",
    }
    with container(checker_image.tag) as made:
        made.start(environment, as_pid_1=True)
        yield made, Output(made), environment


def test_the_checker_image_publishes_once_answers_its_probes_and_stops_on_sigterm(
    running_checker: tuple[BuildahContainer, Output, dict[str, str]],
    outbox_topics: OutboxTopics,
) -> None:
    made, output, environment = running_checker
    base = f"http://{environment['OUTBOX_HTTP_ADDRESS']}"
    _wait_for(lambda: _get(f"{base}/readyz")[0] == 200, 300, "/readyz 200", output)

    entry = made.entry_point_pid()
    assert Path(f"/proc/{entry}/exe").resolve().name == "tini"
    assert _status(entry, "NSpid").split()[-1] == "1", "the entry point is its namespace's PID 1"
    assert _status(entry, "Uid").split()[0] == "10001", "the image runs as its non-root user"

    value = f"order-{uuid.uuid4().hex}".encode()
    settings = outbox_topics.settings()
    with TransactionProducer("orders", Commit(), settings) as producer:
        result = producer.send_message_in_transaction(Message(outbox_topics.real_topic, value))
    assert result.local_transaction_state is LocalTransactionState.COMMIT_MESSAGE

    _wait_for(lambda: _records_with(outbox_topics, value), 120, "the published event", output)
    assert _get(f"{base}/healthz")[0] == 200
    status, metrics = _get(f"{base}/metrics")
    assert status == 200
    assert re.search(r"^outbox_checker_relay_published_total 1\.0$", metrics, re.M), metrics

    # The image's HEALTHCHECK, run in the container as an engine runs it.
    probe = made.run(["outbox-healthcheck"], environment)
    assert probe.returncode == 0, probe.stderr

    assert made.terminate() == 0, output.text()
    assert made.process is not None
    with contextlib.suppress(Exception):
        made.process.wait(30)
    _wait_for(lambda: "checker stopped" in output.text(), 30, "the checker's last line", output)
    assert len(_records_with(outbox_topics, value)) == 1, "published more than once"


def test_the_probe_fails_when_no_checker_answers(checker_image: BuiltImage) -> None:
    """The HEALTHCHECK counts a checker that does not answer as unhealthy (exit 1)."""
    with container(checker_image.tag) as made:
        nowhere = {"OUTBOX_HTTP_ADDRESS": f"127.0.0.1:{free_port()}"}
        probe = made.run(["outbox-healthcheck"], nowhere)
    assert probe.returncode == 1
    assert "/healthz" in probe.stderr


def test_the_checker_image_has_no_jre_pyspark_compiler_or_build_leftovers(
    checker_image: BuiltImage,
) -> None:
    script = (
        "for p in java gcc cc pip3; do command -v $p && echo found $p; done;"
        " ls /wheels /src /root/.cache 2>/dev/null && echo found build files;"
        " ls /var/lib/apt/lists | grep -v -x -e lock -e partial -e auxfiles && echo found lists;"
        " python -c 'import pyspark' 2>/dev/null && echo found pyspark;"
        " python -c 'import outbox_checker, psycopg' && echo imports"
    )
    with container(checker_image.tag) as made:
        result = made.run(["sh", "-c", script], {})
    assert "found" not in result.stdout, result.stdout
    assert result.stdout.strip().endswith("imports"), result.stdout + result.stderr


def test_the_checker_image_is_labelled_and_probes_its_health(checker_image: BuiltImage) -> None:
    config = image_config(checker_image.tag)
    image_labels = config["Labels"]
    assert isinstance(image_labels, dict)
    expected = labels()
    assert image_labels["org.opencontainers.image.version"] == project_version()
    assert image_labels["org.opencontainers.image.source"] == expected["SOURCE"]
    assert image_labels["org.opencontainers.image.revision"] == expected["REVISION"]
    assert config["Healthcheck"]["Test"] == ["CMD", "outbox-healthcheck"]  # type: ignore[index]
    assert config["Entrypoint"] == ["tini", "--", "outbox"]
    assert config["User"] == "outbox"


def test_a_second_build_is_taken_from_the_cache(checker_image: BuiltImage) -> None:
    again = build_image("checker", docker=False)
    assert again.image_id == checker_image.image_id
    assert again.steps > 0 and again.cached_steps == again.steps, again.summary()


@pytest.mark.long_proof
def test_the_sink_image_runs_outbox_sink() -> None:
    sink = _built("sink")
    with container(sink.tag) as made:
        result = made.run(made.command("sink", "--help"), {"COLUMNS": "200"}, timeout=300)
        java = made.run(["java", "-version"], {})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "--pattern" in result.stdout and "--checkpoint" in result.stdout
    assert java.returncode == 0, java.stderr
    config = image_config(sink.tag)
    assert config["Entrypoint"] == ["tini", "--", "outbox"]
    assert config["User"] == "outbox"
