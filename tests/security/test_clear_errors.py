"""One clear line for each way a secure cluster says no, never a hang or a stack trace.

A wrong password and an untrusted certificate end the start at once naming what
to check; a missing ACL names the operation, the resource and the principal.
Each case removes one ACL from the component's list in ``outbox.acls`` (which
also shows that the list holds nothing that is not needed there).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from outbox import (
    HalfWriteError,
    LocalTransactionState,
    Message,
    ProducerSettings,
    TransactionProducer,
)
from outbox.acls import Acl, checker_acls, producer_acls
from outbox.config import kafka_client_config
from outbox.errors import ConnectionSecurityError, NotAuthorizedError
from outbox.reading import read_topic
from outbox_checker.service import Checker
from outbox_checker.settings import CheckerSettings
from tests.producer.conftest import ScriptedListener
from tests.security.conftest import GROUP, SecureTopics

pytestmark = pytest.mark.kafka


def without(acls: list[Acl], resource: str, operation: str, kind: str = "TOPIC") -> list[Acl]:
    kept = [
        a
        for a in acls
        if not (a.name == resource and a.operation == operation and a.resource_type == kind)
    ]
    assert len(kept) == len(acls) - 1, f"no {operation} on {resource} in the list"
    return kept


def producer(settings: dict[str, object]) -> TransactionProducer:
    config = ProducerSettings(**settings, start_timeout_seconds=600)
    return TransactionProducer(GROUP, ScriptedListener(), config)


def test_a_wrong_password_names_the_user_and_mechanism_at_once(secure_topics: SecureTopics):
    settings = {**secure_topics.user("producer"), "sasl_password": "not-the-password"}
    began = time.monotonic()
    with pytest.raises(ConnectionSecurityError) as caught:
        producer(settings).start()
    assert time.monotonic() - began < 300  # not the start timeout (600 s)
    message = str(caught.value)
    assert f"authentication failed for user '{secure_topics.names.prefix}-producer'" in message
    assert "SCRAM-SHA-512" in message
    assert "not-the-password" not in message


def test_an_untrusted_certificate_says_to_check_the_ca_file(
    secure_topics: SecureTopics, tmp_path: Path
):
    other_ca = tmp_path / "other-ca.pem"
    other_ca.write_text(Path("/etc/ssl/certs/ca-certificates.crt").read_text())
    settings = {**secure_topics.user("producer"), "ssl_ca_file": other_ca}
    with pytest.raises(ConnectionSecurityError, match="certificate is not trusted") as caught:
        producer(settings).start()
    assert str(other_ca) in str(caught.value)
    assert "check the CA file" in str(caught.value)


def test_a_producer_without_describe_configs_on_the_half_topic_fails_its_start(
    secure_topics: SecureTopics,
):
    names = secure_topics.names
    acls = producer_acls(names, GROUP, [secure_topics.real_topic])
    settings = secure_topics.user("producer", without(acls, names.half, "DESCRIBE_CONFIGS"))
    with pytest.raises(NotAuthorizedError) as caught:
        producer(settings).start()
    assert str(caught.value).startswith(
        f"not authorised to DESCRIBE_CONFIGS topic '{names.half}' as "
        f"User:{names.prefix}-producer; grant it"
    )


def test_a_producer_without_write_on_the_half_topic_fails_the_send(
    secure_topics: SecureTopics,
):
    names = secure_topics.names
    acls = producer_acls(names, GROUP, [secure_topics.real_topic])
    settings = secure_topics.user("producer", without(acls, names.half, "WRITE"))
    with producer(settings).start() as started, pytest.raises(HalfWriteError) as caught:
        started.send_message_in_transaction(
            Message(secure_topics.real_topic, b"v"), LocalTransactionState.COMMIT_MESSAGE
        )
    assert f"not authorised to WRITE topic '{names.half}' as User:{names.prefix}-producer" in str(
        caught.value
    )


@pytest.mark.parametrize("missing", ["DESCRIBE", "DESCRIBE_CONFIGS"])
def test_a_producer_sending_to_a_topic_it_may_not_describe_is_told_so_not_to_create_it(
    secure_topics: SecureTopics, missing: str
):
    """Not "create it first", nor a size limit guessed in place of the topic's."""
    names, real = secure_topics.names, secure_topics.real_topic
    settings = secure_topics.user(
        "producer", without(producer_acls(names, GROUP, [real]), real, missing)
    )
    with producer(settings).start() as started, pytest.raises(NotAuthorizedError) as caught:
        started.send_message_in_transaction(
            Message(real, b"v"), LocalTransactionState.COMMIT_MESSAGE
        )
    assert str(caught.value).startswith(
        f"not authorised to {missing} topic '{real}' as User:{names.prefix}-producer"
    )


def test_a_checker_without_its_consumer_group_fails_instead_of_waiting(
    secure_topics: SecureTopics,
):
    names = secure_topics.names
    acls = checker_acls(names, [secure_topics.real_topic])
    group = f"{names.prefix}.checker"
    settings = secure_topics.user("checker", without(acls, group, "READ", "GROUP"))
    checker = Checker(CheckerSettings(**settings, http_address=""))
    try:
        with pytest.raises(NotAuthorizedError) as caught:
            deadline = time.monotonic() + 120  # only for a refusal that never comes
            while time.monotonic() < deadline:
                checker.poll_membership(0.2)
    finally:
        checker.close()
    assert str(caught.value).startswith(
        f"not authorised to READ group '{group}' as User:{names.prefix}-checker"
    )


def test_a_producer_without_its_check_back_group_fails_its_start(secure_topics: SecureTopics):
    names = secure_topics.names
    acls = producer_acls(names, GROUP, [secure_topics.real_topic])
    settings = secure_topics.user("producer", without(acls, names.check(GROUP), "READ", "GROUP"))
    with pytest.raises(NotAuthorizedError) as caught:
        producer(settings).start()
    assert str(caught.value).startswith(
        f"not authorised to READ group '{names.check(GROUP)}' as User:{names.prefix}-producer;"
        " grant it"
    )


def test_a_producer_that_may_describe_but_not_read_its_group_logs_one_error_naming_it(
    secure_topics: SecureTopics, caplog: pytest.LogCaptureFixture
):
    """Only joining the group needs READ, and that happens in the background: the start
    sees DESCRIBE (what fetching the group's offsets needs) and carries on."""
    names = secure_topics.names
    group = names.check(GROUP)
    acls = without(producer_acls(names, GROUP, [secure_topics.real_topic]), group, "READ", "GROUP")
    settings = secure_topics.user(
        "producer", [*acls, Acl("GROUP", group, "LITERAL", "DESCRIBE", "test")]
    )
    expected = (
        f"no check-back can be answered: not authorised to READ group '{group}' as "
        f"User:{names.prefix}-producer"
    )
    with caplog.at_level(logging.ERROR, logger="outbox"), producer(settings).start():
        deadline = time.monotonic() + 120  # the error never logged
        while expected not in caplog.text:
            assert time.monotonic() < deadline, caplog.text
            time.sleep(0.1)
        time.sleep(1)  # librdkafka keeps reporting it: still one line
    assert caplog.text.count(expected) == 1


def relay_once(
    secure_topics: SecureTopics, checker_user: dict[str, object], until: Callable[[], bool]
) -> None:
    """A committed message sent, then the relay run as ``checker_user`` until ``until()``."""
    real = secure_topics.real_topic
    producer_user = secure_topics.user(
        "producer", producer_acls(secure_topics.names, GROUP, [real])
    )
    checker = Checker(CheckerSettings(**checker_user, http_address=""))
    try:
        with producer(producer_user).start() as sender:
            sender.send_message_in_transaction(
                Message(real, b"v"), LocalTransactionState.COMMIT_MESSAGE
            )
        assert checker.start_relay() is not None
        deadline = time.monotonic() + 120
        while not until():
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.2)
    finally:
        checker.close()


# DESCRIBE alone is no case: Kafka's authoriser lets WRITE imply DESCRIBE.
@pytest.mark.parametrize(
    "missing",
    [("WRITE",), ("WRITE", "DESCRIBE"), ("DESCRIBE_CONFIGS",)],
    ids=["write", "write-and-describe", "describe-configs"],
)
def test_a_relay_refused_on_the_real_topic_says_so_keeps_the_record_and_resumes_once_granted(
    secure_topics: SecureTopics, caplog: pytest.LogCaptureFixture, missing: tuple[str, ...]
):
    names, real = secure_topics.names, secure_topics.real_topic
    refused = {
        "WRITE": f"WRITE topic {real!r}",
        "DESCRIBE": f"DESCRIBE topic {real!r}",
        "DESCRIBE_CONFIGS": f"DESCRIBE_CONFIGS topic {real!r}",
    }[missing[-1]]
    acls = checker_acls(names, [real])
    granted = acls
    for operation in missing:
        granted = without(granted, real, operation)
    checker_user = secure_topics.user("checker", granted)
    # The first attempt may fail before the refusal comes back (then a warning): any backoff.
    expected = re.compile(
        r"ERROR .* relay batch refused, reading it again in [\d.]+s: "
        + re.escape(f"not authorised to {refused} as User:{names.prefix}-checker; grant it")
    )
    admin = kafka_client_config(
        secure_topics.kafka.bootstrap, secure_topics.kafka.security.client_config()
    )

    granted_later = [a for a in acls if a not in granted]
    refusal_seen = False

    def published_once_granted() -> bool:
        nonlocal refusal_seen
        if not refusal_seen and expected.search(caplog.text):
            refusal_seen = True
            secure_topics.kafka.grant(f"{names.prefix}-checker", granted_later)
        return refusal_seen and bool(read_topic(admin, real))

    with caplog.at_level(logging.WARNING, logger="outbox_checker"):
        relay_once(secure_topics, checker_user, published_once_granted)
    assert len(read_topic(admin, real)) == 1
    assert read_topic(admin, names.discard) == []  # refused is not "does not exist"


def test_plaintext_against_a_tls_listener_says_to_check_the_protocol(
    secure_topics: SecureTopics,
):
    settings = {"bootstrap_servers": secure_topics.kafka.bootstrap, "topic_prefix": "x"}
    began = time.monotonic()
    with pytest.raises(ConnectionSecurityError) as caught:
        producer(settings).start()
    assert time.monotonic() - began < 300  # not the start timeout (600 s)
    assert "does not speak security protocol PLAINTEXT" in str(caught.value)
