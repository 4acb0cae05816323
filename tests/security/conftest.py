"""A SASL_SSL broker with ACLs enforced, and one least-privileged SCRAM user per component.

The broker is started once, by the first test that asks for it; each test makes
its own topics and users (a unique prefix), grants exactly what
:mod:`outbox.acls` lists, and runs the component as that user.
"""

from __future__ import annotations

import logging
import secrets
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from outbox.access import connect
from outbox.acls import Acl, acl_bindings
from outbox.admin import TopicSpec, ensure_topics, plan_topics
from outbox.errors import ConnectionSecurityError
from outbox.protocol import TopicNames
from outbox.security import KafkaSecurity, SecurityRules
from outbox_devtools.kafka import LocalKafka
from outbox_devtools.secure_kafka import BrokerSecurity

HALF_PARTITIONS = 2
GROUP = "orders"


@dataclass
class SecureKafka:
    """The secure broker and its admin."""

    broker: LocalKafka
    security: BrokerSecurity
    admin: AdminClient

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap_servers

    @property
    def ca_file(self) -> Path:
        return self.security.ca_file

    def grant(self, user: str, acls: Sequence[Acl]) -> None:
        if acls:
            for future in self.admin.create_acls(acl_bindings(f"User:{user}", acls)).values():
                future.result(30)

    def add_user(self, name: str, acls: Sequence[Acl] = ()) -> dict[str, Any]:
        """A SCRAM user granted exactly ``acls``; the security settings to log in as it."""
        password = secrets.token_urlsafe(12)
        upsert = UserScramCredentialUpsertion(
            name, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), password.encode()
        )
        for future in self.admin.alter_user_scram_credentials([upsert]).values():
            future.result(30)
        login = self.security.settings(name, password)
        self._wait_until_known(KafkaSecurity(**login))
        self.grant(name, acls)
        return {"bootstrap_servers": self.bootstrap, **login}

    def _wait_until_known(self, login: SecurityRules) -> None:
        """The controller has stored a new user before the broker's authenticator knows it:
        a login at once may be refused."""
        config = {"bootstrap.servers": self.bootstrap, **login.librdkafka()}
        deadline = time.monotonic() + 15
        while True:
            try:
                connect(config, login, self.bootstrap, 10)
                return
            except ConnectionSecurityError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


@pytest.fixture(scope="session")
def secure_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    security = BrokerSecurity()
    broker = LocalKafka(tmp_path_factory.mktemp("secure-kafka"), security=security)
    with broker:
        # Through logging, so it says nothing once the broker has stopped.
        admin = AdminClient(
            {
                "bootstrap.servers": broker.bootstrap_servers,
                **security.client_config(),
                "logger": logging.getLogger("tests.security.admin"),
            }
        )
        yield SecureKafka(broker, security, admin)


@dataclass
class SecureTopics:
    """One test's outbox topics and real topic on the secure broker."""

    kafka: SecureKafka
    names: TopicNames
    real_topic: str

    def user(self, role: str, acls: Sequence[Acl] = ()) -> dict[str, Any]:
        """A user of this test (``<prefix>-<role>``) with ``acls``; its settings fields."""
        return {
            **self.kafka.add_user(f"{self.names.prefix}-{role}", acls),
            "topic_prefix": self.names.prefix,
        }


@pytest.fixture
def secure_topics(secure_kafka: SecureKafka) -> SecureTopics:
    prefix = f"s{uuid.uuid4().hex[:8]}"
    names = TopicNames(prefix)
    real_topic = f"{prefix}-events"
    ensure_topics(
        secure_kafka.admin,
        [
            *plan_topics(names, HALF_PARTITIONS, producer_groups=(GROUP,)),
            TopicSpec(real_topic, 1, 1),
        ],
    )
    return SecureTopics(secure_kafka, names, real_topic)
