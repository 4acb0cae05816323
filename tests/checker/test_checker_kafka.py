"""The checker against a real broker, with a real producer answering its questions.

Time is driven by skewing the checker's clock forward, so halves become due
without sleeping; Kafka, the producer and the checker are all real.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from prometheus_client import REGISTRY

from outbox import LocalTransactionState, Message, TransactionProducer
from outbox.protocol import (
    DiscardReason,
    Header,
    OpRecord,
    OutgoingRecord,
    RealRecord,
    Resolution,
)
from outbox_checker.membership import ASSIGNMENT_STRATEGY
from outbox_checker.names import decode_checkpoint
from tests.checker.support import (
    SkewedClock,
    check_requests,
    discards,
    ensure_check_topic,
    pending_half,
    running_checker,
    wait_for,
    write,
)
from tests.fixtures.kafka import set_topic_config
from tests.producer.conftest import OutboxTopics, ScriptedListener

pytestmark = pytest.mark.kafka

UNKNOW = LocalTransactionState.UNKNOW


def ops(topics: OutboxTopics) -> list[OpRecord]:
    return [OpRecord.from_record(r) for r in topics.read(topics.names.op)]


def real_ids(topics: OutboxTopics) -> list[str]:
    return [RealRecord.from_record(r).transaction_id for r in topics.read(topics.real_topic)]


@pytest.mark.parametrize(
    "answer,resolution",
    [
        (LocalTransactionState.COMMIT_MESSAGE, Resolution.COMMIT),
        (LocalTransactionState.ROLLBACK_MESSAGE, Resolution.ROLLBACK),
    ],
)
def test_unknown_is_resolved_by_check_back_and_never_asked_again(
    producer: TransactionProducer,
    outbox_topics: OutboxTopics,
    listener: ScriptedListener,
    answer,
    resolution,
):
    listener.check_answer = answer
    sent = producer.send_message_in_transaction(Message(outbox_topics.real_topic, b"v"), UNKNOW)
    clock = SkewedClock()
    with running_checker(outbox_topics, clock, relay=True) as checker:
        checker.run_round()
        assert check_requests(outbox_topics) == []  # younger than the transaction timeout
        clock.skew = 60
        report = checker.run_round()
        assert report.checks_sent == 1
        wait_for(lambda: len(ops(outbox_topics)) == 1, what="the check answer")
        for _ in range(3):  # later rounds: the copy has its op, nobody is asked again
            clock.skew += 60
            checker.run_round()
        expected = [sent.transaction_id] if resolution is Resolution.COMMIT else []
        wait_for(lambda: real_ids(outbox_topics) == expected, what="the relay")
    assert [o.resolution for o in ops(outbox_topics)] == [resolution]
    assert len(check_requests(outbox_topics)) == 1
    assert len(listener.checked) == 1
    assert real_ids(outbox_topics) == expected
    assert outbox_topics.read(outbox_topics.real_topic, "read_uncommitted") == (
        outbox_topics.read(outbox_topics.real_topic)
    )


def test_no_live_producer_is_checked_until_check_max_then_discarded(outbox_topics):
    half = pending_half(outbox_topics, "orphan")
    write(outbox_topics, half.to_record(outbox_topics.names, 1))
    clock = SkewedClock(60)  # ages count from the broker's store time: due at once
    with running_checker(outbox_topics, clock, check_max=2) as checker:
        sent = []
        for _ in range(4):
            sent.append(checker.run_round().checks_sent)
            clock.skew += 60
    assert sent == [1, 1, 0, 0]
    requests = check_requests(outbox_topics)
    assert [r.half.check_times for r in requests] == [1, 2]
    (discarded,) = discards(outbox_topics)
    assert discarded.reason is DiscardReason.CHECK_MAX
    assert discarded.original_half().transaction_id == "orphan"
    assert discarded.original_half().check_times == 2
    assert ops(outbox_topics) == []


def test_malformed_half_is_discarded_and_does_not_block(outbox_topics):
    garbage = OutgoingRecord(
        outbox_topics.names.half, b"k", b"v", [(Header.KIND.value, b"half")], partition=0
    )
    good = pending_half(outbox_topics, "after-garbage")
    write(outbox_topics, garbage, good.to_record(outbox_topics.names, 0))
    with running_checker(outbox_topics, SkewedClock(60)) as checker:
        report = checker.run_round()
    assert report.checks_sent == 1
    (discarded,) = discards(outbox_topics)
    assert discarded.reason is DiscardReason.MALFORMED
    assert "outbox-transaction-id" in (discarded.detail or "")
    assert [r.half.transaction_id for r in check_requests(outbox_topics)] == ["after-garbage"]


def test_checkpoints_are_committed_and_a_restart_resumes_there(outbox_topics):
    write(
        outbox_topics,
        *(
            pending_half(outbox_topics, f"t{i}").to_record(outbox_topics.names, i % 3)
            for i in range(9)
        ),
    )
    clock = SkewedClock(60)
    with running_checker(outbox_topics, clock) as first:
        assert first.run_round().checks_sent == 9
    with running_checker(outbox_topics, clock) as restarted:
        # It resumes at the checkpoint: the originals are behind it, only the
        # copies (still unanswered) are due again.
        assert restarted.run_round().checks_sent == 9
    requests = check_requests(outbox_topics)
    by_round = {
        times: sorted(r.half.transaction_id for r in requests if r.half.check_times == times)
        for times in (1, 2)
    }
    assert by_round == {1: sorted(f"t{i}" for i in range(9)), 2: sorted(f"t{i}" for i in range(9))}
    assert len(requests) == 18
    consumer = Consumer(
        {**outbox_topics.client_config, "group.id": f"{outbox_topics.names.prefix}.checker"}
    )
    try:
        committed = consumer.committed(
            [TopicPartition(outbox_topics.names.half, p) for p in range(3)], timeout=30
        )
    finally:
        consumer.close()
    assert [c.offset for c in committed] == [6, 6, 6]  # past originals and first copies
    assert all(decode_checkpoint(c.metadata) is not None for c in committed)


def test_each_copy_is_asked_about_once_across_rounds(outbox_topics):
    write(outbox_topics, pending_half(outbox_topics, "slow").to_record(outbox_topics.names, 2))
    clock = SkewedClock(60)
    with running_checker(outbox_topics, clock, check_max=5) as checker:
        for _ in range(4):
            checker.run_round()
            clock.skew += 60
    requests = check_requests(outbox_topics)
    assert [r.half.check_times for r in requests] == [1, 2, 3, 4]
    offsets = [r.half_offset for r in requests]
    assert len(set(offsets)) == len(offsets)


def test_a_fenced_chunk_leaves_the_partition_owned_and_checked_next_round(
    outbox_topics, monkeypatch: pytest.MonkeyPatch
):
    """A chunk committed with a stale group generation is fenced (ILLEGAL_GENERATION).

    Ownership changes only through the group's rebalance callbacks: the replica
    still owns the partition, so its next round must check the half.
    """
    ensure_check_topic(outbox_topics)
    write(outbox_topics, pending_half(outbox_topics, "fenced").to_record(outbox_topics.names, 0))
    # Due at once: with real time, a rebalance quicker than the transaction timeout left the
    # half young in both rounds (no chunk to fence, none to check: 0 == 1 in 6.9 s).
    clock = SkewedClock(60)
    with running_checker(outbox_topics, clock) as checker:
        stale = checker.ownership.group_metadata()
        visitor = Consumer(
            {**outbox_topics.client_config, "group.id": checker.settings.group_id,
             "partition.assignment.strategy": ASSIGNMENT_STRATEGY}
        )  # fmt: skip
        visitor.subscribe([outbox_topics.names.half])
        deadline = time.monotonic() + 60
        while not visitor.assignment():  # a second member joins: a new generation
            assert time.monotonic() < deadline, "the visitor never joined"
            visitor.poll(0.2)
            checker.poll_membership(0.1)
        visitor.close()  # and leaves: the checker gets every partition back
        wait_for(
            lambda: checker.poll_membership(0.2) or checker.owned_partitions() == [0, 1, 2],
            what="the checker owning every partition again",
        )
        with monkeypatch.context() as zombie:  # a zombie's view of the group
            zombie.setattr(checker.ownership, "group_metadata", lambda: stale)
            report = checker.run_round()
        assert report.checks_sent == 0  # the chunk was fenced
        assert checker.owned_partitions() == [0, 1, 2]
        assert checker.run_round().checks_sent == 1
    assert [r.half.transaction_id for r in check_requests(outbox_topics)] == ["fenced"]


def test_an_open_kafka_transaction_on_the_op_partition_defers_the_check(outbox_topics):
    """read_committed stops at the last stable offset: ops behind it are not "no op"."""
    names = outbox_topics.names
    ((_, offset),) = write(outbox_topics, pending_half(outbox_topics, "done").to_record(names, 1))
    opener = Producer({**outbox_topics.client_config, "transactional.id": names.prefix + "-open"})
    opener.init_transactions(30)
    opener.begin_transaction()
    open_op = OpRecord("elsewhere", "orders", 1, offset + 100, Resolution.COMMIT, 0)
    opener.produce(**open_op.to_record(names).produce_kwargs())
    opener.flush(30)  # written, not committed: the op partition's LSO stays before it
    done_op = OpRecord("done", "orders", 1, offset, Resolution.COMMIT, 0)
    write(outbox_topics, done_op.to_record(names))
    ensure_check_topic(outbox_topics)
    committed = False
    try:
        with running_checker(outbox_topics, SkewedClock(60)) as checker:
            held = {p.partition: p for p in checker.run_round().partitions}[1]
            assert held.stop_reason == "an open Kafka transaction on the op partition"
            assert held.half_checkpoint == offset
            opener.commit_transaction(30)
            committed = True
            settled = {p.partition: p for p in checker.run_round().partitions}[1]
            assert (settled.skipped_ended, settled.checks_sent) == (1, 0)
    finally:
        if not committed:
            opener.abort_transaction(30)
    assert check_requests(outbox_topics) == []


def test_a_half_near_the_clients_size_limit_is_checked_and_does_not_block(outbox_topics):
    """Its check request (more headers) is over librdkafka's default 1 000 000 bytes.

    The checker's producers allow more, so the topics' limits apply: the half is
    asked about like any other, and so is the half after it.
    """
    near = pending_half(outbox_topics, "near-the-limit", value=b"x" * 999_700)
    after = pending_half(outbox_topics, "after-it")
    names = outbox_topics.names
    write(outbox_topics, near.to_record(names, 0), after.to_record(names, 0))
    with running_checker(outbox_topics, SkewedClock(60)) as checker:
        report = checker.run_round()
    assert report.checks_sent == 2
    assert {r.half.transaction_id for r in check_requests(outbox_topics)} == {
        "near-the-limit",
        "after-it",
    }


def test_a_half_whose_check_request_cannot_be_written_is_discarded_not_retried(outbox_topics):
    """Over the check topic's own limit: every round would fail on it and stop the partition."""
    ensure_check_topic(outbox_topics)
    names = outbox_topics.names
    limit = 20_000
    set_topic_config(
        AdminClient(outbox_topics.client_config),
        names.check("orders"),
        "max.message.bytes",
        str(limit),
    )
    too_big = pending_half(outbox_topics, "too-big", value=b"x" * (limit - 100))
    after = pending_half(outbox_topics, "after-it")
    write(outbox_topics, too_big.to_record(names, 0), after.to_record(names, 0))
    with running_checker(outbox_topics, SkewedClock(60)) as checker:
        report = checker.run_round()
    assert report.checks_sent == 1
    assert [r.half.transaction_id for r in check_requests(outbox_topics)] == ["after-it"]
    (discarded,) = discards(outbox_topics)
    assert discarded.reason is DiscardReason.OVERSIZE
    assert discarded.original_half().transaction_id == "too-big"
    assert "check request" in (discarded.detail or "")


def test_halves_deleted_by_retention_before_the_checker_read_them_are_reported_loudly(
    outbox_topics: OutboxTopics, caplog
):
    """A checker down longer than the half topic's retention finds its checkpoint below the
    partition's first record: the halves between were never checked, and some may have had
    no decision. That is said loudly (an error, a counter), not skipped in silence."""
    t = outbox_topics
    for n in range(5):
        write(t, pending_half(t, f"lost-{n}").to_record(t.names, 0))
    group = f"{t.names.prefix}.checker"
    committer = Consumer({**t.client_config, "group.id": group, "enable.auto.commit": False})
    committer.commit(offsets=[TopicPartition(t.names.half, 0, 1)], asynchronous=False)
    committer.close()
    admin = AdminClient(t.client_config)
    for future in admin.delete_records([TopicPartition(t.names.half, 0, 4)]).values():
        future.result(30)

    def lost() -> float:
        value = REGISTRY.get_sample_value(
            "outbox_checker_halves_lost_to_retention_total", {"partition": "0"}
        )
        return value or 0.0

    before = lost()
    with (
        caplog.at_level("ERROR", logger="outbox_checker.checkpoints"),
        running_checker(t, SkewedClock()) as checker,
    ):
        checker.run_round()
    assert lost() - before == 3
    assert any("deleted by retention" in r.getMessage() for r in caplog.records)
