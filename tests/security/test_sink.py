"""The Spark sink as a least-privileged SCRAM user: it lands the committed events,
and its password appears nowhere in what it prints (Spark's and Kafka's logs included)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer

from outbox.acls import sink_acls
from outbox.config import kafka_client_config
from outbox.protocol import Header
from tests.security.conftest import GROUP, SecureTopics
from tests.spark_sink.test_cli import SPARK_FLAGS, outbox

pytestmark = pytest.mark.kafka


def publish_committed(topics: SecureTopics, count: int) -> None:
    """Records as the relay publishes them, in one Kafka transaction (as the admin)."""
    producer = Producer(
        kafka_client_config(
            topics.kafka.bootstrap,
            {
                **topics.kafka.security.client_config(),
                "transactional.id": f"test-{uuid.uuid4().hex}",
            },
        )
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(count):
        headers = [
            (Header.TRANSACTION_ID.value, f"tx-{i}".encode()),
            (Header.PRODUCER_GROUP.value, GROUP.encode()),
        ]
        producer.produce(topics.real_topic, value=f"v{i}".encode(), headers=headers)
    producer.commit_transaction(30)


def run_sink(topics: SecureTopics, user: dict[str, object], tmp_path: Path, *extra: str):
    """``outbox sink --once`` as ``user``, its login in the shared ``OUTBOX_*`` variables."""
    env = {
        **os.environ,
        "OUTBOX_BOOTSTRAP_SERVERS": str(user["bootstrap_servers"]),
        "OUTBOX_SECURITY_PROTOCOL": "SASL_SSL",
        "OUTBOX_SASL_USERNAME": str(user["sasl_username"]),
        "OUTBOX_SASL_PASSWORD": str(user["sasl_password"]),
        "OUTBOX_SSL_CA_FILE": str(user["ssl_ca_file"]),
    }
    return outbox(
        "sink",
        "--topics",
        topics.real_topic,
        "--prefix",
        topics.names.prefix,
        "--output",
        str(tmp_path / "table"),
        "--checkpoint",
        str(tmp_path / "checkpoint"),
        "--shuffle-partitions",
        "2",
        "--once",
        *extra,
        *SPARK_FLAGS,
        env=env,
    )


def test_the_sink_lands_rows_as_its_own_user_and_never_prints_its_password(
    secure_topics: SecureTopics, tmp_path: Path
):
    publish_committed(secure_topics, 2)
    user = secure_topics.user("sink", sink_acls([secure_topics.real_topic]))
    result = run_sink(secure_topics, user, tmp_path, "--log-level", "INFO")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rows_in=2 written=2 duplicates=0" in result.stdout.splitlines()[-1]
    assert str(user["sasl_password"]) not in result.stdout + result.stderr


@pytest.mark.parametrize("case", ["wrong password", "no DESCRIBE on its topic"])
def test_the_sink_refused_is_one_line_naming_why(
    secure_topics: SecureTopics, tmp_path: Path, case: str
):
    topic = secure_topics.real_topic
    acls = [a for a in sink_acls([topic]) if case != "no DESCRIBE on its topic"]
    user = secure_topics.user("sink", acls)
    name = user["sasl_username"]
    if case == "wrong password":
        user = {**user, "sasl_password": "not-the-password"}
        expected = f"outbox: error: authentication failed for user '{name}' with mechanism"
    else:
        expected = (
            f"outbox: error: not authorised to DESCRIBE topic '{topic}' as User:{name}; grant it"
        )
    result = run_sink(secure_topics, user, tmp_path)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("outbox: error:")]
    assert len(errors) == 1 and errors[0].startswith(expected), result.stderr[-3000:]
    assert "not-the-password" not in result.stderr
