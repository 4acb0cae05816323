"""``outbox status`` against a real broker: halves and ops written by hand, numbers checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from outbox.admin import ensure_topics, plan_topics
from outbox.config import KafkaSettings, kafka_client_config
from outbox.errors import TopicAdminError
from outbox.protocol import HalfRecord, Header, OpRecord, Resolution, TopicNames
from outbox_checker.display import format_age
from outbox_checker.names import encode_checkpoint
from outbox_checker.service import Checker
from outbox_checker.settings import CheckerSettings
from outbox_checker.status import read_status
from tests.checker.support import SkewedClock

pytestmark = pytest.mark.kafka

GROUP = "shop"
NOW_MS = int(time.time() * 1000)


def half(transaction_id: str, born_ms: int, **fields: object) -> HalfRecord:
    return HalfRecord(transaction_id, GROUP, "orders", b"k", b"v", born_ms, **fields)  # type: ignore[arg-type]


class Writer:
    """Writes protocol records by hand, as producers and the checker would."""

    def __init__(self, bootstrap: str, topics: TopicNames) -> None:
        self.topics = topics
        self.producer = Producer(kafka_client_config(bootstrap, {"enable.idempotence": True}))

    def halves(self, partition: int, *records: HalfRecord) -> None:
        for record in records:
            self.producer.produce(**record.to_record(self.topics, partition).produce_kwargs())
        assert self.producer.flush(30) == 0

    def op(self, transaction_id: str, partition: int, half_offset: int) -> None:
        op = OpRecord(transaction_id, GROUP, partition, half_offset, Resolution.COMMIT, NOW_MS)
        self.producer.produce(**op.to_record(self.topics).produce_kwargs())
        assert self.producer.flush(30) == 0

    def raw_half(self, partition: int, headers: list[tuple[str, bytes]]) -> None:
        self.producer.produce(self.topics.half, b"v", b"k", partition=partition, headers=headers)
        assert self.producer.flush(30) == 0


@pytest.fixture
def setup(kafka_bootstrap: str, kafka_admin: AdminClient, unique_prefix: str):
    topics = TopicNames(unique_prefix)
    ensure_topics(kafka_admin, plan_topics(topics, 2, 1, (GROUP,)))
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=unique_prefix)
    return settings, Writer(kafka_bootstrap, topics)


def commit_checkpoint(bootstrap: str, group: str, topic: str, partition: int, half: int, op: int):
    """Commit a checkpoint the way the checker does: half offset, op offset in the metadata."""
    consumer = Consumer(kafka_client_config(bootstrap, {"group.id": group}))
    try:
        checkpoint = TopicPartition(topic, partition, half, metadata=encode_checkpoint(op))
        consumer.commit(offsets=[checkpoint], asynchronous=False)
    finally:
        consumer.close()


def test_counts_pending_from_the_checkpoints(setup, kafka_bootstrap):
    settings, writer = setup
    group = f"{settings.topic_prefix}.checker"
    born = [NOW_MS - 600_000 + i * 1000 for i in range(5)]
    writer.halves(0, *(half(tid, b) for tid, b in zip("abcde", born, strict=True)))
    writer.op("b", 0, 1)  # op offset 0
    writer.op("d", 0, 3)  # op offset 1

    status = read_status(settings, group, now_ms=lambda: NOW_MS)
    p0, p1 = status.partitions
    assert (p0.half_end, p0.op_end, p0.half_checkpoint, p0.op_checkpoint) == (5, 2, None, None)
    assert (p0.pending, p0.oldest_pending_born_ms, p0.lag, p0.capped) == (3, born[0], 5, False)
    assert (p1.half_end, p1.pending, p1.oldest_pending_born_ms) == (0, 0, None)

    # The checker walked past a and b and marked b's op done: c, d, e remain, d has an op.
    commit_checkpoint(kafka_bootstrap, group, settings.topics.half, 0, 2, 1)
    p0 = read_status(settings, group).partitions[0]
    assert (p0.half_checkpoint, p0.op_checkpoint, p0.lag) == (2, 1, 3)
    assert (p0.pending, p0.oldest_pending_born_ms) == (2, born[2])

    # Past the op of d, that op no longer counts: d is pending again from the status' view.
    commit_checkpoint(kafka_bootstrap, group, settings.topics.half, 0, 2, 2)
    assert read_status(settings, group).partitions[0].pending == 3


def test_a_checkpoint_in_an_open_transaction_is_waited_for(setup, kafka_bootstrap):
    """A checker mid-chunk has an uncommitted checkpoint: status waits for it, not shows '-'."""
    settings, writer = setup
    group = f"{settings.topic_prefix}.checker"
    writer.halves(0, half("a", NOW_MS - 60_000), half("b", NOW_MS - 60_000))
    producer = Producer(
        kafka_client_config(kafka_bootstrap, {"transactional.id": f"{settings.topic_prefix}-c"})
    )
    member = Consumer(kafka_client_config(kafka_bootstrap, {"group.id": group}))
    try:
        producer.init_transactions(30)
        producer.begin_transaction()
        checkpoint = TopicPartition(settings.topics.half, 0, 1, metadata=encode_checkpoint(0))
        producer.send_offsets_to_transaction([checkpoint], member.consumer_group_metadata(), 30)
        found: dict[str, object] = {}
        reader = threading.Thread(target=lambda: found.update(s=read_status(settings, group)))
        reader.start()
        time.sleep(2)
        producer.commit_transaction(30)
        reader.join(60)
    finally:
        member.close()
    part = found["s"].partitions[0]  # type: ignore[attr-defined]
    assert (part.half_checkpoint, part.op_checkpoint, part.pending) == (1, 0, 1)


def test_scan_limit_makes_a_lower_bound(setup):
    settings, writer = setup
    writer.halves(1, *(half(f"t{i}", NOW_MS - 60_000) for i in range(7)))
    part = read_status(settings, "nobody", scan_limit=3).partitions[1]
    assert (part.pending, part.halves_scanned, part.capped) == (3, 3, True)
    exact = read_status(settings, "nobody", scan_limit=7).partitions[1]
    assert (exact.pending, exact.capped) == (7, False)


def test_put_back_copies_count_once_and_malformed_apart(setup):
    settings, writer = setup
    original = half("x", NOW_MS - 60_000)
    writer.halves(1, original, original.put_back(0, NOW_MS), half("y", NOW_MS - 30_000))
    writer.raw_half(1, [(Header.KIND.value, b"half"), (Header.CHECK_TIMES.value, b"??")])
    part = read_status(settings, "nobody").partitions[1]
    assert (part.pending, part.malformed, part.oldest_pending_born_ms) == (2, 1, NOW_MS - 60_000)


def test_aborted_halves_are_not_pending(setup, kafka_bootstrap):
    settings, writer = setup
    producer = Producer(
        kafka_client_config(kafka_bootstrap, {"transactional.id": f"{settings.topic_prefix}-t"})
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    record = half("aborted", NOW_MS - 60_000).to_record(settings.topics, 0)
    producer.produce(**record.produce_kwargs())
    producer.flush(30)
    producer.abort_transaction(30)
    writer.halves(0, half("after", NOW_MS - 1_000))
    deadline = time.monotonic() + 30
    while (part := read_status(settings, "nobody").partitions[0]).half_end < 3:
        assert time.monotonic() < deadline, "the abort marker never became stable"
        time.sleep(0.2)
    # The aborted half, its abort marker, then the committed one.
    assert (part.half_end, part.pending, part.oldest_pending_born_ms) == (3, 1, NOW_MS - 1_000)


def test_agrees_with_a_real_checker_round(setup, kafka_bootstrap):
    settings, writer = setup
    writer.halves(0, half("old-1", NOW_MS - 60_000), half("old-2", NOW_MS - 50_000))
    writer.halves(0, half("ended", NOW_MS - 40_000))
    writer.op("ended", 0, 2)
    checker_settings = CheckerSettings(
        bootstrap_servers=kafka_bootstrap, topic_prefix=settings.topic_prefix, http_address=""
    )
    checker = Checker(checker_settings, clock=SkewedClock(60))  # ages count from store time
    try:
        deadline = time.monotonic() + 60
        while not checker.owned_partitions() and time.monotonic() < deadline:
            checker.poll_membership(0.2)
        assert checker.owned_partitions() == [0, 1]
        report = checker.run_round()
        status = read_status(settings, checker_settings.group_id)
    finally:
        checker.close()
    p0 = report.partitions[0]
    assert (p0.checks_sent, p0.skipped_ended) == (2, 1)

    part = status.partitions[0]
    assert part.owner  # the replica holding the partition, while it runs
    assert (part.half_checkpoint, part.op_checkpoint) == (p0.half_checkpoint, p0.op_checkpoint)
    # The two put-back copies wait for their answers; the ended one is settled.
    assert (part.pending, part.oldest_pending_born_ms) == (2, NOW_MS - 60_000)


def outbox(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    groups = ("OUTBOX_CHECKER_GROUP", "OUTBOX_CONSUMER_GROUP")
    environ = {k: v for k, v in os.environ.items() if k not in groups}
    return subprocess.run(
        [sys.executable, "-m", "outbox", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**environ, **(env or {})},
    )


def test_command_prints_a_table_and_exits_0(setup, kafka_bootstrap):
    settings, writer = setup
    writer.halves(1, half("p", NOW_MS - 90_000), half("q", NOW_MS - 30_000))
    group = "custom-group"
    commit_checkpoint(kafka_bootstrap, group, settings.topics.half, 1, 1, 0)
    result = outbox(
        "status", "--bootstrap", kafka_bootstrap, "--prefix", settings.topic_prefix,
        "--group", group,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if "│" in line}
    cells = [cell.strip() for cell in rows["1"].split("│")[1:-1]]
    # partition, half end, half checkpoint, op checkpoint, lag, pending, oldest, owner
    assert cells[:6] == ["1", "2", "1", "0", "1", "1"]
    assert cells[6].endswith("s")
    assert "pending: 1 transaction(s) over 2 half partition(s)" in result.stdout


def test_command_names_missing_topics(kafka_bootstrap, unique_prefix):
    result = outbox("status", "--bootstrap", kafka_bootstrap, "--prefix", unique_prefix)
    assert result.returncode == 1
    assert f"topic {unique_prefix}.half does not exist" in result.stderr
    assert "Traceback" not in result.stderr


def test_half_and_op_partition_counts_must_match(kafka_bootstrap, kafka_admin, unique_prefix):
    topics = TopicNames(unique_prefix)
    futures = kafka_admin.create_topics([NewTopic(topics.half, 2, 1), NewTopic(topics.op, 3, 1)])
    for future in futures.values():
        future.result(30)
    settings = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=unique_prefix)
    with pytest.raises(TopicAdminError, match=r"has 2 partitions but .* has 3"):
        read_status(settings, "nobody")


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(None, "-"), (0, "0s"), (59.9, "59s"), (303, "5m03s"), (7_800, "2h10m"), (273_600, "3d04h")],
)
def test_format_age(seconds, shown):
    assert format_age(seconds) == shown


def test_decisions_the_relay_has_not_published_are_counted(setup, kafka_bootstrap):
    """With no relay running, decisions wait on the op topic: status says how many."""
    settings, writer = setup
    group = f"{settings.topic_prefix}.checker"
    writer.halves(0, half("a", NOW_MS), half("b", NOW_MS))
    writer.op("a", 0, 0)
    writer.op("b", 0, 1)
    assert [p.unrelayed for p in read_status(settings, group).partitions] == [2, 0]
    # The relay committed its offset past the first decision.
    commit_checkpoint(kafka_bootstrap, f"{group}.relay", settings.topics.op, 0, 1, 0)
    assert [p.unrelayed for p in read_status(settings, group).partitions] == [1, 0]


def test_command_as_json_holds_what_the_table_shows(setup, kafka_bootstrap):
    settings, writer = setup
    writer.halves(1, half("p", NOW_MS - 90_000), half("q", NOW_MS - 30_000))
    group = "json-group"
    commit_checkpoint(kafka_bootstrap, group, settings.topics.half, 1, 1, 0)
    result = outbox(
        "status", "--bootstrap-servers", kafka_bootstrap, "--topic-prefix",
        settings.topic_prefix, "--group", group, "-o", "json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert (document["group"], document["pending"]) == (group, 1)
    by_partition = {part["partition"]: part for part in document["partitions"]}
    one = by_partition[1]
    assert (one["half_end"], one["half_checkpoint"], one["op_checkpoint"]) == (2, 1, 0)
    assert (one["lag"], one["pending"], one["capped"]) == (1, 1, False)
    assert one["oldest_pending_born_ms"] < document["read_at_ms"]


def test_halves_deleted_by_retention_before_the_checker_read_them_are_shown(
    setup, kafka_bootstrap, kafka_admin: AdminClient
):
    """A checker down longer than the half topic's retention: halves past its checkpoint were
    deleted unread, and any without a decision is lost. The checker says so when it comes back;
    `outbox status` must say so while it is down, which is when an operator asks."""
    settings, writer = setup
    group = f"{settings.topics.prefix}.checker"
    writer.halves(0, *(half(tid, NOW_MS - 60_000) for tid in "abcdef"))
    commit_checkpoint(kafka_bootstrap, group, settings.topics.half, 0, 1, 0)
    deleted = kafka_admin.delete_records([TopicPartition(settings.topics.half, 0, 4)])
    for future in deleted.values():
        future.result()  # what retention does to offsets 0..3
    status = read_status(settings, group)
    assert status.partitions[0].lost_to_retention == 3  # offsets 1..3: past the checkpoint
    assert status.partitions[1].lost_to_retention == 0
    where = ["--bootstrap-servers", kafka_bootstrap, "--topic-prefix", settings.topic_prefix]
    result = outbox("status", *where)
    assert result.returncode == 0, result.stderr
    assert "3 half record(s) on partition 0 were deleted by retention" in result.stdout
    document = json.loads(outbox("status", *where, "--output", "json").stdout)
    assert document["lost_to_retention"] == 3


NEW_GROUP = {"OUTBOX_CHECKER_GROUP": "new-group"}
OLD_GROUP = {"OUTBOX_CONSUMER_GROUP": "old-group"}


@pytest.mark.parametrize(
    ("env", "shown", "warned"),
    [
        (NEW_GROUP, "new-group", False),
        (OLD_GROUP, "old-group", True),
        ({**NEW_GROUP, **OLD_GROUP}, "new-group", False),
    ],
)
def test_the_checker_group_variable_and_its_deprecated_name(
    setup, kafka_bootstrap, env, shown, warned
):
    """OUTBOX_CHECKER_GROUP, as the flag --checker-group; OUTBOX_CONSUMER_GROUP still read
    (with a warning) while it is unset."""
    settings, _ = setup
    result = outbox(
        "status", "--bootstrap-servers", kafka_bootstrap, "--topic-prefix", settings.topic_prefix,
        "--output", "json", env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["group"] == shown
    assert ("OUTBOX_CONSUMER_GROUP is deprecated" in result.stderr) is warned
