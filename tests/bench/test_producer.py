"""``bench.producer``'s yardsticks on the test broker: the ``pair`` mode is the protocol's
floor only if each of its sends is two acknowledged writes, and ``plain`` one."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka.admin import AdminClient

from bench.producer import PairSender, PlainSender, parse_args
from outbox.admin import TopicSpec, ensure_topics
from outbox.config import kafka_client_config
from outbox.reading import read_topic

pytestmark = pytest.mark.kafka


@pytest.mark.parametrize(("sender", "writes"), [(PlainSender, 1), (PairSender, 2)])
def test_each_send_stores_its_writes_before_it_returns(
    kafka_bootstrap: str, sender: type[PlainSender], writes: int
) -> None:
    topic = f"bench-floor-{uuid.uuid4().hex[:8]}"
    ensure_topics(AdminClient(kafka_client_config(kafka_bootstrap)), [TopicSpec(topic, 1)])
    sending = sender(kafka_bootstrap, topic, b"v" * 16)
    try:
        for seq in range(3):
            sending.send(0, seq)
            # Acknowledged before the send returned: a reader already finds every write.
            stored = read_topic(kafka_client_config(kafka_bootstrap), topic, timeout=30)
            assert len(stored) == writes * (seq + 1)
    finally:
        sending.close()


def test_an_unknown_mode_is_refused_naming_the_modes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--modes", "pair,pairs"])
    error = capsys.readouterr().err
    assert "'pair,pairs'" in error
    assert "plain, pair, outbox, async" in error
