"""Command-line options shared by every ``outbox`` sub-command that talks to Kafka.

Each option is also an environment variable, named like the settings field it
fills, so a container is configured the same way as a shell.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from importlib.metadata import entry_points
from typing import Annotated

import typer
from confluent_kafka.admin import AdminClient
from pydantic import ValidationError

from outbox.access import connect
from outbox.config import BOOTSTRAP_ENV, KafkaSettings, parse_properties, settings_error
from outbox.errors import ConfigurationError, NotAuthorizedError
from outbox.protocol import DEFAULT_PREFIX

BootstrapOption = Annotated[
    str | None,
    typer.Option(
        "--bootstrap",
        envvar=BOOTSTRAP_ENV,
        help="Kafka bootstrap servers; defaults to the broker of `outbox dev kafka start`.",
        show_default=False,
    ),
]
PrefixOption = Annotated[
    str,
    typer.Option("--prefix", envvar="OUTBOX_TOPIC_PREFIX", help="Prefix of the outbox topics."),
]
PropertiesOption = Annotated[
    list[str] | None,
    typer.Option(
        "--kafka-property",
        "-X",
        help="Extra librdkafka property KEY=VALUE (repeatable), or one JSON object;"
        " env OUTBOX_KAFKA_PROPERTIES takes a JSON object.",
        show_default=False,
    ),
]


BOOTSTRAP_FINDERS = "kafka_outbox.bootstrap"
"""Entry-point group of ``() -> str | None`` functions naming a broker running on this machine.

The core knows of no local broker; the development tooling declares one here for
the broker ``outbox dev kafka start`` leaves running, so the commands use it when
no bootstrap servers are given, and a wheel of the library alone does not.
"""


def local_bootstrap() -> str | None:
    """Bootstrap servers of a broker an installed tool reports running here, if any."""
    for finder in entry_points(group=BOOTSTRAP_FINDERS):
        found = finder.load()()
        if found:
            return str(found)
    return None


def no_kafka_error(flag: str, variables: Sequence[str]) -> ConfigurationError:
    """No bootstrap servers anywhere: the three ways to give a command its Kafka."""
    return ConfigurationError(
        f"no Kafka to talk to: pass {flag} HOST:PORT, set {' or '.join(variables)}, "
        "or start a local broker with `outbox dev kafka start`"
    )


def kafka_settings(
    bootstrap: str | None, prefix: str = DEFAULT_PREFIX, properties: list[str] | None = None
) -> KafkaSettings:
    """Settings from the shared options, falling back to the local dev broker."""
    if bootstrap is None:
        bootstrap = local_bootstrap()
    if bootstrap is None:
        raise no_kafka_error("--bootstrap", [BOOTSTRAP_ENV])
    explicit = {"kafka_properties": parse_properties(properties)} if properties else {}
    try:
        # Without -X flags, KafkaSettings reads OUTBOX_KAFKA_PROPERTIES itself.
        return KafkaSettings(bootstrap_servers=bootstrap, topic_prefix=prefix, **explicit)
    except ValidationError as exc:
        raise settings_error(exc, KafkaSettings) from None


@contextmanager
def admin_session(settings: KafkaSettings, timeout: float = 10.0) -> Iterator[AdminClient]:
    """An AdminClient that has reached the cluster, for one command.

    A wrong password or an untrusted certificate is one clear error at once
    (:func:`outbox.access.connect`); an ACL refusal inside names the user.
    """
    admin = connect(settings.client_config(), settings, settings.bootstrap_servers, timeout)
    try:
        yield admin
    except NotAuthorizedError as exc:
        raise exc.by(settings.principal) from None
