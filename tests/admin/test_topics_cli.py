"""``outbox topics`` run as a user runs it: the installed console script, a real broker."""

import subprocess
import sys
import time

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from outbox.admin import read_topic_states
from outbox.config import kafka_client_config
from outbox.protocol import TopicNames
from outbox.reading import read_topic

pytestmark = pytest.mark.kafka


def outbox(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "outbox", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_create_then_describe(kafka_bootstrap, unique_prefix):
    created = outbox(
        "topics", "create", "--partitions", "2", "--prefix", unique_prefix,
        "--bootstrap", kafka_bootstrap, "--group", "shop",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    assert created.stdout.count("created") == 4
    again = outbox(
        "topics", "create", "-p", "2", "--prefix", unique_prefix, "--bootstrap", kafka_bootstrap
    )
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("exists") == 3
    described = outbox(
        "topics", "describe", "--prefix", unique_prefix, "--bootstrap", kafka_bootstrap
    )
    assert described.returncode == 0, described.stderr
    for name in TopicNames(unique_prefix).fixed:
        assert name in described.stdout


def test_describe_missing_topics_exits_1(kafka_bootstrap, unique_prefix):
    described = outbox(
        "topics", "describe", "--prefix", unique_prefix, "--bootstrap", kafka_bootstrap
    )
    assert described.returncode == 1
    assert "missing" in described.stdout


def test_mismatch_is_a_one_line_error(kafka_bootstrap, unique_prefix):
    args = ("topics", "create", "--prefix", unique_prefix, "--bootstrap", kafka_bootstrap)
    assert outbox(*args, "-p", "3").returncode == 0
    mismatch = outbox(*args, "-p", "6")
    assert mismatch.returncode == 1
    assert "has 3 partitions, 6 requested" in mismatch.stderr
    assert "Traceback" not in mismatch.stderr


def test_more_replicas_than_brokers_is_a_one_line_error(kafka_bootstrap, unique_prefix):
    args = ("topics", "create", "--prefix", unique_prefix, "--bootstrap", kafka_bootstrap)
    refused = outbox(*args, "-p", "1", "-r", "2")
    assert refused.returncode == 1
    assert "replication factor 2 needs at least 2 brokers, but the cluster has 1" in refused.stderr
    assert "Traceback" not in refused.stderr
    created = outbox(*args, "-p", "1")
    assert created.returncode == 0, created.stderr
    assert "min.insync" in created.stdout


def test_unreachable_broker_fails_after_its_connect_timeout():
    """One error naming the address and the 10 s it was tried for: given up, not retried
    until the helper's own 120 s ran out."""
    result = outbox("topics", "describe", "--bootstrap", "127.0.0.1:1")
    assert result.returncode == 1
    assert "cannot reach Kafka at 127.0.0.1:1 within 10s" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args,message",
    [
        (("--bootstrap", "no-port-here"), "expected host:port"),
        (("--bootstrap", "127.0.0.1:1", "--prefix", "bad/prefix"), "topic prefix"),
        (("--bootstrap", "127.0.0.1:1", "-X", "novalue"), "not KEY=VALUE"),
        (("--bootstrap", "127.0.0.1:1", "-X", "{broken json"), "not valid JSON"),
    ],
)
def test_bad_options_name_the_problem(args, message):
    result = outbox("topics", "create", *args)
    assert result.returncode == 1
    assert message in result.stderr


def test_bad_partition_count_is_a_usage_error():
    result = outbox("topics", "create", "--bootstrap", "127.0.0.1:1", "--partitions", "0")
    assert result.returncode == 2
    assert "--partitions" in result.stderr


def test_no_bootstrap_anywhere_says_how_to_get_one(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "OUTBOX_DEV_HOME": str(tmp_path), "HOME": str(tmp_path)}
    result = outbox("topics", "describe", env=env)
    assert result.returncode == 1
    assert "outbox dev kafka start" in result.stderr


def test_describe_flags_half_and_op_disagreeing(kafka_bootstrap, kafka_admin, unique_prefix):
    from confluent_kafka.admin import NewTopic

    topics = TopicNames(unique_prefix)
    futures = kafka_admin.create_topics([NewTopic(topics.half, 2, 1), NewTopic(topics.op, 3, 1)])
    for future in futures.values():
        future.result(30)
    result = outbox("topics", "describe", "--prefix", unique_prefix, "--bootstrap", kafka_bootstrap)
    assert result.returncode == 1
    assert f"{topics.half} has 2 partitions but {topics.op} has 3" in result.stderr


def test_created_topics_are_stamped_by_the_broker(kafka_bootstrap, kafka_admin, unique_prefix):
    """The checker's ages come from record timestamps: the producer's clock must not set them."""
    names = TopicNames(unique_prefix)
    created = outbox(
        "topics", "create", "-p", "1", "--prefix", unique_prefix,
        "--bootstrap", kafka_bootstrap, "--group", "shop",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    topics = [*names.fixed, names.check("shop")]
    states = read_topic_states(kafka_admin, topics)
    assert {s.config.get("message.timestamp.type") for s in states.values()} == {"LogAppendTime"}
    producer = Producer(kafka_client_config(kafka_bootstrap))
    producer.produce(names.half, b"v", timestamp=1_000)  # a producer clock in 1970
    assert producer.flush(30) == 0
    (record,) = read_topic(kafka_client_config(kafka_bootstrap), names.half, timeout=30)
    assert abs(record.timestamp_ms - time.time() * 1000) < 600_000


def test_existing_topic_stamped_by_producers_is_accepted_with_a_warning(
    kafka_bootstrap, kafka_admin, unique_prefix
):
    names = TopicNames(unique_prefix)
    old = NewTopic(names.half, 1, 1, config={"message.timestamp.type": "CreateTime"})
    kafka_admin.create_topics([old])[names.half].result(30)
    created = outbox(
        "topics", "create", "-p", "1", "--prefix", unique_prefix, "--bootstrap", kafka_bootstrap
    )
    assert created.returncode == 0, created.stderr
    assert f"topic {names.half} has message.timestamp.type=CreateTime" in created.stderr
    assert f"--entity-name {names.half}" in created.stderr
    assert "--add-config message.timestamp.type=LogAppendTime" in created.stderr
    assert names.op not in created.stderr


def test_create_makes_the_real_topics_named_and_keeps_an_existing_one(
    kafka_bootstrap, kafka_admin, unique_prefix
):
    kept = f"{unique_prefix}-kept"
    kafka_admin.create_topics([NewTopic(kept, 1, 1)])[kept].result(timeout=30)
    orders = f"{unique_prefix}-orders"
    args = ("topics", "create", "-p", "3", "--prefix", unique_prefix, "--bootstrap")
    created = outbox(*args, kafka_bootstrap, "--topic", orders, "-t", kept)
    assert created.returncode == 0, created.stderr
    states = read_topic_states(kafka_admin, [orders, kept])
    assert (states[orders].partitions, states[kept].partitions) == (3, 1)


@pytest.mark.parametrize(
    "topic,message",
    [
        ("bad topic", "real topic 'bad topic'"),
        ("outbox.half", "real topic 'outbox.half' is one of the outbox's own topics"),
    ],
)
def test_a_real_topic_kafka_could_not_have_is_named(topic, message):
    result = outbox("topics", "create", "--bootstrap", "127.0.0.1:1", "--topic", topic)
    assert result.returncode == 1
    assert message in result.stderr
    assert "Traceback" not in result.stderr
