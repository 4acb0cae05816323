"""The chaos verdict catches each kind of violation it reports (topics given as decoded state)."""

import subprocess
from collections import Counter

from outbox.protocol import OpRecord, Resolution
from outbox_devtools.chaos.verdict import (
    TopicState,
    duplicate_causes,
    judge,
    longest_gap_seconds,
    publication_stalls,
)
from tests.chaos.support import clean_verdict


def _op(
    transaction_id: str,
    offset: int,
    resolution: Resolution = Resolution.COMMIT,
    *,
    origin: int | None = None,
    partition: int = 0,
) -> OpRecord:
    return OpRecord(transaction_id, "group", partition, offset, resolution, 1, origin)


def _state() -> TopicState:
    """t1 committed, t2 rolled back: the clean run every test then breaks one way."""
    return TopicState(
        transactions={"t1", "t2"},
        ops=[_op("t1", 0), _op("t2", 1, Resolution.ROLLBACK)],
        real=Counter({"t1": 1}),
    )


def test_a_clean_run_has_no_failures():
    verdict = judge(1, {"t1"}, _state(), Counter({"t1": 1}))
    assert verdict.failures == []
    assert verdict.line() == (
        "chaos: seed=1 transactions=2 committed=1 lost=0 phantom=0 duplicates_in_sink=0 "
        "raw_duplicates=0 pending=0 orphans_published=0"
    )
    assert verdict.rolled_back == 1


def test_the_stall_figures_close_the_line_in_the_order_the_suite_reads_them():
    """The figures are measures, not invariants: the suite's runs read past them."""
    verdict = judge(1, {"t1"}, _state(), Counter({"t1": 1}))
    verdict.publication_stall_s, verdict.writable_stall_s, verdict.owned_stall_s = 7.04, 5.5, 6
    line = verdict.line()
    assert line.endswith("publication_stall_s=7.0 writable_stall_s=5.5 owned_stall_s=6.0")
    assert clean_verdict(subprocess.CompletedProcess([], 0, line + "\n", ""), 1)


def test_a_committed_transaction_missing_from_the_sink_is_lost():
    verdict = judge(1, {"t1"}, _state(), Counter())
    assert verdict.lost == 1
    assert any("lost" in failure for failure in verdict.failures)


def test_a_rolled_back_transaction_on_the_real_topic_is_a_phantom():
    state = _state()
    state.real["t2"] = 1
    verdict = judge(1, {"t1"}, state, Counter({"t1": 1}))
    assert verdict.phantom == 1
    assert any("phantom" in failure for failure in verdict.failures)


def test_two_rows_of_one_transaction_in_the_sink_fail_the_run():
    verdict = judge(1, {"t1"}, _state(), Counter({"t1": 2}))
    assert verdict.duplicates_in_sink == 1
    assert verdict.failures


def test_a_half_with_no_op_and_no_discard_is_pending():
    state = _state()
    state.transactions.add("t3")
    assert judge(1, {"t1"}, state, Counter({"t1": 1})).pending == 1
    state.discarded.add("t3")
    assert judge(1, {"t1"}, state, Counter({"t1": 1})).pending == 0


def test_a_half_the_relay_published_twice_fails_the_run_naming_its_identity():
    """One publisher: a second copy on the real topic is a violation, not a known cost."""
    state = _state()
    state.ops.append(_op("t1", 5, origin=0))  # a check-back answer for the copy of 0:0
    state.real["t1"] = 2
    verdict = judge(1, {"t1"}, state, Counter({"t1": 1}))
    assert verdict.raw_duplicates == 1
    assert verdict.causes == Counter({"half 0:0 published more than once": 1})
    assert verdict.failures == [
        "1 raw duplicates on the real topic (half 0:0 published more than once: 1)"
    ]
    assert "raw_duplicates=1 " in verdict.line()


def test_a_duplicate_from_two_committed_halves_of_one_transaction_names_both():
    state = _state()
    state.ops.append(_op("t1", 3, partition=2))  # another original half, same transaction id
    state.real["t1"] = 3
    assert duplicate_causes(state) == Counter(
        {"halves 0:0, 2:3 of one transaction each committed": 2}
    )


def test_the_stall_is_the_longest_publication_gap_overlapping_the_fault():
    published_ms = [1_000, 2_000, 9_000, 9_500, 20_000, 20_200]
    # A fault from 3 s to 8 s: the gap 2 s -> 9 s covers it.
    assert longest_gap_seconds(published_ms, 3.0, 8.0) == 7.0
    # A fault from 9.2 s to 10 s: the gap 9.5 s -> 20 s overlaps it; 2 -> 9 does not.
    assert longest_gap_seconds(published_ms, 9.2, 10.0) == 10.5
    # A fault where records kept flowing at 100 ms intervals.
    steady = list(range(0, 10_000, 100))
    assert round(longest_gap_seconds(steady, 2.0, 5.0), 6) == 0.1
    # Nothing published after the fault started: the stall runs to the fault's end.
    assert longest_gap_seconds([1_000], 3.0, 8.0) == 5.0
    assert longest_gap_seconds([], 3.0, 8.0) == 0.0


def test_the_lost_say_whether_the_relay_or_the_sink_dropped_them():
    state = TopicState(transactions={"a", "b", "c"}, real=Counter({"a": 1, "b": 1}))
    verdict = judge(1, {"a", "b", "c"}, state, Counter({"a": 1}))
    assert (verdict.lost, verdict.unpublished) == (2, 1)
    assert "1 of the lost are not on the real topic either" in verdict.failures


def test_a_transaction_the_relay_never_published_is_named_with_its_ops():
    state = TopicState(
        transactions={"a", "c"},
        ops=[_op("a", 0), _op("c", 3, Resolution.ROLLBACK, partition=2)],
        real=Counter({"a": 1}),
    )
    verdict = judge(1, {"a", "c"}, state, Counter({"a": 1}))
    assert verdict.failures[-1] == "not on the real topic: c (ops: ROLLBACK of half 2:3)"


def _waiting(owed: dict[str, tuple[float, float | None]]) -> TopicState:
    """Transactions committed at a time (s) and first published at another (or never)."""
    return TopicState(
        commit_stored_ms={t: int(stored * 1000) for t, (stored, _) in owed.items()},
        first_published_ms={t: int(p * 1000) for t, (_, p) in owed.items() if p is not None},
        real_timestamps_ms=[int(p * 1000) for _, p in owed.values() if p is not None],
    )


def test_a_publication_stall_counts_only_while_a_commit_waits_and_nothing_blocks():
    # t1 published at once; t2 committed at 10 s and published at 30 s; t3 idles the run.
    state = _waiting({"t1": (1.0, 1.1), "t2": (10.0, 30.0), "t3": (31.0, 31.5)})
    assert publication_stalls(state, []) == [(1.0, 1.1), (10.0, 30.0), (31.0, 31.5)]
    # The broker was down 12-25 s: only what the outbox took on either side counts.
    assert publication_stalls(state, [(12.0, 25.0)]) == [
        (1.0, 1.1),
        (10.0, 12.0),
        (25.0, 30.0),
        (31.0, 31.5),
    ]


def test_a_record_appearing_ends_a_stall_even_while_other_commits_wait():
    state = _waiting({"slow": (0.0, 20.0), "quick": (5.0, 8.0)})
    assert publication_stalls(state, []) == [(0.0, 8.0), (8.0, 20.0)]


def test_a_commit_never_published_stalls_until_the_last_thing_seen():
    state = _waiting({"lost": (2.0, None), "later": (3.0, 9.0)})
    assert publication_stalls(state, []) == [(2.0, 9.0)]
    assert publication_stalls(state, [(4.0, float("inf"))]) == [(2.0, 4.0)]


def test_an_orphaned_attempt_of_a_reused_id_on_the_real_topic_fails_the_run():
    """Its id is committed (by the later attempt), so only its payload tells it apart."""
    state = _state()
    state.orphans_published = 1
    verdict = judge(1, {"t1"}, state, Counter({"t1": 1}))
    assert any("orphaned attempts" in failure for failure in verdict.failures)


def test_with_parking_a_send_that_failed_while_kafka_was_away_fails_the_run():
    verdict = judge(1, {"t1"}, _state(), Counter({"t1": 1}))
    verdict.parked_sends, verdict.failed_sends_kafka_away = 12, 0
    assert verdict.failures == []
    assert verdict.line().endswith("orphans_published=0 parked_sends=12 failed_sends_kafka_away=0")
    verdict.failed_sends_kafka_away = 3
    assert verdict.failures == ["3 sends failed while Kafka was away, with parking on"]
    assert verdict.line().endswith("parked_sends=12 failed_sends_kafka_away=3")
