"""The pytest plugin users enable for their own tests gives them a real broker.

Run as a user would: a separate pytest session whose conftest names only
``outbox_devtools.testing``, with a test that sends through the outbox
producer to the plugin's broker and kills its own private one.
"""

from __future__ import annotations

import pytest

USER_TESTS = """
import uuid

from confluent_kafka.admin import AdminClient

from outbox.config import kafka_client_config
from outbox import LocalTransactionState, Message, ProducerSettings, TransactionProducer
from outbox.admin import TopicSpec, ensure_topics, plan_topics
from outbox.protocol import TopicNames


class Commit:
    def execute_local_transaction(self, message, arg):
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, message):
        return LocalTransactionState.COMMIT_MESSAGE


def test_send_on_the_shared_broker(kafka_broker):
    names = TopicNames(f"u{uuid.uuid4().hex[:8]}")
    admin = AdminClient(kafka_client_config(kafka_broker.bootstrap_servers))
    ensure_topics(admin, [*plan_topics(names, 1), TopicSpec("orders", 1, 1)])
    settings = ProducerSettings(
        bootstrap_servers=kafka_broker.bootstrap_servers, topic_prefix=names.prefix
    )
    with TransactionProducer("orders", Commit(), settings) as producer:
        result = producer.send_message_in_transaction(Message(topic="orders", value=b"x"))
    assert result.end_status.name == "COMMITTED"


def test_own_broker_can_be_killed(own_kafka_broker):
    own_kafka_broker.kill()
    assert not own_kafka_broker.is_running()
"""


@pytest.mark.kafka
def test_the_plugin_serves_a_users_test_session(pytester: pytest.Pytester) -> None:
    pytester.makeconftest('pytest_plugins = ["outbox_devtools.testing"]\n')
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=300)
    result.assert_outcomes(passed=2)
