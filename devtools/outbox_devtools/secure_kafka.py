"""A local broker as a security team would run it: SASL_SSL, SCRAM-SHA-512, ACLs enforced.

:class:`BrokerSecurity` is what a :class:`~outbox_devtools.kafka.LocalKafka`
node adds to become one: a certificate authority and a server certificate for
``127.0.0.1``/``localhost`` made with ``openssl`` at first start (PEM, which
both the broker and the clients read), a ``SASL_SSL`` client listener that is
also the inter-broker listener, Kafka's ``StandardAuthorizer`` with
``allow.everyone.if.no.acl.found=false``, and an admin super user whose SCRAM
credentials are written into the metadata when the storage is formatted (the
broker cannot create the first user for itself: creating users needs a user).

The controller listener stays PLAINTEXT on loopback. SCRAM cannot authenticate
a KRaft controller listener (its credentials live in the very metadata the
controller serves), so the broker reaches its controller as ``User:ANONYMOUS``,
which must then be a super user for the controller to accept the broker's
registration and heartbeats. That is fine for one process on loopback; a real
cluster puts the controllers behind mutual TLS and names the brokers'
certificate principals as super users instead.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from outbox.security import SaslMechanism

MECHANISM: SaslMechanism = "SCRAM-SHA-512"
LISTENER = "SASL_SSL"
ADMIN_USER = "admin"
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
_SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"
_CERT_DAYS = "30"


class CertificateError(RuntimeError):
    """openssl could not make the local certificates; the message has its output."""


def _openssl(*args: str) -> None:
    if shutil.which("openssl") is None:
        raise CertificateError(
            "the secure broker makes its certificates with openssl, which is not on PATH:"
            " install it (Debian: apt-get install openssl)"
        )
    result = subprocess.run(
        ["openssl", *args], capture_output=True, text=True, timeout=60, check=False
    )
    if result.returncode != 0:
        raise CertificateError(f"openssl {args[0]} failed: {result.stderr.strip()}")


def make_certificates(directory: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")) -> None:
    """A CA (``ca.pem``) and a server certificate it signed for ``hosts``; kept once made.

    ``server-keystore.pem`` is the server's unencrypted PKCS#8 key followed by
    its certificate: the one-file PEM key store the broker reads.
    """
    keystore = directory / "server-keystore.pem"
    if keystore.is_file():
        return
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca, key, request, cert = (
        directory / name for name in ("ca.key", "ca.pem", "server.key", "server.csr", "server.pem")
    )
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", _CERT_DAYS,
        "-keyout", str(ca_key), "-out", str(ca), "-subj", "/CN=outbox local CA",
    )  # fmt: skip
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(request),
        "-subj", "/CN=localhost",
    )  # fmt: skip
    names = ",".join(f"IP:{h}" if h[0].isdigit() else f"DNS:{h}" for h in hosts)
    extensions = directory / "server.ext"
    extensions.write_text(f"subjectAltName={names}\n")
    _openssl(
        "x509", "-req", "-in", str(request), "-CA", str(ca), "-CAkey", str(ca_key),
        "-CAcreateserial", "-out", str(cert), "-days", _CERT_DAYS, "-extfile", str(extensions),
    )  # fmt: skip
    keystore.write_text(key.read_text() + cert.read_text())


def _jaas(user: str, password: str) -> str:
    return f'{_SCRAM_MODULE} required username="{user}" password="{password}";'


@dataclass
class BrokerSecurity:
    """The security a local node runs with; ``admin_password`` is new for each object."""

    admin_password: str = field(default_factory=lambda: secrets.token_urlsafe(18), repr=False)
    tls_dir: Path | None = None
    """Where the certificates go; the node's ``work_dir/tls`` when not given."""

    @property
    def ca_file(self) -> Path:
        assert self.tls_dir is not None, "prepare() first"
        return self.tls_dir / "ca.pem"

    def prepare(self, work_dir: Path) -> None:
        """Certificates, made on the first start (a restart keeps those the clients trust)."""
        if self.tls_dir is None:
            self.tls_dir = work_dir / "tls"
        make_certificates(self.tls_dir)

    def node_properties(self, address: str, controller: str) -> dict[str, str]:
        """Listener, SASL, TLS and authoriser properties of a node serving ``address``."""
        assert self.tls_dir is not None, "prepare() first"
        prefix = f"listener.name.{LISTENER.lower()}"
        return {
            "listeners": f"{LISTENER}://{address},CONTROLLER://{controller}",
            "advertised.listeners": f"{LISTENER}://{address},CONTROLLER://{controller}",
            "inter.broker.listener.name": LISTENER,
            "listener.security.protocol.map": f"{LISTENER}:SASL_SSL,CONTROLLER:PLAINTEXT",
            "sasl.enabled.mechanisms": MECHANISM,
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            f"{prefix}.{MECHANISM.lower()}.sasl.jaas.config": _jaas(
                ADMIN_USER, self.admin_password
            ),
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.tls_dir / "server-keystore.pem"),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_file),
            "authorizer.class.name": AUTHORIZER,
            "allow.everyone.if.no.acl.found": "false",
            # ANONYMOUS: the broker at its PLAINTEXT controller listener (module docstring).
            "super.users": f"User:{ADMIN_USER};User:ANONYMOUS",
        }

    def format_arguments(self) -> list[str]:
        """StorageTool arguments that write the admin's SCRAM credentials into the metadata."""
        return [f"--add-scram={MECHANISM}=[name={ADMIN_USER},password={self.admin_password}]"]

    def settings(self, user: str = ADMIN_USER, password: str | None = None) -> dict[str, Any]:
        """Security fields of the outbox's settings for ``user`` (default: the admin)."""
        return {
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": MECHANISM,
            "sasl_username": user,
            "sasl_password": self.admin_password if password is None else password,
            "ssl_ca_file": self.ca_file,
        }

    def write_admin_files(self, directory: Path) -> tuple[Path, Path]:
        """The admin's login as ``OUTBOX_*`` variables (``admin.env``, to ``source``) and as
        Java client properties (``admin.properties``, for ``kafka-acls.sh --command-config``);
        readable by the owner only, since they hold the password."""
        from outbox.security import KafkaSecurity

        settings = self.settings()
        env = directory / "admin.env"
        properties = directory / "admin.properties"
        for path in (env, properties):
            path.touch(mode=0o600, exist_ok=True)
            path.chmod(0o600)
        env.write_text(
            "".join(f"export OUTBOX_{name.upper()}='{value}'\n" for name, value in settings.items())
        )
        java = KafkaSecurity(**settings).java()
        properties.write_text("".join(f"{key}={value}\n" for key, value in java.items()))
        return env, properties

    def client_config(self, user: str = ADMIN_USER, password: str | None = None) -> dict[str, str]:
        """librdkafka properties for ``user`` (default: the admin)."""
        from outbox.security import KafkaSecurity

        return KafkaSecurity(**self.settings(user, password)).librdkafka()
