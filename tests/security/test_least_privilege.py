"""Each component as its own SCRAM user over TLS, granted exactly what ``outbox.acls`` lists.

The producer sends a transaction it cannot decide, the checker (as another
user) asks it, the producer answers, and the relay publishes the commit to the
real topic: the whole protocol under ``allow.everyone.if.no.acl.found=false``.
"""

from __future__ import annotations

import time

import pytest

from outbox import LocalTransactionState, Message, ProducerSettings, TransactionProducer
from outbox.acls import checker_acls, producer_acls
from outbox.config import kafka_client_config
from outbox.protocol import RealRecord
from outbox.reading import read_topic
from outbox_checker.service import Checker
from outbox_checker.settings import CheckerSettings
from tests.checker.support import SkewedClock, wait_for
from tests.producer.conftest import ScriptedListener
from tests.security.conftest import GROUP, HALF_PARTITIONS, SecureTopics

pytestmark = pytest.mark.kafka


def test_producer_and_checker_with_exactly_their_acls_resolve_and_publish(
    secure_topics: SecureTopics,
):
    names, real = secure_topics.names, secure_topics.real_topic
    producer_user = secure_topics.user("producer", producer_acls(names, GROUP, [real]))
    checker_user = secure_topics.user("checker", checker_acls(names, [real]))
    listener = ScriptedListener(LocalTransactionState.COMMIT_MESSAGE)
    producer = TransactionProducer(GROUP, listener, ProducerSettings(**producer_user)).start()
    clock = SkewedClock()
    checker = Checker(CheckerSettings(**checker_user, http_address=""), clock=clock)
    try:
        sent = producer.send_message_in_transaction(
            Message(real, b"v"), LocalTransactionState.UNKNOW
        )
        deadline = time.monotonic() + 60
        while len(checker.owned_partitions()) < HALF_PARTITIONS:
            assert time.monotonic() < deadline, "checker got no partitions"
            checker.poll_membership(0.2)
        relay = checker.start_relay()
        assert relay is not None
        clock.skew = 60
        assert checker.run_round().checks_sent == 1
        wait_for(lambda: listener.check_called.is_set(), what="the check-back")

        def published() -> list[str]:
            client = kafka_client_config(
                secure_topics.kafka.bootstrap, secure_topics.kafka.security.client_config()
            )
            return [RealRecord.from_record(r).transaction_id for r in read_topic(client, real)]

        wait_for(lambda: published() == [sent.transaction_id], what="the relay")
    finally:
        checker.close()
        producer.shutdown()
