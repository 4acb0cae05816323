"""How every component authenticates to Kafka: one block of settings, two spellings.

The producer, the checker and the CLI talk to Kafka through librdkafka; the
Spark sink through the Java client. Both need the same facts (protocol, SASL
mechanism, user, password, CA file) under different names, and the Java client
wants the user and password inside a JAAS line. The facts are settings fields
written once here (:func:`security_fields`), embedded by
:class:`~outbox.config.KafkaSettings` and by the sink's settings, and turned
into each client's names by :meth:`KafkaSecurity.librdkafka` and
:meth:`KafkaSecurity.java`.

Passwords are :class:`~pydantic.SecretStr`: no repr, log line, ``--help`` or
error message shows them; only the two translations reveal them, for the client.
The pass-through properties (``kafka_properties``, the sink's ``kafka_options``)
are applied after the block, so a property given there wins: they are the
escape hatch for what the block does not cover (an OAUTHBEARER login, a keystore).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Self

from pydantic import AliasChoices, Field, SecretStr, create_model, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]

_JAAS_MODULES: dict[str, str] = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}

# name: (annotation, default, description); the order is the order of flags and reference rows.
_FIELDS: dict[str, tuple[Any, Any, str]] = {
    "security_protocol": (
        SecurityProtocol,
        "PLAINTEXT",
        "how clients connect: PLAINTEXT, SSL (TLS), SASL_PLAINTEXT or SASL_SSL (SASL over TLS)",
    ),
    "sasl_mechanism": (
        SaslMechanism,
        "SCRAM-SHA-512",
        "SASL mechanism of the SASL protocols: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512",
    ),
    "sasl_username": (str | None, None, "SASL user name (the ACLs' principal User:NAME)"),
    "sasl_password": (SecretStr | None, None, "SASL password; never shown in logs or errors"),
    "ssl_ca_file": (
        Path | None,
        None,
        "PEM file of the CA(s) that signed the brokers' certificates (default: system CAs)",
    ),
    "ssl_certificate_file": (
        Path | None,
        None,
        "PEM client certificate, for brokers that authenticate clients by TLS (mutual TLS)",
    ),
    "ssl_key_file": (Path | None, None, "PEM (PKCS#8) private key of the client certificate"),
    "ssl_key_password": (
        SecretStr | None,
        None,
        "password of an encrypted private key; never shown in logs or errors",
    ),
    "ssl_endpoint_identification": (
        bool,
        True,
        "check that the broker's certificate names the host connected to",
    ),
}

_SECRETS = ("sasl_password", "ssl_key_password")

SECURITY_FIELD_NAMES = tuple(_FIELDS)
"""The block's fields, in every settings object that has it."""


def security_fields(*env_prefixes: str) -> dict[str, Any]:
    """The block's fields for :func:`pydantic.create_model`.

    With ``env_prefixes`` each field is read from those variables in order
    (the sink's ``OUTBOX_SINK_X`` before the shared ``OUTBOX_X``); without,
    from the model's own ``env_prefix``.
    """
    fields: dict[str, Any] = {}
    for name, (annotation, default, description) in _FIELDS.items():
        extra: dict[str, Any] = {}
        if env_prefixes:
            extra["validation_alias"] = AliasChoices(
                *(f"{prefix}{name}".upper() for prefix in env_prefixes)
            )
        if name in _SECRETS:
            extra["repr"] = False
        fields[name] = (annotation, Field(default, description=description, **extra))
    return fields


def _tls(protocol: str) -> bool:
    return protocol in ("SSL", "SASL_SSL")


def _sasl(protocol: str) -> bool:
    return protocol.startswith("SASL_")


def _jaas_quoted(text: str) -> str:
    """A JAAS option value: double-quoted, with backslashes and quotes escaped."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class SecurityRules(BaseSettings):
    """Checks and translations of the security block; its fields are :func:`security_fields`."""

    if TYPE_CHECKING:
        security_protocol: SecurityProtocol
        sasl_mechanism: SaslMechanism
        sasl_username: str | None
        sasl_password: SecretStr | None
        ssl_ca_file: Path | None
        ssl_certificate_file: Path | None
        ssl_key_file: Path | None
        ssl_key_password: SecretStr | None
        ssl_endpoint_identification: bool

    # A rejected value is never echoed back: it may be a password.
    model_config = SettingsConfigDict(hide_input_in_errors=True)

    @model_validator(mode="after")
    def _consistent_security(self) -> Self:
        protocol = self.security_protocol
        if _sasl(protocol):
            missing = [
                name
                for name, value in (
                    ("sasl_username", self.sasl_username),
                    ("sasl_password", self.sasl_password),
                )
                if not value
            ]
            if missing:
                raise ValueError(
                    f"security protocol {protocol} needs {' and '.join(missing)} "
                    f"(mechanism {self.sasl_mechanism})"
                )
        elif self.sasl_username or self.sasl_password:
            raise ValueError(
                f"sasl_username/sasl_password are given but security protocol {protocol} "
                "does not use SASL; use SASL_SSL or SASL_PLAINTEXT"
            )
        tls_files = {
            "ssl_ca_file": self.ssl_ca_file,
            "ssl_certificate_file": self.ssl_certificate_file,
            "ssl_key_file": self.ssl_key_file,
        }
        given = [name for name, path in tls_files.items() if path is not None]
        if given and not _tls(protocol):
            raise ValueError(
                f"{', '.join(given)} given but security protocol {protocol} does not use TLS; "
                "use SSL or SASL_SSL"
            )
        for name in given:
            path = tls_files[name]
            assert path is not None
            if not path.is_file():
                raise ValueError(f"{name} {str(path)!r} does not exist or is not a file")
        if (self.ssl_certificate_file is None) != (self.ssl_key_file is None):
            raise ValueError("give ssl_certificate_file and ssl_key_file together, or neither")
        return self

    @property
    def principal(self) -> str | None:
        """``User:NAME`` as the broker's authoriser sees a SASL client; None without SASL."""
        return f"User:{self.sasl_username}" if _sasl(self.security_protocol) else None

    def librdkafka(self) -> dict[str, str]:
        """The block in librdkafka's property names (confluent-kafka clients); the
        default PLAINTEXT adds nothing, so a pass-through property says it alone."""
        protocol = self.security_protocol
        if protocol == "PLAINTEXT":
            return {}
        props = {"security.protocol": protocol.lower()}
        if _sasl(protocol):
            assert self.sasl_username is not None and self.sasl_password is not None
            props["sasl.mechanisms"] = self.sasl_mechanism
            props["sasl.username"] = self.sasl_username
            props["sasl.password"] = self.sasl_password.get_secret_value()
        if _tls(protocol):
            if self.ssl_ca_file is not None:
                props["ssl.ca.location"] = str(self.ssl_ca_file)
            if self.ssl_certificate_file is not None and self.ssl_key_file is not None:
                props["ssl.certificate.location"] = str(self.ssl_certificate_file)
                props["ssl.key.location"] = str(self.ssl_key_file)
            if self.ssl_key_password is not None:
                props["ssl.key.password"] = self.ssl_key_password.get_secret_value()
            props["ssl.endpoint.identification.algorithm"] = (
                "https" if self.ssl_endpoint_identification else "none"
            )
        return props

    def java(self) -> dict[str, str]:
        """The block in the Java client's names (Spark's source takes them with ``kafka.``).

        PEM files are handed over as PEM stores (Kafka 2.7+), so no keystore
        has to be made from them.
        """
        protocol = self.security_protocol
        if protocol == "PLAINTEXT":
            return {}
        props = {"security.protocol": protocol}
        if _sasl(protocol):
            assert self.sasl_username is not None and self.sasl_password is not None
            props["sasl.mechanism"] = self.sasl_mechanism
            props["sasl.jaas.config"] = (
                f"{_JAAS_MODULES[self.sasl_mechanism]} required "
                f"username={_jaas_quoted(self.sasl_username)} "
                f"password={_jaas_quoted(self.sasl_password.get_secret_value())};"
            )
        if _tls(protocol):
            if self.ssl_ca_file is not None:
                props["ssl.truststore.type"] = "PEM"
                props["ssl.truststore.location"] = str(self.ssl_ca_file)
            if self.ssl_certificate_file is not None and self.ssl_key_file is not None:
                props["ssl.keystore.type"] = "PEM"
                props["ssl.keystore.certificate.chain"] = self.ssl_certificate_file.read_text()
                props["ssl.keystore.key"] = self.ssl_key_file.read_text()
            if self.ssl_key_password is not None:
                props["ssl.key.password"] = self.ssl_key_password.get_secret_value()
            props["ssl.endpoint.identification.algorithm"] = (
                "https" if self.ssl_endpoint_identification else ""
            )
        return props


KafkaSecurity: type[SecurityRules] = create_model(
    "KafkaSecurity", __base__=SecurityRules, **security_fields()
)
"""The block as fields of a settings object whose ``env_prefix`` names its variables."""


def shared_security(own_prefix: str, shared_prefix: str = "OUTBOX_") -> type[SecurityRules]:
    """The block read from ``<own_prefix>X`` first, then the shared ``OUTBOX_X``."""
    return create_model(
        "SharedKafkaSecurity",
        __base__=SecurityRules,
        **security_fields(own_prefix, shared_prefix),
    )
