"""docker-compose.yml and the Dockerfile agree with each other and with Kafka's rules.

There is no Docker engine in CI to ``docker compose up`` the stack (the images are
built and run with buildah in tests/compose/test_images.py, not composed), and a
typo in a listener or a database URL only shows up there, as a service that hangs
while connecting. So the file is read as data and cross-checked: each check is
a function returning its problems, run once on the real file and once on a
deliberately broken copy, to prove the check can fail.
"""

from __future__ import annotations

import base64
import copy
import importlib.util
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy.engine import make_url

from outbox.config import env_names
from outbox.sql import DATABASE_URL_ENV
from outbox_checker.settings import CheckerSettings
from outbox_devtools.images import IMAGE_NAMES, project_version
from tests.compose.dockerfile import Stage, apt_packages, installed_extras, stages_by_name

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"

KAFKA = "kafka"
POSTGRES = "postgres"
APP_SERVICES = ("topics-init", "checker", "spark-sink", "demo")
# The variable each service takes its database URL from, named as its code reads it:
# the checker answers check-backs from the log (`--resolve-from-db`), the demo
# (examples/order_service.py) writes orders and the log.
DATABASE_VARIABLES = {
    "checker": env_names(CheckerSettings, "resolve_from_db")[0],
    "demo": DATABASE_URL_ENV,
}
POSTGRES_CONTAINER_PORT = 5432

Compose = dict[str, Any]


# -- reading compose --------------------------------------------------------


def services(compose: Compose) -> dict[str, dict[str, Any]]:
    return compose.get("services") or {}


def env(compose: Compose, name: str) -> dict[str, str]:
    """A service's environment as strings; compose allows a mapping or KEY=VALUE list."""
    raw = services(compose)[name].get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) for item in raw)
    return {key: "" if value is None else str(value) for key, value in raw.items()}


def listeners(spec: str) -> dict[str, tuple[str, int]]:
    """``NAME://host:port,...`` to ``{NAME: (host, port)}`` (empty host = all interfaces)."""
    parsed: dict[str, tuple[str, int]] = {}
    for entry in filter(None, (part.strip() for part in spec.split(","))):
        match = re.fullmatch(r"([A-Za-z0-9_]+)://(\[[^\]]*\]|[^:]*):(\d+)", entry)
        assert match, f"unparseable listener {entry!r}"
        parsed[match[1]] = (match[2], int(match[3]))
    return parsed


def network_names(compose: Compose, name: str) -> set[str]:
    """Names other containers can resolve this service by on the compose network."""
    service = services(compose)[name]
    names = {name}
    if service.get("hostname"):
        names.add(service["hostname"])
    if service.get("container_name"):
        names.add(service["container_name"])
    networks = service.get("networks")
    if isinstance(networks, dict):
        for settings in networks.values():
            names.update((settings or {}).get("aliases", []))
    return names


def published_ports(service: dict[str, Any]) -> list[tuple[str, int]]:
    """``(host_ip, host_port)`` for each published port, short or long syntax."""
    result: list[tuple[str, int]] = []
    for port in service.get("ports") or []:
        if isinstance(port, dict):
            if port.get("published") is not None:
                result.append((str(port.get("host_ip", "")), int(port["published"])))
            continue
        parts = str(port).split("/")[0].split(":")
        if len(parts) == 1:
            continue  # container port only: the host side is random
        host_ip = parts[0] if len(parts) == 3 else ""
        result.append((host_ip, int(parts[-2])))
    return result


def depends_on(service: dict[str, Any]) -> dict[str, dict[str, Any]]:
    raw = service.get("depends_on") or {}
    if isinstance(raw, list):
        return {name: {"condition": "service_started"} for name in raw}
    return {name: settings or {} for name, settings in raw.items()}


# -- checks: each returns a list of problems ----------------------------------


def service_problems(compose: Compose) -> list[str]:
    expected = {KAFKA, POSTGRES, *APP_SERVICES}
    missing = expected - set(services(compose))
    return [f"missing service {name!r}" for name in sorted(missing)]


def bootstrap_problems(compose: Compose) -> list[str]:
    """Each client must use a listener the broker advertises under a name on the network.

    Clients bootstrap from any address but then reconnect to what the broker
    advertises; ``localhost:29092`` works from the host and nowhere else.
    """
    kafka_env = env(compose, KAFKA)
    advertised = listeners(kafka_env.get("KAFKA_ADVERTISED_LISTENERS", ""))
    bound = listeners(kafka_env.get("KAFKA_LISTENERS", ""))
    controllers = set(kafka_env.get("KAFKA_CONTROLLER_LISTENER_NAMES", "").split(","))
    reachable = network_names(compose, KAFKA)
    on_network = {
        (host, port): listener
        for listener, (host, port) in advertised.items()
        if host in reachable and listener not in controllers
    }
    problems = []
    for listener, (_, port) in advertised.items():
        if bound.get(listener, (None, None))[1] != port:
            problems.append(f"advertised listener {listener} port {port} is not in KAFKA_LISTENERS")
    for name in services(compose):
        if name == KAFKA:
            continue
        bootstrap = env(compose, name).get("OUTBOX_BOOTSTRAP_SERVERS")
        if bootstrap is None:
            if name in APP_SERVICES:
                problems.append(f"{name}: no OUTBOX_BOOTSTRAP_SERVERS")
            continue
        for address in bootstrap.split(","):
            host, _, port = address.strip().rpartition(":")
            if not port.isdigit() or (host, int(port)) not in on_network:
                problems.append(
                    f"{name}: OUTBOX_BOOTSTRAP_SERVERS {address!r} is not an advertised "
                    f"listener on the compose network {sorted(on_network)}"
                )
    return problems


def host_port_problems(compose: Compose) -> list[str]:
    seen: dict[int, str] = {}
    problems = []
    for name, service in services(compose).items():
        for _, port in published_ports(service):
            if port in seen:
                problems.append(f"host port {port} published by both {seen[port]} and {name}")
            seen[port] = name
    return problems


def dependency_problems(compose: Compose) -> list[str]:
    """Unknown targets fail ``compose up``; service_healthy without a healthcheck never starts."""
    problems = []
    all_services = services(compose)
    for name, service in all_services.items():
        for target, settings in depends_on(service).items():
            if target not in all_services:
                problems.append(f"{name} depends on unknown service {target!r}")
            elif settings.get("condition") == "service_healthy" and not all_services[target].get(
                "healthcheck"
            ):
                problems.append(f"{name} waits for {target} to be healthy; it has no healthcheck")
            elif settings.get("condition") == "service_completed_successfully" and all_services[
                target
            ].get("restart") in ("always", "unless-stopped"):
                problems.append(f"{name} waits for {target} to complete; it restarts for ever")
    return problems


def database_url_problems(compose: Compose) -> list[str]:
    """Each database URL reaches the postgres service with its credentials, and all
    name one database: the checker must read the log the demo's producers write."""
    pg_env = env(compose, POSTGRES)
    expected = {
        "username": pg_env.get("POSTGRES_USER", "postgres"),
        "password": pg_env.get("POSTGRES_PASSWORD"),
        "database": pg_env.get("POSTGRES_DB", pg_env.get("POSTGRES_USER", "postgres")),
    }
    problems = []
    urls: dict[str, str] = {}
    for name in services(compose):
        service_env = env(compose, name)
        wanted = DATABASE_VARIABLES.get(name)
        if wanted is not None and wanted not in service_env:
            problems.append(f"{name}: no {wanted}")
        for variable in sorted(set(DATABASE_VARIABLES.values()) & set(service_env)):
            where = f"{name}: {variable}"
            urls[where] = service_env[variable]
            url = make_url(service_env[variable])
            if url.drivername != "postgresql+psycopg":
                problems.append(f"{where}: driver {url.drivername!r}; the image installs psycopg 3")
            if url.host not in network_names(compose, POSTGRES):
                problems.append(f"{where}: database host {url.host!r} is not the postgres service")
            if (url.port or POSTGRES_CONTAINER_PORT) != POSTGRES_CONTAINER_PORT:
                problems.append(f"{where}: database port {url.port} is not the container port")
            for field, want in expected.items():
                got = getattr(url, field)
                if got != want:
                    problems.append(f"{where}: database {field} {got!r} != {want!r}")
    if len(set(urls.values())) > 1:
        problems.append(f"services use different databases: {sorted(urls)}")
    return problems


def build_problems(compose: Compose) -> list[str]:
    """Each outbox service builds a target of the Dockerfile and names it as ``make image``
    tags it (``kafka-outbox-<target>:<version>``): compose then runs what was built."""
    problems = []
    targets = stages_by_name()
    for name, service in services(compose).items():
        build = service.get("build")
        if build is None:
            continue
        if isinstance(build, str):
            build = {"context": build}
        context = REPO / build.get("context", ".")
        dockerfile = context / build.get("dockerfile", "Dockerfile")
        if not dockerfile.is_file():
            problems.append(f"{name}: builds from {dockerfile}, which does not exist")
            continue
        target = build.get("target")
        if target not in IMAGE_NAMES or target not in targets:
            problems.append(f"{name}: builds target {target!r}, not one of {sorted(IMAGE_NAMES)}")
            continue
        wanted = f"{IMAGE_NAMES[target]}:{project_version()}"
        if service.get("image") != wanted:
            problems.append(f"{name}: image {service.get('image')!r}; target {target} is {wanted}")
    for name in APP_SERVICES:
        if name in services(compose) and "build" not in services(compose)[name]:
            problems.append(f"{name}: does not build the project image")
    return problems


def service_stage(service: dict[str, Any]) -> Stage | None:
    """The Dockerfile target a service's image is built from (None if it builds none)."""
    build = service.get("build")
    target = build.get("target") if isinstance(build, dict) else None
    return stages_by_name().get(target) if target else None


COMMAND_EXTRAS = {"sink": {"spark"}}
"""The library's extras an ``outbox`` sub-command imports when it runs (``outbox sink``
starts pyspark); the others need none beyond the postgres driver."""
COMMAND_DEBIAN_PACKAGES = {"sink": {"openjdk-17-jre-headless"}}
"""What a sub-command needs from Debian: pyspark's JVM."""


def _outbox_command_problems(name: str, args: list[str], stage: Stage) -> list[str]:
    """``outbox ARGS`` parsed by the real command line (nothing runs), and what the
    sub-command needs installed in the image."""
    import typer

    from outbox_cli import app

    command: Any = typer.main.get_command(app)
    path: list[str] = []
    rest = list(args)
    while hasattr(command, "get_command") and rest and not rest[0].startswith("-"):
        context = command.make_context("outbox", [], resilient_parsing=True)
        sub = command.get_command(context, rest[0])
        if sub is None:
            return [f"{name}: `outbox {' '.join(path + rest[:1])}` is no command of the image"]
        path.append(rest.pop(0))
        command = sub
    if not path:
        return [f"{name}: `outbox {' '.join(args)}` names no sub-command"]
    try:
        command.make_context(" ".join(path), rest)
    except Exception as exc:  # click's usage errors (typer ships its own click)
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        return [f"{name}: `outbox {' '.join(args)}`: {message}"]
    problems = []
    missing = COMMAND_EXTRAS.get(path[0], set()) - installed_extras(stage)
    if missing:
        problems.append(
            f"{name}: `outbox {path[0]}` needs the {sorted(missing)} extra, which image target"
            f" {stage.name} does not install"
        )
    packages = COMMAND_DEBIAN_PACKAGES.get(path[0], set()) - set(apt_packages(stage.all_lines()))
    if packages:
        problems.append(f"{name}: `outbox {path[0]}` needs {sorted(packages)} in {stage.name}")
    return problems


def entrypoint_problems(compose: Compose) -> list[str]:
    """Each outbox service's command, as the engine joins it to its image's entry point.

    A service without an ``entrypoint`` gets the image's (``tini -- outbox``), and its
    ``command`` then goes to ``outbox``: the real command line parses it, and the image
    must install what that sub-command imports (the sink needs pyspark and a JRE, which
    the checker image leaves out). A service that sets its own entry point runs a script
    that must be in the image's working directory or on a volume mounted there."""
    problems = []
    for name in APP_SERVICES:
        service = services(compose).get(name, {})
        stage = service_stage(service)
        if stage is None:
            continue  # build_problems says so
        if stage.entrypoint is None:
            problems.append(f"{name}: image target {stage.name} has no ENTRYPOINT")
            continue
        own = service.get("entrypoint")
        command = service.get("command")
        if own is None:
            argv = [*stage.entrypoint, *(command if command is not None else stage.cmd or [])]
        else:
            argv = [*own, *(command or [])]
        argv = [str(part) for part in argv]
        if argv[:3] == ["tini", "--", "outbox"]:
            problems += _outbox_command_problems(name, argv[3:], stage)
        elif argv[:1] == ["python"] and len(argv) > 1:
            script = argv[1]
            workdir = (stage.workdir or "/").rstrip("/")
            mounted = [
                target
                for target in _mount_targets(service)
                if f"{workdir}/{script}".startswith(f"{target}/")
            ]
            if not mounted:
                problems.append(
                    f"{name}: runs {script}, which image target {stage.name} does not carry"
                    f" and no volume mounts under {workdir}"
                )
        else:
            problems.append(f"{name}: runs {argv!r}, neither `outbox` nor a Python script")
        if stage.user in (None, "root", "0"):
            problems.append(f"{name}: image target {stage.name} runs as root")
    return problems


def healthcheck_problems(compose: Compose) -> list[str]:
    """A service whose image has a HEALTHCHECK probes as the image does (compose's
    ``healthcheck`` replaces the image's: two spellings would drift apart)."""
    problems = []
    for name in APP_SERVICES:
        service = services(compose).get(name, {})
        stage = service_stage(service)
        if stage is None or stage.healthcheck is None:
            continue
        test = (service.get("healthcheck") or {}).get("test")
        if test is not None and test != stage.healthcheck:
            problems.append(f"{name}: healthcheck {test!r} is not the image's {stage.healthcheck}")
    return problems


def single_node_kafka_problems(compose: Compose) -> list[str]:
    """One broker cannot hold three replicas: internal topics and transactions would stall."""
    kafka_env = env(compose, KAFKA)
    problems = []
    for key in (
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
    ):
        if key not in kafka_env:
            problems.append(f"kafka: {key} unset (defaults assume 3 brokers)")
    for key, value in kafka_env.items():
        if key.endswith(("REPLICATION_FACTOR", "MIN_ISR", "MIN_INSYNC_REPLICAS")) and value != "1":
            problems.append(f"kafka: {key}={value}, a single node needs 1")
    roles = set(kafka_env.get("KAFKA_PROCESS_ROLES", "").split(","))
    if roles != {"broker", "controller"}:
        problems.append(f"kafka: KAFKA_PROCESS_ROLES {sorted(roles)} is not a combined node")
    controller_names = kafka_env.get("KAFKA_CONTROLLER_LISTENER_NAMES", "").split(",")
    bound = listeners(kafka_env.get("KAFKA_LISTENERS", ""))
    controller_ports = {bound[n][1] for n in controller_names if n in bound}
    voters = kafka_env.get("KAFKA_CONTROLLER_QUORUM_VOTERS", "")
    voter = re.fullmatch(r"(\d+)@([^:]+):(\d+)", voters)
    if voter is None:
        problems.append(f"kafka: KAFKA_CONTROLLER_QUORUM_VOTERS {voters!r} is not one voter")
    else:
        if voter[1] != kafka_env.get("KAFKA_NODE_ID"):
            problems.append(f"kafka: voter id {voter[1]} is not KAFKA_NODE_ID")
        if voter[2] not in network_names(compose, KAFKA):
            problems.append(f"kafka: voter host {voter[2]!r} does not resolve to kafka")
        if int(voter[3]) not in controller_ports:
            problems.append(f"kafka: voter port {voter[3]} is not a controller listener")
    cluster_id = kafka_env.get("CLUSTER_ID")
    if cluster_id is not None:
        try:
            raw = base64.urlsafe_b64decode(cluster_id + "==")
        except ValueError:
            raw = b""
        if len(cluster_id) != 22 or len(raw) != 16:
            problems.append(f"kafka: CLUSTER_ID {cluster_id!r} is not 16 bytes of base64url")
    return problems


def topic_prefix_problems(compose: Compose) -> list[str]:
    prefixes = {
        name: env(compose, name)["OUTBOX_TOPIC_PREFIX"]
        for name in services(compose)
        if "OUTBOX_TOPIC_PREFIX" in env(compose, name)
    }
    if len(set(prefixes.values())) > 1:
        return [f"services disagree on OUTBOX_TOPIC_PREFIX: {prefixes}"]
    return []


CHECKER = "checker"
TOPICS_INIT = "topics-init"


def checker_problems(compose: Compose) -> list[str]:
    """The checker runs for good, after the topics exist, with a probe on its HTTP port.

    The probe must hit the port ``OUTBOX_HTTP_ADDRESS`` binds, on an address
    other containers (Prometheus) can reach; the slim image has no curl.
    """
    all_services = services(compose)
    checker = all_services.get(CHECKER, {})
    init = all_services.get(TOPICS_INIT, {})
    problems = []
    if checker.get("command") != ["checker"]:
        problems.append(f"checker: command {checker.get('command')!r} is not ['checker']")
    init_command = init.get("command") or []
    if init_command[:2] != ["topics", "create"]:
        problems.append(f"{TOPICS_INIT}: command {init_command!r} does not create the topics")
    waits = depends_on(checker).get(TOPICS_INIT, {}).get("condition")
    if waits != "service_completed_successfully":
        problems.append(f"checker does not wait for {TOPICS_INIT} to complete (condition {waits})")
    address = env(compose, CHECKER).get("OUTBOX_HTTP_ADDRESS", "")
    host, _, port = address.rpartition(":")
    if host not in ("0.0.0.0", "::", "[::]") or not port.isdigit():
        problems.append(f"checker: OUTBOX_HTTP_ADDRESS {address!r} is not reachable off-container")
    test = (checker.get("healthcheck") or {}).get("test") or []
    probe = " ".join(test) if isinstance(test, list) else str(test)
    # image/healthcheck.py asks /healthz on OUTBOX_HTTP_ADDRESS's port, whatever it is.
    if f":{port}/healthz" not in probe and probe != "CMD outbox-healthcheck":
        problems.append(f"checker: healthcheck {probe!r} does not hit /healthz on port {port}")
    if "curl" in probe or "wget" in probe:
        problems.append("checker: healthcheck uses curl/wget, which the checker image lacks")
    reads = _command_variables("checker") | {
        variable for field in CheckerSettings.model_fields
        for variable in env_names(CheckerSettings, field)
    }  # fmt: skip
    for variable in sorted(env(compose, CHECKER)):
        if variable.startswith("OUTBOX_") and variable not in reads:
            problems.append(f"checker: {variable} is not a variable `outbox checker` reads")
    return problems


def _command_variables(name: str) -> set[str]:
    """The variables the options of ``outbox <name>`` read."""
    import typer

    from outbox_cli import app

    command = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
    variables: set[str] = set()
    for param in command.params:
        envvar = getattr(param, "envvar", None) or []
        variables.update([envvar] if isinstance(envvar, str) else envvar)
    return variables


SPARK_SINK = "spark-sink"


def _mount_targets(service: dict[str, Any]) -> list[str]:
    targets = []
    for volume in service.get("volumes") or []:
        if isinstance(volume, dict):
            targets.append(str(volume.get("target", "")))
        elif ":" in str(volume):
            targets.append(str(volume).split(":")[1])
    return [target.rstrip("/") for target in targets if target]


def spark_sink_problems(compose: Compose) -> list[str]:
    """The sink runs ``outbox sink`` with flags it knows, its table and checkpoint on a volume.

    The command's flags are parsed by the real ``outbox sink`` (nothing runs),
    so a typo fails here, not as a container in a restart loop; a table or a
    checkpoint outside a volume would vanish with the container.
    """
    import typer

    from outbox_cli import app

    service = services(compose).get(SPARK_SINK, {})
    command = [str(part) for part in service.get("command") or []]
    if command[:1] != ["sink"]:
        return [f"{SPARK_SINK}: command {command!r} does not run `outbox sink`"]
    sink = typer.main.get_command(app).commands["sink"]  # type: ignore[attr-defined]
    try:
        params = sink.make_context("sink", command[1:]).params
    except Exception as exc:  # click's usage errors (typer ships its own click)
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        return [f"{SPARK_SINK}: {message}"]
    sink_env = env(compose, SPARK_SINK)

    def setting(name: str) -> str | None:
        return params.get(name) or sink_env.get(f"OUTBOX_SINK_{name.upper()}")

    problems = []
    if bool(setting("topics")) == bool(setting("pattern")):
        problems.append(f"{SPARK_SINK}: give exactly one of --topics and --pattern")
    mounts = _mount_targets(service)
    for name in ("output", "checkpoint"):
        path = setting(name)
        if not path:
            problems.append(f"{SPARK_SINK}: no --{name}")
        elif not any(path == m or path.startswith(f"{m}/") for m in mounts):
            problems.append(
                f"{SPARK_SINK}: --{name} {path} is not on a volume; it would go with the container"
            )
    return problems


DEMO = "demo"
DEMO_SCRIPT = "examples/order_service.py"


def _example_parser(environ: dict[str, str]) -> Any:
    """examples/order_service.py's own argument parser, defaults from ``environ``."""
    spec = importlib.util.spec_from_file_location("order_service", REPO / DEMO_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_parser(environ)


def demo_problems(compose: Compose) -> list[str]:
    """The demo runs the example order service on the compose Kafka and PostgreSQL.

    Its command is parsed by the example's own parser with the service's
    environment (nothing runs), so a typo, or a variable the example does not
    read, fails here; its producer needs the outbox topics, so it waits for them.
    """
    service = services(compose).get(DEMO, {})
    entrypoint = [str(part) for part in service.get("entrypoint") or []]
    if entrypoint != ["python", DEMO_SCRIPT]:
        return [f"{DEMO}: entrypoint {entrypoint!r} does not run {DEMO_SCRIPT}"]
    problems = []
    waits = depends_on(service).get(TOPICS_INIT, {}).get("condition")
    if waits != "service_completed_successfully":
        problems.append(f"{DEMO} does not wait for {TOPICS_INIT} to complete (condition {waits})")
    demo_env = env(compose, DEMO)
    command = [str(part) for part in service.get("command") or []]
    try:
        args, unknown = _example_parser(demo_env).parse_known_args(command)
    except SystemExit:  # argparse has printed why
        return [*problems, f"{DEMO}: {DEMO_SCRIPT} refuses the command {command!r}"]
    if unknown:
        problems.append(f"{DEMO}: {DEMO_SCRIPT} does not know {unknown}")
    for value, variable in (
        (args.bootstrap, "OUTBOX_BOOTSTRAP_SERVERS"),
        (args.database_url, DATABASE_URL_ENV),
    ):
        if value != demo_env.get(variable):
            problems.append(f"{DEMO}: runs with {value!r}, not the service's {variable}")
    return problems


CHECKS: list[Callable[[Compose], list[str]]] = [
    service_problems,
    bootstrap_problems,
    host_port_problems,
    dependency_problems,
    database_url_problems,
    build_problems,
    entrypoint_problems,
    healthcheck_problems,
    single_node_kafka_problems,
    topic_prefix_problems,
    checker_problems,
    spark_sink_problems,
    demo_problems,
]


# -- tests --------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> Compose:
    loaded = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(loaded, dict) and isinstance(loaded.get("services"), dict)
    return loaded


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
def test_compose_file_passes(check: Callable[[Compose], list[str]], compose: Compose) -> None:
    assert check(compose) == []


def _set_env(name: str, key: str, value: str) -> Callable[[Compose], None]:
    def mutate(compose: Compose) -> None:
        services(compose)[name]["environment"] = {**env(compose, name), key: value}

    return mutate


def _drop_env(name: str, key: str) -> Callable[[Compose], None]:
    def mutate(compose: Compose) -> None:
        services(compose)[name]["environment"] = {
            k: v for k, v in env(compose, name).items() if k != key
        }

    return mutate


def _drop_service(name: str) -> Callable[[Compose], None]:
    return lambda compose: services(compose).pop(name)


def _publish(name: str, port: str) -> Callable[[Compose], None]:
    return lambda compose: services(compose)[name].setdefault("ports", []).append(port)


def _depend(name: str, target: str) -> Callable[[Compose], None]:
    def mutate(compose: Compose) -> None:
        services(compose)[name]["depends_on"] = {target: {"condition": "service_healthy"}}

    return mutate


def _wait_for_completion(name: str, target: str) -> Callable[[Compose], None]:
    def mutate(compose: Compose) -> None:
        services(compose)[name]["depends_on"] = {
            target: {"condition": "service_completed_successfully"}
        }

    return mutate


def _set(name: str, key: str, value: Any) -> Callable[[Compose], None]:
    def mutate(compose: Compose) -> None:
        services(compose)[name][key] = value

    return mutate


PORT_9464_PROBE = "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9464/healthz')"
"""A probe that names its port: right only while the checker listens there."""


def _both(*mutations: Callable[[Compose], None]) -> Callable[[Compose], None]:
    def mutate(compose: Compose) -> None:
        for mutation in mutations:
            mutation(compose)

    return mutate


def _build_from(name: str, context: str) -> Callable[[Compose], None]:
    def mutate(compose: Compose) -> None:
        services(compose)[name]["build"] = context

    return mutate


BREAKAGES: list[tuple[str, Callable[[Compose], list[str]], Callable[[Compose], None], str]] = [
    ("missing demo", service_problems, _drop_service("demo"), "demo"),
    ("missing topics-init", service_problems, _drop_service("topics-init"), "topics-init"),
    (
        "host-side listener",
        bootstrap_problems,
        _set_env("checker", "OUTBOX_BOOTSTRAP_SERVERS", "localhost:29092"),
        "checker",
    ),
    (
        "controller listener",
        bootstrap_problems,
        _set_env("demo", "OUTBOX_BOOTSTRAP_SERVERS", "kafka:9093"),
        "demo",
    ),
    (
        "advertised but not bound",
        bootstrap_problems,
        _set_env("kafka", "KAFKA_LISTENERS", "INTERNAL://:9094,CONTROLLER://:9093"),
        "not in KAFKA_LISTENERS",
    ),
    ("duplicate host port", host_port_problems, _publish("demo", "29092:8080"), "29092"),
    ("unknown dependency", dependency_problems, _depend("demo", "zookeeper"), "zookeeper"),
    ("unhealthy dependency", dependency_problems, _depend("demo", "topics-init"), "healthcheck"),
    (
        "waits for a service that never completes",
        dependency_problems,
        _wait_for_completion("demo", "checker"),
        "restarts for ever",
    ),
    (
        "wrong database password",
        database_url_problems,
        _set_env(
            "checker",
            "OUTBOX_RESOLVE_FROM_DB",
            "postgresql+psycopg://outbox:secret@postgres:5432/outbox",
        ),
        "password",
    ),
    (
        "checker not answering from the database",
        database_url_problems,
        _drop_env("checker", "OUTBOX_RESOLVE_FROM_DB"),
        "checker: no OUTBOX_RESOLVE_FROM_DB",
    ),
    (
        "checker reading another database than the demo writes",
        database_url_problems,
        _set_env(
            "checker",
            "OUTBOX_RESOLVE_FROM_DB",
            "postgresql+psycopg://outbox:outbox@postgres:5432/outbox?application_name=checker",
        ),
        "different databases",
    ),
    (
        "demo without its database",
        database_url_problems,
        _drop_env("demo", "OUTBOX_DATABASE_URL"),
        "demo: no OUTBOX_DATABASE_URL",
    ),
    (
        "database on the host",
        database_url_problems,
        _set_env(
            "demo",
            "OUTBOX_DATABASE_URL",
            "postgresql+psycopg://outbox:outbox@localhost:55432/outbox",
        ),
        "host",
    ),
    ("no Dockerfile", build_problems, _build_from("demo", "./nowhere"), "does not exist"),
    (
        "an image name that is not the target's",
        build_problems,
        _set("checker", "image", "kafka-outbox-sink:0.1.0"),
        "target checker is kafka-outbox-checker",
    ),
    (
        "a target the Dockerfile lacks",
        build_problems,
        _set("checker", "build", {"context": ".", "target": "runtime-typo"}),
        "runtime-typo",
    ),
    (
        "the sink on the checker image",
        entrypoint_problems,
        _set("spark-sink", "build", {"context": ".", "target": "checker"}),
        "needs the ['spark'] extra",
    ),
    (
        "a sub-command the image has not",
        entrypoint_problems,
        _set("checker", "command", ["chekcer"]),
        "chekcer",
    ),
    (
        "a flag the sub-command has not",
        entrypoint_problems,
        _set("topics-init", "command", ["topics", "create", "--partition", "8"]),
        "--partition",
    ),
    (
        "the demo's script not mounted",
        entrypoint_problems,
        _set("demo", "volumes", []),
        "does not carry",
    ),
    (
        "a healthcheck that is not the image's",
        healthcheck_problems,
        _set("checker", "healthcheck", {"test": ["CMD", "true"]}),
        "not the image's",
    ),
    (
        "three replicas",
        single_node_kafka_problems,
        _set_env("kafka", "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "3"),
        "TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
    ),
    (
        "voter on the broker port",
        single_node_kafka_problems,
        _set_env("kafka", "KAFKA_CONTROLLER_QUORUM_VOTERS", "1@kafka:9092"),
        "voter port",
    ),
    (
        "invalid cluster id",
        single_node_kafka_problems,
        _set_env("kafka", "CLUSTER_ID", "my-cluster"),
        "CLUSTER_ID",
    ),
    (
        "checker still a placeholder",
        checker_problems,
        _set("checker", "command", ["topics", "create"]),
        "command",
    ),
    (
        "checker starts before the topics exist",
        checker_problems,
        _set("checker", "depends_on", {"kafka": {"condition": "service_healthy"}}),
        "topics-init",
    ),
    (
        "probe on loopback only",
        checker_problems,
        _set_env("checker", "OUTBOX_HTTP_ADDRESS", "127.0.0.1:9464"),
        "OUTBOX_HTTP_ADDRESS",
    ),
    (
        "probe on another port",
        checker_problems,
        _both(
            _set_env("checker", "OUTBOX_HTTP_ADDRESS", "0.0.0.0:9999"),
            _set("checker", "healthcheck", {"test": ["CMD", "python", "-c", PORT_9464_PROBE]}),
        ),
        "/healthz on port 9999",
    ),
    (
        "checker given a variable it does not read",
        checker_problems,
        _set_env("checker", "OUTBOX_DATABASE_URL", "postgresql+psycopg://postgres/outbox"),
        "OUTBOX_DATABASE_URL is not a variable",
    ),
    (
        "probe with curl",
        checker_problems,
        _set(
            "checker",
            "healthcheck",
            {"test": ["CMD", "curl", "-f", "http://127.0.0.1:9464/healthz"]},
        ),
        "curl",
    ),
    (
        "prefix drift",
        topic_prefix_problems,
        _set_env("spark-sink", "OUTBOX_TOPIC_PREFIX", "other"),
        "OUTBOX_TOPIC_PREFIX",
    ),
    (
        "sink still a placeholder",
        spark_sink_problems,
        _set("spark-sink", "command", ["--help"]),
        "outbox sink",
    ),
    (
        "sink flag typo",
        spark_sink_problems,
        _set("spark-sink", "command", ["sink", "--pattern", "x.*", "--ouput", "/t"]),
        "--ouput",
    ),
    (
        "sink table in the container",
        spark_sink_problems,
        _set("spark-sink", "volumes", []),
        "not on a volume",
    ),
    ("demo still a placeholder", demo_problems, _set("demo", "entrypoint", None), "does not run"),
    ("demo flag typo", demo_problems, _set("demo", "command", ["--create-topc"]), "--create-topc"),
    (
        "demo before the topics exist",
        demo_problems,
        _set("demo", "depends_on", {"kafka": {"condition": "service_healthy"}}),
        "topics-init",
    ),
    (
        "demo pointed away from the compose database",
        demo_problems,
        _set("demo", "command", ["--create-topic", "--database-url", "sqlite:///orders.db"]),
        "not the service's OUTBOX_DATABASE_URL",
    ),
]


@pytest.mark.parametrize(
    ("check", "mutate", "mentions"),
    [
        pytest.param(check, mutate, mentions, id=label)
        for label, check, mutate, mentions in BREAKAGES
    ],
)
def test_checks_catch_a_broken_copy(
    check: Callable[[Compose], list[str]],
    mutate: Callable[[Compose], None],
    mentions: str,
    compose: Compose,
) -> None:
    broken = copy.deepcopy(compose)
    mutate(broken)
    problems = check(broken)
    assert problems, "the check accepted a broken compose file"
    assert any(mentions in problem for problem in problems), problems


def test_each_image_target_runs_outbox_under_tini_as_a_non_root_user() -> None:
    targets = stages_by_name()
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert "outbox" in scripts
    for target in IMAGE_NAMES:
        stage = targets[target]
        assert stage.entrypoint == ["tini", "--", "outbox"], (target, stage.entrypoint)
        assert stage.user not in (None, "root", "0"), f"{target} would run as root"
        assert "tini" in apt_packages(stage.all_lines())
        assert stage.copied_from("/opt/outbox") is not None, f"{target} copies in no venv"
    assert installed_extras(targets["checker"]) == {"postgres"}
    assert installed_extras(targets["sink"]) == {"postgres", "spark"}
    assert "openjdk-17-jre-headless" not in apt_packages(targets["checker"].all_lines())
    assert "openjdk-17-jre-headless" in apt_packages(targets["sink"].all_lines())
    assert targets["checker"].healthcheck == ["CMD", "outbox-healthcheck"]
    assert targets["checker"].cmd == ["checker"]


def test_dockerignore_keeps_what_pip_install_needs() -> None:
    ignored = {
        line.strip().rstrip("/")
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    needed = {
        *("pyproject.toml", "README.md", "outbox", "outbox_cli", "checker", "spark_sink"),
        "migrations",
        "image",  # requirements.py and healthcheck.py, which the Dockerfile copies
    }
    assert not needed & ignored
    assert {".git", ".venv"} <= ignored


def test_checker_runs_after_the_topics_are_created(compose: Compose) -> None:
    """topics-init creates the topics once; the checker starts after it exits 0."""
    assert services(compose)[TOPICS_INIT]["command"][:2] == ["topics", "create"]
    assert services(compose)[CHECKER]["command"] == ["checker"]
    assert depends_on(services(compose)[CHECKER])[TOPICS_INIT] == {
        "condition": "service_completed_successfully"
    }
