"""``outbox discard resume`` of a committed half the relay could not publish, on a real broker.

The scenario of issue 39: the real topic's ``max.message.bytes`` is lowered below a
committed event before the relay runs, so the relay discards it as unpublishable; the
operator raises the limit and resumes. The record must then reach its real topic exactly
once (read_committed), however often and from however many shells the resume runs, and
after op retention deleted the ops; while it still does not fit, the resume refuses in one
line naming the transaction and the cause, and publishes nothing.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from outbox.config import KafkaSettings
from outbox.protocol import DiscardReason, OpRecord, RealRecord, Resolution
from outbox_checker.discard import read_discards, resume_discards
from outbox_checker.errors import ResumeFencedError
from tests.checker.support import now_ms, pending_half, wait_for, write
from tests.fixtures.kafka import set_topic_config
from tests.fixtures.relay import running_relay
from tests.producer.conftest import OutboxTopics

pytestmark = pytest.mark.kafka

VALUE = b"x" * 60_000
SMALL_LIMIT = "20000"
ROOMY_LIMIT = "1048588"


def settings_of(t: OutboxTopics) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers=t.bootstrap, topic_prefix=t.names.prefix)


def published(t: OutboxTopics) -> list[RealRecord]:
    """The real topic as a downstream consumer sees it (read_committed)."""
    return [RealRecord.from_record(raw) for raw in t.read(t.real_topic)]


def resume(t: OutboxTopics, *transaction_ids: str):
    return resume_discards(settings_of(t), list(transaction_ids) or None, now_ms=now_ms)


@pytest.fixture
def unpublishable(outbox_topics: OutboxTopics, kafka_admin: AdminClient) -> str:
    """A committed 60 KB event the relay discarded: its topic's limit was lowered to 20 000."""
    t = outbox_topics
    set_topic_config(kafka_admin, t.real_topic, "max.message.bytes", SMALL_LIMIT)
    half = pending_half(t, "big", value=VALUE)
    ((_, offset),) = write(t, half.to_record(t.names, 0))
    op = OpRecord(half.transaction_id, half.producer_group, 0, offset, Resolution.COMMIT, now_ms())
    write(t, op.to_record(t.names))
    with running_relay(t.client_config, t.names):
        wait_for(lambda: bool(t.read(t.names.discard)), what="the relay's discard")
    (discard,) = read_discards(t.client_config, t.names)
    assert discard.record is not None and discard.record.reason is DiscardReason.UNPUBLISHABLE
    assert published(t) == []
    return half.transaction_id


def raise_limit(t: OutboxTopics, admin: AdminClient) -> None:
    set_topic_config(admin, t.real_topic, "max.message.bytes", ROOMY_LIMIT)


def test_once_its_topic_takes_it_a_resume_publishes_it_once(
    outbox_topics: OutboxTopics, kafka_admin: AdminClient, unpublishable: str
):
    t = outbox_topics
    raise_limit(t, kafka_admin)
    outcome = resume(t)  # --all
    ((resumed,), refused) = (outcome.resumed, outcome.refused)
    assert refused == []
    (record,) = published(t)
    assert (record.transaction_id, record.value, record.producer_group) == (
        unpublishable,
        VALUE,
        "orders",
    )
    marker = resumed.marker.published
    assert marker is not None
    assert (marker.topic, marker.partition, marker.offset) == (
        t.real_topic,
        record.partition,
        record.offset,
    )
    assert t.read(t.names.half) and len(t.read(t.names.half)) == 1  # nothing put back

    again = resume(t, unpublishable)
    assert again.resumed == [] and [d.transaction_id for d in again.already] == [unpublishable]
    assert resume(t).resumed == []
    assert len(published(t)) == 1
    (listed,) = read_discards(t.client_config, t.names)
    assert listed.resumed is not None and listed.resumed.published == marker


def test_after_op_retention_deleted_its_ops_it_is_still_published_once(
    outbox_topics: OutboxTopics, kafka_admin: AdminClient, unpublishable: str
):
    """The resume's memory is its marker on the discard topic, not the op history."""
    t = outbox_topics
    for future in kafka_admin.delete_records([TopicPartition(t.names.op, 0, -1)]).values():
        future.result()  # what retention does: every op of partition 0 is gone (to its end)
    assert t.read(t.names.op) == []
    raise_limit(t, kafka_admin)
    assert len(resume(t, unpublishable).resumed) == 1
    assert resume(t, unpublishable).resumed == []
    assert [r.transaction_id for r in published(t)] == [unpublishable]


def test_concurrent_resumes_publish_it_once(
    outbox_topics: OutboxTopics, kafka_admin: AdminClient, unpublishable: str
):
    t = outbox_topics
    raise_limit(t, kafka_admin)
    results: list[object] = []
    start = threading.Barrier(4)

    def run() -> None:
        start.wait()
        try:
            results.append(resume(t, unpublishable))
        except ResumeFencedError as exc:
            results.append(exc)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(results) == 4
    # What each resume said (fenced, refused, resumed): one failure in a fresh-clone run
    # published nothing, and its four answers were not on record.
    assert [r.transaction_id for r in published(t)] == [unpublishable], results


def outbox(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "outbox", *args], capture_output=True, text=True, timeout=120
    )


def test_still_too_big_is_refused_in_one_line_and_stays_resumable(
    outbox_topics: OutboxTopics, kafka_admin: AdminClient, unpublishable: str
):
    t = outbox_topics
    where = ("--bootstrap", t.bootstrap, "--prefix", t.names.prefix)
    refused = outbox("discard", "resume", unpublishable, *where)
    assert refused.returncode == 1
    assert "Traceback" not in refused.stderr
    (line,) = [line for line in refused.stderr.splitlines() if "cannot resume" in line]
    assert line.startswith(f"error: cannot resume {unpublishable}: ")
    assert "still cannot be published" in line
    assert f"max.message.bytes of {SMALL_LIMIT}" in line and t.real_topic in line
    assert published(t) == []
    assert [d.resumed for d in read_discards(t.client_config, t.names)] == [None]

    raise_limit(t, kafka_admin)
    everything = outbox("discard", "resume", "--all", *where)
    assert everything.returncode == 0, everything.stderr
    assert f"published to {t.real_topic}" in everything.stdout
    assert "resumed: 1 half(s), 1 of them published" in everything.stdout
    again = outbox("discard", "resume", "--all", *where)
    assert again.returncode == 0, again.stderr
    assert "resumed: 0 half(s)" in again.stdout
    assert [r.transaction_id for r in published(t)] == [unpublishable]


def test_an_op_naming_another_transactions_half_leaves_nothing_to_publish(
    outbox_topics: OutboxTopics,
):
    """A commit op naming a half that belongs to another transaction (a bogus op) is
    unpublishable; its discard must not carry that other half, or a resume would publish a
    transaction that never committed. It keeps the op's facts, and the resume refuses."""
    t = outbox_topics
    other = pending_half(t, "never-committed")
    ((_, offset),) = write(t, other.to_record(t.names, 0))
    op = OpRecord("committed", "orders", 0, offset, Resolution.COMMIT, now_ms())
    write(t, op.to_record(t.names))
    with running_relay(t.client_config, t.names):
        wait_for(lambda: bool(t.read(t.names.discard)), what="the relay's discard")
    outcome = resume(t)  # --all
    assert outcome.resumed == []
    ((label, why),) = outcome.refused
    assert label == "committed" and "nothing of the committed one to publish" in why
    assert published(t) == []


def test_a_resume_answers_once_its_published_record_is_visible(
    outbox_topics: OutboxTopics, kafka_admin: AdminClient, unpublishable: str
):
    """``commit_transaction`` returns once the coordinator decided; the markers that make the
    records readable reach the partitions a moment later, or later still behind another
    transaction open there (a relay's). A suite run read the real topic right after four
    concurrent resumes, one of which had published, and found nothing. A resume answers
    once a ``read_committed`` reader sees what it published."""
    t = outbox_topics
    raise_limit(t, kafka_admin)
    ahead = Producer(
        {
            **t.client_config,
            "transactional.id": f"{t.names.prefix}.ahead",
            "logger": logging.getLogger("tests.ahead"),
        }
    )
    ahead.init_transactions(30)
    ahead.begin_transaction()
    for partition in (0, 1):  # whichever partition the record's key goes to
        ahead.produce(t.real_topic, b"ahead", partition=partition)
    assert ahead.flush(30) == 0
    commit_ahead = threading.Timer(3.0, ahead.commit_transaction)
    commit_ahead.start()
    outcome = resume(t, unpublishable)
    commit_ahead.join()
    assert [r.transaction_id for r in outcome.resumed] == [unpublishable]
    visible = [raw for raw in t.read(t.real_topic) if raw.value == VALUE]
    assert [RealRecord.from_record(raw).transaction_id for raw in visible] == [unpublishable]
