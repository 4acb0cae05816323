"""``outbox discard list|resume`` on a real broker: discards written by hand, halves read back."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from outbox.admin import ensure_topics, plan_topics
from outbox.config import KafkaSettings
from outbox.errors import KafkaUnavailableError
from outbox.protocol import (
    DiscardReason,
    DiscardRecord,
    HalfRecord,
    Header,
    OpRecord,
    RawRecord,
    RecordKind,
    Resolution,
    TopicNames,
)
from outbox.reading import read_topic
from outbox_checker import discard as discard_module
from outbox_checker.discard import RESUMED_KIND, ResumeMarker, read_discards, resume_discards
from outbox_checker.errors import ResumeFencedError
from tests.checker.support import now_ms
from tests.fixtures.reports import reports_without_offsets

pytestmark = pytest.mark.kafka

NOW_MS = int(time.time() * 1000)


def a_half(transaction_id: str, check_times: int = 15) -> HalfRecord:
    return HalfRecord(
        transaction_id,
        "shop",
        "orders",
        f"key-{transaction_id}".encode(),
        b'{"order": 1}',
        NOW_MS - 3_600_000,
        user_headers=[("trace", b"abc"), ("empty", None)],
        real_partition=1,
        check_times=check_times,
        immunity_seconds=20,
    )


class Discards:
    """The topics of one test and ways to put discards in and halves out."""

    def __init__(self, bootstrap: str, prefix: str) -> None:
        self.settings = KafkaSettings(bootstrap_servers=bootstrap, topic_prefix=prefix)
        self.topics = self.settings.topics
        self.config = self.settings.client_config()
        self.producer = Producer({**self.config, "enable.idempotence": True})

    def discard(
        self,
        half: HalfRecord,
        *,
        partition: int = 1,
        offset: int = 7,
        reason: DiscardReason = DiscardReason.CHECK_MAX,
        discarded_ms: int = NOW_MS,
    ) -> DiscardRecord:
        record = half.to_record(self.topics, partition)
        raw = RawRecord(
            self.topics.half, partition, offset, record.key, record.value, tuple(record.headers)
        )
        discard = DiscardRecord.of_half(raw, reason, discarded_ms, "checked 15 times")
        self.write(discard)
        return discard

    def malformed(self, transaction_id: str) -> DiscardRecord:
        raw = RawRecord(
            self.topics.half,
            0,
            3,
            b"k",
            b"v",
            (
                (Header.KIND.value, b"half"),
                (Header.TRANSACTION_ID.value, transaction_id.encode()),
                (Header.CHECK_TIMES.value, b"lots"),
            ),
        )
        discard = DiscardRecord.of_half(
            raw, DiscardReason.MALFORMED, NOW_MS, "outbox-check-times is not an integer"
        )
        self.write(discard)
        return discard

    def write(self, discard: DiscardRecord) -> None:
        self.producer.produce(**discard.to_record(self.topics).produce_kwargs())
        assert self.producer.flush(30) == 0

    def halves(self) -> list[tuple[int, HalfRecord]]:
        return [
            (raw.partition, HalfRecord.from_record(raw))
            for raw in read_topic(self.config, self.topics.half, timeout=60)
        ]

    def resume(self, *transaction_ids: str):
        return resume_discards(self.settings, transaction_ids or None, now_ms=now_ms)


@pytest.fixture
def discards(kafka_bootstrap: str, kafka_admin: AdminClient, unique_prefix: str) -> Discards:
    ensure_topics(kafka_admin, plan_topics(TopicNames(unique_prefix), 2))
    return Discards(kafka_bootstrap, unique_prefix)


def test_list_reads_every_field(discards):
    discards.discard(a_half("a"), partition=1, offset=7, discarded_ms=NOW_MS - 5)
    discards.malformed("m")
    found = read_discards(discards.config, discards.topics)
    assert [d.transaction_id for d in found] == ["a", "m"]
    first, bad = found
    assert first.record.reason is DiscardReason.CHECK_MAX
    assert (first.record.half_partition, first.record.half_offset) == (1, 7)
    assert (first.field(Header.PRODUCER_GROUP), first.field(Header.CHECK_TIMES)) == ("shop", "15")
    assert (first.resumable, first.resumed) == (True, None)
    assert not bad.resumable
    assert "malformed" in bad.problem


def test_resume_puts_the_original_half_back_with_checks_reset(discards):
    original = a_half("a")
    discards.discard(original, partition=1)
    outcome = discards.resume("a")
    assert [r.transaction_id for r in outcome.resumed] == ["a"]
    assert (outcome.already, outcome.refused, outcome.unknown) == ([], [], [])
    ((partition, back),) = discards.halves()
    assert partition == 1
    assert back == original.resumed(7)  # the discarded half was at offset 7: its identity
    assert back.check_times == 0
    assert (back.born_ms, back.user_headers, back.key) == (
        original.born_ms,
        original.user_headers,
        original.key,
    )
    marker = outcome.resumed[0].marker
    assert (marker.half_partition, marker.transaction_id) == (1, "a")


def test_resuming_twice_puts_back_one_half(discards):
    discards.discard(a_half("a"))
    assert len(discards.resume("a").resumed) == 1
    again = discards.resume("a")
    assert again.resumed == []
    assert [d.transaction_id for d in again.already] == ["a"]
    assert len(discards.halves()) == 1
    assert len(discards.resume().resumed) == 0  # --all: nothing left either
    (listed,) = read_discards(discards.config, discards.topics)
    assert listed.resumed is not None


def test_marker_is_a_record_of_its_own_kind_on_the_discard_topic(discards):
    discards.discard(a_half("a"))
    discards.resume("a")
    raws = read_topic(discards.config, discards.topics.discard)
    markers = [ResumeMarker.from_record(raw) for raw in raws]
    (marker,) = [m for m in markers if m is not None]
    (marker_raw,) = [raw for raw in raws if raw.kind() is RecordKind.DISCARD_RESUMED]
    (discard_raw,) = [raw for raw in raws if raw.kind() is RecordKind.DISCARD]
    assert dict(marker_raw.headers)[Header.KIND.value] == RESUMED_KIND.encode()
    assert (marker_raw.key, marker_raw.value) == (b"a", None)
    assert (marker.discard_partition, marker.discard_offset) == (
        discard_raw.partition,
        discard_raw.offset,
    )


def test_malformed_is_refused_by_name_and_the_others_resumed(discards):
    discards.malformed("bad")
    discards.discard(a_half("good"))
    outcome = discards.resume("bad", "good")
    assert [r.transaction_id for r in outcome.resumed] == ["good"]
    ((label, why),) = outcome.refused
    assert label == "bad"
    assert "malformed" in why
    assert [h.transaction_id for _, h in discards.halves()] == ["good"]


def test_unknown_transaction_id_is_reported(discards):
    discards.discard(a_half("a"))
    outcome = discards.resume("nope", "a")
    assert outcome.unknown == ["nope"]
    assert [r.transaction_id for r in outcome.resumed] == ["a"]


def test_discarded_again_after_a_resume_can_be_resumed_again(discards):
    discards.discard(a_half("a"), offset=7)
    discards.resume("a")
    discards.discard(a_half("a"), offset=40, discarded_ms=NOW_MS + 1000)  # checked 15 more times
    outcome = discards.resume("a")
    assert [r.source.record.half_offset for r in outcome.resumed] == [40]
    assert len(discards.halves()) == 2


def test_one_copy_per_half_even_if_discarded_twice(discards):
    discards.discard(a_half("a"), offset=7, discarded_ms=NOW_MS)
    discards.discard(a_half("a").put_back(7, NOW_MS), offset=9, discarded_ms=NOW_MS + 1)
    outcome = discards.resume("a")
    assert [r.source.record.half_offset for r in outcome.resumed] == [9]
    assert len(discards.halves()) == 1
    assert all(d.resumed for d in read_discards(discards.config, discards.topics))


def test_a_reused_id_puts_back_each_of_its_discarded_halves(discards):
    """Two halves under one id (an idempotency key retried) are two halves, each asked
    about on its own: resuming the id put back only the latest and marked both resumed,
    so a first attempt whose local transaction committed was never published (found by
    the protocol model, tests/model)."""
    discards.discard(a_half("a"), offset=7, discarded_ms=NOW_MS)
    discards.discard(a_half("a").put_back(3, NOW_MS), offset=9, discarded_ms=NOW_MS + 1)
    outcome = discards.resume("a")
    assert sorted(r.source.record.half_offset for r in outcome.resumed) == [7, 9]
    assert sorted(h.identity(7) for _, h in discards.halves()) == [3, 7]
    assert all(d.resumed for d in read_discards(discards.config, discards.topics))


def test_resume_all(discards):
    for transaction_id in ("a", "b", "c"):
        discards.discard(a_half(transaction_id), partition=ord(transaction_id) % 2)
    discards.malformed("m")
    outcome = discards.resume()
    assert sorted(r.transaction_id for r in outcome.resumed) == ["a", "b", "c"]
    assert [label for label, _ in outcome.refused] == ["m"]
    assert sorted((p, h.transaction_id) for p, h in discards.halves()) == [
        (0, "b"),
        (1, "a"),
        (1, "c"),
    ]


def test_concurrent_resumes_put_back_one_half(discards):
    """Both resumes share a transactional id: one fences the other or sees its markers."""
    discards.discard(a_half("a"))
    results: list[object] = []

    def resume() -> None:
        try:
            results.append(discards.resume("a"))
        except ResumeFencedError as exc:
            results.append(exc)

    threads = [threading.Thread(target=resume) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert len(results) == 3
    assert len(discards.halves()) == 1


def outbox(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "outbox", *args], capture_output=True, text=True, timeout=120
    )


def test_commands(discards, kafka_bootstrap):
    where = ("--bootstrap", kafka_bootstrap, "--prefix", discards.topics.prefix)
    discards.discard(a_half("cli-a"), partition=0, offset=12)
    discards.malformed("cli-bad")

    listed = outbox("discard", "list", *where)
    assert listed.returncode == 0, listed.stderr
    for text in ("cli-a", "cli-bad", "check-max", "malformed", "shop", "orders", "0@12"):
        assert text in listed.stdout
    assert "discarded: 2 to resume, 0 resumed before" in listed.stdout

    resumed = outbox("discard", "resume", "cli-a", "cli-bad", "cli-nope", *where)
    assert resumed.returncode == 1
    assert "cannot resume cli-bad: it was discarded as malformed" in resumed.stderr
    assert "no discarded half with transaction id 'cli-nope'" in resumed.stderr
    assert "cli-a" in resumed.stdout
    assert "resumed: 1 half(s)" in resumed.stdout
    assert "Traceback" not in resumed.stderr

    again = outbox("discard", "resume", "cli-a", *where)
    assert again.returncode == 0, again.stderr
    assert "already resumed: cli-a" in again.stdout
    assert "resumed: 0 half(s)" in again.stdout

    listed = outbox("discard", "list", *where)
    assert "cli-a" not in listed.stdout
    assert "discarded: 1 to resume, 1 resumed before" in listed.stdout
    with_resumed = outbox("discard", "list", "--include-resumed", *where)
    assert "cli-a" in with_resumed.stdout

    everything = outbox("discard", "resume", "--all", *where)
    assert everything.returncode == 0, everything.stderr
    assert "skipped: cannot resume cli-bad" in everything.stdout

    usage = outbox("discard", "resume", *where)
    assert usage.returncode == 2
    assert "transaction ids or --all" in usage.stderr
    assert [h.transaction_id for _, h in discards.halves()] == ["cli-a"]


def test_an_unpublishable_discard_whose_topic_is_still_missing_is_refused_naming_it(discards):
    """The relay discards a committed half it cannot publish (its topic gone, too large). A
    resume publishes it (tests/checker/test_discard_publish.py) once the cause is fixed, never
    puts it back (the answer, a second decision, would publish nothing); while its real topic
    ("orders") still does not exist, it is refused naming that, and nothing is written."""
    discards.discard(a_half("committed"), reason=DiscardReason.UNPUBLISHABLE)
    discards.discard(a_half("unanswered"))
    outcome = discards.resume("committed", "unanswered")
    assert [r.transaction_id for r in outcome.resumed] == ["unanswered"]
    ((label, why),) = outcome.refused
    assert label == "committed"
    assert "still cannot be published" in why and "'orders' does not exist" in why
    assert [h.transaction_id for _, h in discards.halves()] == ["unanswered"]


def test_an_unpublishable_discard_without_its_half_is_refused(discards):
    """The relay keeps what it knows of a committed half that was gone (its op's facts): a
    resume has nothing to publish."""
    half = a_half("gone")
    record = half.to_record(discards.topics, 1)
    stand_in = RawRecord(
        discards.topics.half,
        1,
        7,
        headers=tuple(h for h in record.headers if h[0] == Header.TRANSACTION_ID.value),
    )
    discards.write(DiscardRecord.of_half(stand_in, DiscardReason.UNPUBLISHABLE, NOW_MS, "gone"))
    ((label, why),) = discards.resume("gone").refused
    assert label == "gone" and "nothing to publish" in why


def test_a_resume_waits_for_a_transaction_open_on_the_discard_topic(discards):
    """A transaction opened on the discard topic before a resume's marker (a round writing
    discards) holds the last stable offset below the marker: a second resume reading only that
    far missed the marker and put the half back again. It waits for the transaction to end."""
    discards.discard(a_half("a"))
    other = Producer({**discards.config, "transactional.id": f"{discards.topics.prefix}.round"})
    other.init_transactions(30)
    other.begin_transaction()
    # keyed as the marker will be, so on its partition, before it
    other.produce(discards.topics.discard, key=b"a", value=None, headers=[("outbox-kind", b"x")])
    assert other.flush(30) == 0
    results: list[object] = []
    done = threading.Event()

    def resume_twice() -> None:
        try:
            results.append(discards.resume("a"))
            results.append(discards.resume("a"))
        except Exception as exc:  # reported by the assertion below
            results.append(exc)
        done.set()

    threading.Thread(target=resume_twice, daemon=True).start()
    done.wait(5)  # the resumes read while the transaction is open
    other.commit_transaction(30)
    assert done.wait(120)
    assert [type(r).__name__ for r in results] == ["ResumeOutcome", "ResumeOutcome"]
    assert len(discards.halves()) == 1


def test_list_as_json_holds_what_the_table_shows(discards, kafka_bootstrap):
    where = ("--bootstrap-servers", kafka_bootstrap, "--topic-prefix", discards.topics.prefix)
    discards.discard(a_half("json-a"), partition=0, offset=12)
    discards.malformed("json-bad")

    listed = outbox("discard", "list", "--output", "json", *where)
    assert listed.returncode == 0, listed.stderr
    documents = {d["transaction_id"]: d for d in json.loads(listed.stdout)}
    assert set(documents) == {"json-a", "json-bad"}
    good, bad = documents["json-a"], documents["json-bad"]
    assert (good["producer_group"], good["real_topic"], good["reason"]) == (
        "shop",
        "orders",
        "check-max",
    )
    assert (good["half_partition"], good["half_offset"], good["resumable"]) == (0, 12, True)
    assert good["resumed"] is None and isinstance(good["discarded_ms"], int)
    assert good["check_times"] == 15
    assert (bad["reason"], bad["resumable"]) == ("malformed", False)


def test_a_discard_older_than_the_op_history_is_refused_unless_asked_for(
    discards, kafka_admin: AdminClient
):
    """The relay publishes a half's first commit only, judging "first" from the op history.
    Once retention has deleted the ops of a discarded half (a late commit the relay already
    published), a resumed copy's commit looks first and is published a second time. Such a
    resume is refused, saying why; asked for by name of the flag, it goes ahead."""
    old = a_half("old")
    # born after every op retention deleted (beyond the 60 s allowed for the writers' clocks)
    recent = dataclasses.replace(a_half("recent"), born_ms=now_ms() + 120_000)
    op = OpRecord("old", "shop", 1, 7, Resolution.COMMIT, 1)
    for _ in range(3):  # a late commit the relay published, then others
        discards.producer.produce(**op.to_record(discards.topics).produce_kwargs())
    assert discards.producer.flush(30) == 0
    deleted = kafka_admin.delete_records([TopicPartition(discards.topics.op, 1, 2)])
    for future in deleted.values():
        future.result()  # what retention does: the oldest ops of partition 1 are gone
    discards.discard(old)
    discards.discard(recent)
    outcome = discards.resume("old", "recent")
    assert [r.transaction_id for r in outcome.resumed] == ["recent"]
    ((label, why),) = outcome.refused
    assert label == "old"
    assert "op history" in why and "--past-op-retention" in why
    outcome = resume_discards(discards.settings, ["old"], now_ms=now_ms, past_op_retention=True)
    assert [r.transaction_id for r in outcome.resumed] == ["old"]


def test_a_resumed_half_stored_at_an_unreported_offset_aborts_the_resume(
    discards, monkeypatch: pytest.MonkeyPatch
):
    """The resume marker names where the half went back: a half whose report carries no
    offset cannot be named, so the resume's transaction is aborted, and nothing is back."""
    discards.discard(a_half("a"), partition=1)
    monkeypatch.setattr(discard_module, "Producer", reports_without_offsets())
    with pytest.raises(KafkaUnavailableError, match="known offsets"):
        discards.resume("a")
    assert discards.halves() == []
    assert [d.resumed for d in read_discards(discards.config, discards.topics)] == [None]
