"""What every ``outbox`` sub-command that talks to Kafka shares: the local broker
to fall back on, a session that names a refused login or ACL in one line, and
the ``--output table|json`` of the commands that report.

The connection's flags themselves (``--bootstrap-servers``, ``--topic-prefix``, ``-X``, the
security block) are generated from :class:`~outbox.config.KafkaSettings`
(:func:`outbox_cli.settings_flags.kafka_options`); each is also the environment
variable of its field, so a container is configured the same way as a shell.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from enum import StrEnum
from importlib.metadata import entry_points
from typing import Annotated

import typer
from confluent_kafka.admin import AdminClient

from outbox.access import connect
from outbox.config import KafkaSettings
from outbox.errors import ConfigurationError, NotAuthorizedError

PrefixOption = Annotated[
    str,
    typer.Option(
        "--topic-prefix",
        "--prefix",
        envvar="OUTBOX_TOPIC_PREFIX",
        help="Prefix of the outbox topics.",
    ),
]


class OutputFormat(StrEnum):
    """How a command that reports shows it: a table for people, JSON for scripts."""

    TABLE = "table"
    JSON = "json"


OutputOption = Annotated[
    OutputFormat,
    typer.Option(
        "--output",
        "-o",
        case_sensitive=False,
        help="table (for people) or json (one document on stdout, for scripts).",
    ),
]


def print_json(document: object) -> None:
    """``document`` as indented JSON on stdout, the one thing a ``--output json`` prints."""
    typer.echo(json.dumps(document, indent=2, sort_keys=False))


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
