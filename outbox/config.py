"""Connection settings shared by every component that talks to Kafka.

Each component's own settings object embeds these fields; every field is also
an ``OUTBOX_*`` environment variable. Authentication and TLS are the security
block (:mod:`outbox.security`); further librdkafka properties pass through
untouched, win over the block, and are never shown in reprs or logs, since
they may carry passwords.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any

from pydantic import AliasChoices, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from outbox.errors import ConfigurationError
from outbox.kafka_log import hold_back_repeats
from outbox.protocol import DEFAULT_PREFIX, TopicNames, validate_topic_name
from outbox.security import KafkaSecurity

BOOTSTRAP_ENV = "OUTBOX_BOOTSTRAP_SERVERS"

RENAMED_VARIABLES: Mapping[str, str] = {
    "OUTBOX_CHECKER_GROUP": "OUTBOX_CONSUMER_GROUP",
    "OUTBOX_DB_TABLE": "OUTBOX_TRANSACTION_LOG_TABLE",
    "OUTBOX_DB_SCHEMA": "OUTBOX_TRANSACTION_LOG_SCHEMA",
}
"""Each variable under the one name its setting now has everywhere, and the deprecated
name it replaces: the checker's group was ``OUTBOX_CONSUMER_GROUP`` though its flag is
``--checker-group``; ``outbox db`` read ``OUTBOX_TRANSACTION_LOG_TABLE`` and
``_SCHEMA`` where the checker read ``OUTBOX_DB_TABLE`` and ``_SCHEMA`` for the same table.
The old name is still read while the new one is unset (:func:`renamed_variable`)."""

log = logging.getLogger(__name__)
_warned: set[str] = set()


def renamed_variable(name: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """The value of the deprecated variable ``name`` replaces, when ``name`` is unset and
    the old one set (a deprecation warning is logged, once per process), else None."""
    old = RENAMED_VARIABLES.get(name)
    if old is None or name in environ or old not in environ:
        return None
    if old not in _warned:
        _warned.add(old)
        log.warning("%s is deprecated (read as %s is unset): rename it %s", old, name, name)
    return environ[old]


KAFKA_LOGGER_NAME = "outbox.kafka"
"""The Python logger librdkafka's own log lines go to."""


def kafka_client_config(
    bootstrap_servers: str, properties: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A librdkafka configuration whose client logs through Python ``logging``.

    Left alone, librdkafka writes its log lines (``%3|...|FAIL|... Connection
    refused``) straight to file descriptor 2, past every handler and level the
    program chose. Given a ``logger`` it hands them to ``outbox.kafka`` instead,
    at the level confluent-kafka maps from syslog's (3 ERROR, 4 WARNING, 6 INFO,
    7 DEBUG), and only while the client is polled: a client nobody polls any
    more (closed, or past its use) puts nothing on anyone's screen.
    """
    logger = logging.getLogger(KAFKA_LOGGER_NAME)
    hold_back_repeats(logger)  # an outage is a handful of lines, not one per retry
    return {
        "bootstrap.servers": bootstrap_servers,
        "logger": logger,
        **(properties or {}),
    }


def normalize_bootstrap_servers(value: str) -> str:
    """``host:port[,host:port]`` without blanks; every settings object checks it this way."""
    hosts = [h.strip() for h in value.split(",") if h.strip()]
    if not hosts or any(":" not in h for h in hosts):
        raise ValueError(f"expected host:port[,host:port], got {value!r}")
    return ",".join(hosts)


class _KafkaAddress(BaseSettings):
    """Where the cluster is and which topic prefix to use; first among the fields."""

    model_config = SettingsConfigDict(env_prefix="OUTBOX_", extra="forbid")

    bootstrap_servers: str = Field(description="Kafka bootstrap servers, host:port[,host:port]")
    topic_prefix: str = Field(DEFAULT_PREFIX, description="prefix of the outbox's own topics")
    kafka_properties: dict[str, str] = Field(
        default_factory=dict,
        repr=False,
        description="extra librdkafka properties (JSON object), e.g. SASL/SSL settings",
    )

    @field_validator("bootstrap_servers")
    @classmethod
    def _bootstrap_has_hosts(cls, value: str) -> str:
        return normalize_bootstrap_servers(value)

    @field_validator("topic_prefix")
    @classmethod
    def _prefix_is_a_topic_name(cls, value: str) -> str:
        return validate_topic_name(value, "topic prefix")


class KafkaSettings(KafkaSecurity, _KafkaAddress):  # type: ignore[misc, valid-type]
    """Where the cluster is, how to authenticate, which topic prefix, extra client properties."""

    model_config = SettingsConfigDict(env_prefix="OUTBOX_", extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _renamed_variables(cls, data: Any) -> Any:
        """A field neither given nor set under its variable takes the deprecated one."""
        if not isinstance(data, dict):
            return data
        for name in cls.model_fields:
            if name in data:
                continue
            for variable in env_names(cls, name):
                value = renamed_variable(variable)
                if value is not None:
                    data = {**data, name: value}
        return data

    @property
    def topics(self) -> TopicNames:
        return TopicNames(self.topic_prefix)

    def client_config(self, **overrides: Any) -> dict[str, Any]:
        """A librdkafka configuration: bootstrap, security, pass-through properties, overrides."""
        return kafka_client_config(
            self.bootstrap_servers, {**self.librdkafka(), **self.kafka_properties, **overrides}
        )


def parse_properties(pairs: list[str]) -> dict[str, str]:
    """``KEY=VALUE`` flags (or one JSON object) into a librdkafka property dict."""
    properties: dict[str, str] = {}
    for pair in pairs:
        if pair.lstrip().startswith("{"):
            try:
                loaded = json.loads(pair)
            except json.JSONDecodeError as exc:
                raise ConfigurationError(f"Kafka properties are not valid JSON: {exc}") from None
            properties.update({str(k): str(v) for k, v in loaded.items()})
            continue
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(f"Kafka property {pair!r} is not KEY=VALUE")
        properties[key.strip()] = value
    return properties


def env_names(model: type[BaseSettings], name: str) -> list[str]:
    """The variables pydantic-settings reads for a field, in the order it tries them.

    ``env_prefix`` + name, unless the field has a ``validation_alias``: then
    its names alone (an ``AliasChoices`` is tried first to last, which is how
    ``OUTBOX_SINK_BOOTSTRAP_SERVERS`` wins over ``OUTBOX_BOOTSTRAP_SERVERS``).
    Flags, error messages and the configuration reference all name these.
    """
    alias = model.model_fields[name].validation_alias
    if isinstance(alias, AliasChoices):
        return [choice for choice in alias.choices if isinstance(choice, str)]
    if isinstance(alias, str):
        return [alias]
    return [f"{model.model_config.get('env_prefix', '')}{name}".upper()]


def settings_error(exc: ValidationError, model: type[BaseSettings]) -> ConfigurationError:
    """One readable line per invalid field, naming the variables that set it.

    pydantic reports a field read through an alias under that alias, so the
    location is mapped back to the field before its variables are named.
    """
    fields = {
        spelling.lower(): name
        for name in model.model_fields
        for spelling in (name, *env_names(model, name))
    }
    problems = []
    for error in exc.errors():
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["loc"]:
            first, *rest = (str(part) for part in error["loc"])
            field = fields.get(first.lower())
            where = ".".join([field or first, *rest])
            variable = f" ({' or '.join(env_names(model, field))})" if field else ""
            message = f"{where}{variable}: {message}"
        problems.append(message)
    return ConfigurationError("invalid settings: " + "; ".join(problems))
