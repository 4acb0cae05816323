"""The command line on a secure cluster: whole one-line errors, and the ACL list it prints."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from outbox.acls import producer_acls
from tests.security.conftest import GROUP, SecureTopics

pytestmark = pytest.mark.kafka


def outbox(*args: str, user: dict[str, object]) -> tuple[int, str]:
    """Run ``outbox ARGS`` with ``user``'s settings as its only ``OUTBOX_*`` variables."""
    env = {
        **{key: value for key, value in os.environ.items() if not key.startswith("OUTBOX_")},
        **{f"OUTBOX_{key.upper()}": str(value) for key, value in user.items()},
    }
    done = subprocess.run(
        [sys.executable, "-m", "outbox", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, done.stdout + done.stderr


def test_a_wrong_password_is_one_line_at_once(secure_topics: SecureTopics):
    user = {**secure_topics.user("admin-tool"), "sasl_password": "wrong-password"}
    code, output = outbox("topics", "describe", user=user)
    assert code == 1
    assert output.strip().splitlines() == [
        f"outbox: error: authentication failed for user '{secure_topics.names.prefix}-admin-tool'"
        f" with mechanism SCRAM-SHA-512 at {secure_topics.kafka.bootstrap}: check sasl_username"
        " and sasl_password (OUTBOX_SASL_USERNAME, OUTBOX_SASL_PASSWORD)"
    ]
    # (An unreachable cluster would say "cannot reach Kafka within 10s" instead.)


def test_a_missing_acl_names_operation_topic_and_user(secure_topics: SecureTopics):
    names = secure_topics.names
    user = secure_topics.user("nobody")
    code, output = outbox("topics", "describe", user=user)
    assert code == 1
    assert output.strip().splitlines() == [
        f"outbox: error: not authorised to DESCRIBE topic '{names.half}' as "
        f"User:{names.prefix}-nobody; grant it (`outbox acls print --producer-group GROUP`"
        " lists the ACLs each component needs)"
    ]


@pytest.mark.parametrize(
    "command", [("topics", "describe"), ("status",), ("discard", "list")], ids=" ".join
)
def test_admin_commands_log_in_with_flags_alone(
    secure_topics: SecureTopics, command: tuple[str, ...]
):
    kafka = secure_topics.kafka
    login = kafka.security.settings()
    flags = [
        f"--{name.replace('_', '-')}={value}" for name, value in login.items()
    ]  # --security-protocol, --sasl-mechanism, --sasl-username, --sasl-password, --ssl-ca-file
    code, output = outbox(
        *command,
        f"--bootstrap={kafka.bootstrap}",
        f"--prefix={secure_topics.names.prefix}",
        *flags,
        user={},
    )
    assert code == 0, output
    assert secure_topics.names.prefix in output  # the prefix given by flag
    assert str(login["sasl_password"]) not in output


def test_acls_print_lists_what_the_code_needs():
    done = subprocess.run(
        [sys.executable, "-m", "outbox", "acls", "print", "--group", GROUP, "-t", "orders.events"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["principal", "resource", "name", "pattern", "operations", "why"]
    from outbox.protocol import TopicNames

    for acl in producer_acls(TopicNames(), GROUP, ["orders.events"]):
        assert any(
            line.startswith("User:producer") and acl.name in line and acl.operation in line
            for line in lines
        ), acl


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("--component", "bogus"), 2, "unknown component(s) bogus; choose from producer"),
        (("--group", "bad/group"), 1, "producer group 'bad/group' has characters Kafka"),
        (("-t", "bad topic"), 1, "real topic 'bad topic' has characters Kafka does not allow"),
    ],
)
def test_acls_print_names_bad_input(args: tuple[str, ...], code: int, message: str):
    given = ("--group", GROUP, *args) if "--group" not in args else args
    done = subprocess.run(
        [sys.executable, "-m", "outbox", "acls", "print", *given],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "COLUMNS"},
    )
    assert done.returncode == code, done.stderr
    assert message in " ".join(done.stderr.split())
    assert "Traceback" not in done.stderr
