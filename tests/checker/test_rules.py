"""The check round's rule table, one case per branch, with time driven by a fake clock."""

from __future__ import annotations

from outbox.protocol import DiscardReason, Header, RawRecord, Resolution
from outbox_checker.ended import EndedTransactions
from outbox_checker.rules import RoundRules, StopReason, iter_round, plan_round
from tests.checker.memory_log import T0, TOPICS, Clock, MemoryLog, a_half

RULES = RoundRules(transaction_timeout_ms=6_000, check_max=3, op_read_batch=2)


def run(
    log: MemoryLog,
    *,
    half=0,
    op=0,
    clock=None,
    monotonic=None,
    rules=RULES,
    ended=None,
    half_end=None,
):
    return plan_round(
        log,
        partition=0,
        half_checkpoint=half,
        op_checkpoint=op,
        ended=ended if ended is not None else EndedTransactions(1000),
        rules=rules,
        now_ms=clock or Clock(),
        monotonic_ms=monotonic or Clock(0),
        half_end=half_end,
    )


def chunks_of(log: MemoryLog, rules: RoundRules) -> list:
    """A whole round from the start, chunk by chunk."""
    walk = iter_round(
        log,
        partition=0,
        half_checkpoint=0,
        op_checkpoint=0,
        ended=EndedTransactions(1000),
        rules=rules,
        now_ms=Clock(),
    )
    return list(walk)


def checked(plan) -> list[str]:
    return [e.half.transaction_id for e in plan.to_check]


def test_due_half_without_op_is_checked_and_checkpoint_moves_past_it():
    log = MemoryLog()
    log.add_half(a_half("a"))
    plan = run(log)
    assert checked(plan) == ["a"]
    assert (plan.half_checkpoint, plan.stop_reason) == (1, StopReason.END)


def test_half_with_op_is_removed_and_its_op_done():
    log = MemoryLog()
    offset = log.add_half(a_half("a"))
    op_offset = log.add_op("a", offset)
    log.add_half(a_half("b"))
    plan = run(log)
    assert checked(plan) == ["b"]
    assert plan.skipped_ended == 1
    assert plan.op_checkpoint == op_offset + 1


def test_check_times_at_max_is_discarded():
    log = MemoryLog()
    log.add_half(a_half("a", check_times=3))
    log.add_half(a_half("b", check_times=2))
    plan = run(log)
    assert [(d.entry.half.transaction_id, d.reason) for d in plan.to_discard] == [
        ("a", DiscardReason.CHECK_MAX)
    ]
    assert checked(plan) == ["b"]


def test_past_retention_is_discarded_unchecked():
    log = MemoryLog()
    log.add_half(a_half("old", born_ms=T0 - 73 * 3600 * 1000))
    plan = run(log, rules=RoundRules(check_max=3, retention_ms=72 * 3600 * 1000))
    assert [(d.reason, d.entry.half.transaction_id) for d in plan.to_discard] == [
        (DiscardReason.RETENTION, "old")
    ]
    assert plan.to_check == []
    assert plan.half_checkpoint == 1


def test_stored_after_the_round_began_stops_the_walk():
    log = MemoryLog()
    log.add_half(a_half("due"))
    log.add_half(a_half("fresh", born_ms=T0 - 60_000), stored_ms=T0 + 5)
    log.add_half(a_half("after"))
    plan = run(log)
    assert checked(plan) == ["due"]
    assert (plan.half_checkpoint, plan.stop_reason) == (1, StopReason.FRESH)


def test_younger_than_timeout_stops_and_keeps_the_checkpoint_on_it():
    log = MemoryLog()
    log.add_half(a_half("due"))
    log.add_half(a_half("young", born_ms=T0 - 5_999))
    log.add_half(a_half("due-but-behind"))
    plan = run(log)
    assert checked(plan) == ["due"]
    assert (plan.half_checkpoint, plan.stop_reason) == (1, StopReason.YOUNG)
    assert plan.pending_by_topic == {"events": 2}
    assert plan.oldest_pending_born_ms == T0 - 60_000


def test_exactly_at_timeout_is_checked():
    log = MemoryLog()
    log.add_half(a_half("edge", born_ms=T0 - 6_000))
    assert checked(run(log)) == ["edge"]


def test_immunity_header_requeues_young_halves_instead_of_stopping():
    log = MemoryLog()
    log.add_half(a_half("immune", born_ms=T0 - 30_000, immunity_seconds=60))
    log.add_half(a_half("due"))
    plan = run(log)
    assert [e.half.transaction_id for e in plan.to_requeue] == ["immune"]
    assert checked(plan) == ["due"]
    assert plan.half_checkpoint == 2


def test_immunity_past_its_time_is_checked():
    log = MemoryLog()
    log.add_half(a_half("immune", born_ms=T0 - 61_000, immunity_seconds=60))
    assert checked(run(log)) == ["immune"]


def test_immunity_shorter_than_timeout_uses_the_timeout():
    log = MemoryLog()
    log.add_half(a_half("short", born_ms=T0 - 3_000, immunity_seconds=1))
    plan = run(log)
    assert [e.half.transaction_id for e in plan.to_requeue] == ["short"]
    assert plan.to_check == []


def test_op_after_put_back_stops_checks_of_the_copy():
    """RocketMQ #1517/#2117: a copy put back just before its op arrived is asked again."""
    log = MemoryLog()
    original = log.add_half(a_half("a"))
    ended = EndedTransactions(1000)
    first = run(log, ended=ended)
    assert checked(first) == ["a"]
    # The checker appended the copy; then the producer's own (late) op arrived,
    # naming the original offset.
    log.add_half(a_half("a", check_times=1).put_back(original, T0 - 60_000))
    log.add_op("a", original)
    second = run(log, half=first.half_checkpoint, op=first.op_checkpoint, ended=ended)
    assert second.to_check == []
    assert second.skipped_ended == 1
    # And after a restart (a fresh ended set), the op history rebuilt into it does the same.
    rebuilt = EndedTransactions(1000)
    rebuilt.add((0, original))
    third = run(log, half=first.half_checkpoint, op=second.op_checkpoint, ended=rebuilt)
    assert third.to_check == []


def test_cannot_tell_yet_reads_more_ops_before_checking():
    log = MemoryLog()
    target = log.add_half(a_half("late-op"))
    # Ops for other halves, ended just after the round began: the last op read
    # is not old enough to prove that no op for this half is still unread.
    for i in range(4):
        log.add_op(f"other{i}", 100 + i, ended_ms=T0 + 1)
    log.add_op("late-op", target, ended_ms=T0 + 2)
    plan = run(log)
    assert plan.to_check == []
    assert plan.skipped_ended == 1
    assert log.fills >= 3  # batches of 2 ops: read until the op was found


def test_op_checkpoint_advances_only_over_the_contiguous_done_prefix():
    log = MemoryLog()
    a = log.add_half(a_half("a"))
    log.add_half(a_half("young", born_ms=T0 - 1_000))
    ahead = log.add_half(a_half("ahead"))
    op_a = log.add_op("a", a)  # done: its half is walked
    op_far = log.add_op("ahead", ahead)  # names a half past where the walk stops: not done
    log.add_op("old", 0, half_partition=0)  # also done, but after the undone one
    plan = run(log)
    assert plan.op_checkpoint == op_far
    assert op_a < op_far


def test_op_naming_an_unknown_offset_is_ignored_and_does_not_stick():
    log = MemoryLog()
    log.add_half(a_half("a"))
    log.add_half(a_half("b"), gap=3)  # offsets 1-3 hold no half (e.g. transaction markers)
    log.add_op("ghost", 2)  # names a gap the walk passes
    beyond = log.add_op("beyond", 999)  # names an offset past the end
    plan = run(log, half_end=5)
    assert checked(plan) == ["a", "b"]
    assert plan.op_checkpoint == beyond + 1


def test_op_from_another_partition_is_ignored_and_done():
    log = MemoryLog()
    log.add_half(a_half("a"))
    stray = log.add_op("a", 0, half_partition=7)
    plan = run(log)
    assert plan.op_checkpoint == stray + 1


def test_malformed_half_is_discarded_and_does_not_block():
    log = MemoryLog()
    log.add_raw_half(
        RawRecord(TOPICS.half, 0, 0, b"k", b"v", ((Header.KIND.value, b"half"),), T0 - 60_000)
    )
    log.add_half(a_half("b"))
    plan = run(log)
    (discard,) = plan.to_discard
    assert discard.reason is DiscardReason.MALFORMED
    assert "outbox-transaction-id" in discard.detail
    assert checked(plan) == ["b"]
    assert plan.half_checkpoint == 2


def test_time_budget_stops_the_partition():
    log = MemoryLog()
    for i in range(10):
        log.add_half(a_half(f"h{i}"))
    clock = Clock(0, step_ms=1_000)  # every look at the clock costs a second
    plan = run(log, monotonic=clock, rules=RoundRules(check_max=3, max_process_ms=5_000))
    assert plan.stop_reason is StopReason.TIME_BUDGET
    assert 0 < len(plan.to_check) < 10
    assert plan.half_checkpoint == len(plan.to_check)


def test_clock_behind_the_store_time_checks_at_once():
    """The checker's clock behind the broker's (a copy's origin stored "in the future")."""
    log = MemoryLog()
    log.add_half(a_half("future").put_back(7, T0 + 10_000), stored_ms=T0 - 1)
    assert checked(run(log)) == ["future"]


def test_no_discard_before_a_single_check():
    """RocketMQ #8311: with check max 1, the first round checks; only the copy is discarded."""
    log = MemoryLog()
    log.add_half(a_half("a"))
    rules = RoundRules(check_max=1)
    first = run(log, rules=rules)
    assert checked(first) == ["a"]
    assert first.to_discard == []
    log.add_half(a_half("a", check_times=1))
    second = run(log, half=first.half_checkpoint, op=first.op_checkpoint, rules=rules)
    assert [d.reason for d in second.to_discard] == [DiscardReason.CHECK_MAX]


def test_lost_checkpoints_cause_no_check_storm():
    """RocketMQ #2133: from offset 0 only halves without an op are checked."""
    log = MemoryLog()
    for i in range(50):
        offset = log.add_half(a_half(f"done{i}"))
        log.add_op(f"done{i}", offset)
    log.add_half(a_half("pending"))
    plan = run(log, rules=RoundRules(op_read_batch=32))
    assert checked(plan) == ["pending"]
    assert plan.skipped_ended == 50


def test_round_is_yielded_in_chunks_with_monotonic_checkpoints():
    log = MemoryLog()
    for i in range(7):
        log.add_half(a_half(f"h{i}"))
    chunks = chunks_of(log, RoundRules(chunk_size=3))
    assert [len(c.to_check) for c in chunks] == [3, 3, 1]
    assert [c.half_checkpoint for c in chunks] == [3, 6, 7]
    assert [c.stop_reason for c in chunks] == [None, None, StopReason.END]


def test_ended_set_is_bounded():
    ended = EndedTransactions(1000)
    for i in range(1500):
        ended.add((0, i))
    assert len(ended) == 1000
    assert (0, 0) not in ended
    assert (0, 1499) in ended


def test_halves_appended_during_the_round_stop_it_whatever_their_timestamps():
    """Copies the round itself appends may carry any clock; offsets decide."""
    log = MemoryLog()
    log.add_half(a_half("due"))
    end = log.next_half_offset()
    log.add_half(a_half("appended-later"), stored_ms=T0 - 120_000)  # an old-looking stamp
    plan = run(log, half_end=end)
    assert checked(plan) == ["due"]
    assert plan.stop_reason is StopReason.FRESH


# ---------------------------------------------------------------- review defects


def test_reused_transaction_id_after_a_rollback_is_still_checked():
    """Ended is keyed on the half's identity, not on a caller-chosen transaction id."""
    log = MemoryLog()
    first = log.add_half(a_half("reused"))
    log.add_op("reused", first, resolution=Resolution.ROLLBACK)
    log.add_half(a_half("reused"))  # the retry, same id, no op yet
    plan = run(log)
    assert checked(plan) == ["reused"]
    assert plan.to_check[0].offset == first + 1


def test_copy_of_a_half_with_an_op_is_skipped_by_its_origin():
    log = MemoryLog()
    original = log.add_half(a_half("a"))
    log.add_op("a", original)
    log.add_half(a_half("a", check_times=1).put_back(original, T0 - 60_000))
    plan = run(log)
    assert plan.to_check == []
    assert plan.skipped_ended == 2


class UnsettledLog(MemoryLog):
    """An op partition whose last stable offset is below its high watermark."""

    settled: bool = False

    def ops_settled(self) -> bool:
        return self.settled


def test_no_more_ops_behind_an_open_kafka_transaction_means_cannot_tell_yet():
    log = UnsettledLog()
    log.add_half(a_half("behind-open-txn"))
    plan = run(log)
    assert plan.to_check == []
    assert (plan.stop_reason, plan.half_checkpoint) == (StopReason.OPS_UNSETTLED, 0)
    log.settled = True
    assert checked(run(log)) == ["behind-open-txn"]


def test_reading_ops_for_one_half_is_capped_per_round():
    log = MemoryLog()
    log.add_half(a_half("unanswered"))
    for i in range(500):  # a backlog of ops for other halves, all ended after the round began
        log.add_op(f"other{i}", 1000 + i, ended_ms=T0 + 1)
    rules = RoundRules(op_read_batch=2, max_ops_per_round=40)
    plan = run(log, rules=rules, half_end=1)
    assert checked(plan) == ["unanswered"]  # past the cap: asked (a second answer is harmless)
    assert log.fills <= 40 // 2 + 1


def test_a_backlog_longer_than_the_cap_is_settled_by_its_ops_not_asked_about():
    """The cap bounds the ops held ahead of the walk, not the ops a round reads.

    After a checker outage the halves and their ops wait interleaved, as traffic
    wrote them, many more than the cap. Every one is decided: a round must skip
    them all, not ask the producers about each half past the cap (and write a
    put-back copy of each).
    """
    log = MemoryLog()
    for i in range(200):
        offset = log.add_half(a_half(f"t{i}"))
        log.add_op(f"t{i}", offset, ended_ms=T0 - 50_000)
    log.add_half(a_half("unanswered"))
    rules = RoundRules(op_read_batch=4, max_ops_per_round=20, chunk_size=10_000)
    plan = run(log, rules=rules)
    assert checked(plan) == ["unanswered"]
    assert plan.skipped_ended == 200
    assert (plan.stop_reason, plan.half_checkpoint) == (StopReason.END, 201)


def test_a_round_through_a_long_backlog_moves_the_op_checkpoint_by_chunks():
    log = MemoryLog()
    for i in range(300):
        offset = log.add_half(a_half(f"t{i}"))
        log.add_op(f"t{i}", offset, ended_ms=T0 - 50_000)
    rules = RoundRules(op_read_batch=4, max_ops_per_round=20, chunk_size=50)
    chunks = chunks_of(log, rules)
    assert sum(c.skipped_ended for c in chunks) == 300
    assert [c.to_check for c in chunks] == [[]] * len(chunks)
    op_checkpoints = [c.op_checkpoint for c in chunks]
    assert (
        op_checkpoints == sorted(op_checkpoints)
        and op_checkpoints[-1] == log.op_entries[-1].offset + 1
    )


def test_reading_ops_for_one_half_honours_the_time_budget():
    log = MemoryLog()
    log.add_half(a_half("unanswered"))
    for i in range(500):
        log.add_op(f"other{i}", 1000 + i, ended_ms=T0 + 1)
    rules = RoundRules(op_read_batch=2, max_process_ms=10_000)
    plan = run(log, rules=rules, monotonic=Clock(0, step_ms=1_000), half_end=1)
    assert plan.to_check == []
    assert (plan.stop_reason, plan.half_checkpoint) == (StopReason.TIME_BUDGET, 0)
    assert log.fills < 20


def test_ops_for_halves_written_during_the_round_stay_undone():
    """Only offsets at or past the partition's current end are bogus."""
    log = MemoryLog()
    log.add_half(a_half("due"))
    end_at_start = log.next_half_offset()
    late = log.add_half(a_half("written-during-the-round"))
    op = log.add_op("written-during-the-round", late)
    bogus = log.add_op("nowhere", 999)
    plan = run(log, half_end=end_at_start)
    assert plan.stop_reason is StopReason.FRESH
    assert plan.op_checkpoint == op  # the op is re-read next round, where its half is
    again = run(log, half=plan.half_checkpoint, op=plan.op_checkpoint)
    assert again.to_check == [] and again.skipped_ended == 1
    assert again.op_checkpoint == bogus + 1


def test_ages_come_from_the_broker_not_the_producer_clock():
    ahead = a_half("clock-ahead", born_ms=T0 + 3_600_000)
    behind = a_half("clock-behind", born_ms=T0 - 100 * 3_600_000)
    for half in (ahead, behind):
        log = MemoryLog()
        log.add_half(half, stored_ms=T0 - 1_000)
        young = run(log)
        assert young.to_check == [] and young.to_discard == []
        assert young.stop_reason is StopReason.YOUNG
        assert checked(run(log, clock=Clock(T0 + 5_000))) == [half.transaction_id]


def test_a_copy_ages_from_its_original_store_time():
    log = MemoryLog()
    copy = a_half("copy", born_ms=T0, check_times=1).put_back(7, T0 - 73 * 3_600_000)
    log.add_half(copy, stored_ms=T0 - 1_000)
    plan = run(log, rules=RoundRules(check_max=3, retention_ms=72 * 3_600_000))
    assert [d.reason for d in plan.to_discard] == [DiscardReason.RETENTION]


# ------------------------------------------------------------ when the next round is due


def test_a_young_half_makes_a_round_due_when_it_comes_of_age():
    log = MemoryLog()
    log.add_half(a_half("young", born_ms=T0 - 2_000))
    plan = run(log)
    assert plan.stop_reason is StopReason.YOUNG
    assert plan.due_again_ms == T0 - 2_000 + RULES.transaction_timeout_ms


def test_a_half_is_not_checked_while_its_producer_may_still_end_it():
    """The producer's transaction timeout travels on its half: a checker set shorter waits
    for it (a check-back's answer would otherwise race the producer's own end)."""
    log = MemoryLog()
    log.add_half(a_half("long-window", born_ms=T0 - 8_000, end_window_ms=10_000))
    log.add_half(a_half("behind", born_ms=T0 - 7_000))
    plan = run(log)
    assert plan.to_check == [] and plan.to_requeue == []
    assert (plan.half_checkpoint, plan.stop_reason) == (0, StopReason.YOUNG)
    assert plan.due_again_ms == T0 - 8_000 + 10_000
    assert checked(run(log, clock=Clock(T0 + 2_000))) == ["long-window", "behind"]


def test_a_window_shorter_than_the_checkers_timeout_changes_nothing():
    log = MemoryLog()
    log.add_half(a_half("short-window", born_ms=T0 - 5_000, end_window_ms=3_000))
    plan = run(log)
    assert (plan.to_check, plan.stop_reason) == ([], StopReason.YOUNG)
    assert plan.due_again_ms == T0 - 5_000 + RULES.transaction_timeout_ms


def test_an_immune_half_waits_for_the_longer_of_its_immunity_and_its_window():
    log = MemoryLog()
    log.add_half(a_half("immune", born_ms=T0 - 8_000, immunity_seconds=7, end_window_ms=9_000))
    plan = run(log)
    assert [e.half.transaction_id for e in plan.to_requeue] == ["immune"]


def test_a_walk_to_the_end_is_due_again_a_transaction_timeout_later():
    """A half stored after the walk ended is due no sooner than that."""
    log = MemoryLog()
    log.add_half(a_half("a"))
    plan = run(log)
    assert plan.stop_reason is StopReason.END
    assert plan.due_again_ms == T0 + RULES.transaction_timeout_ms


def test_a_spent_budget_is_due_again_at_once():
    log = MemoryLog()
    log.add_half(a_half("a"))
    log.add_half(a_half("b"))
    plan = run(log, rules=RoundRules(max_process_ms=0), monotonic=Clock(0, step_ms=1))
    assert plan.stop_reason is StopReason.TIME_BUDGET
    assert plan.due_again_ms == T0


def test_a_copy_that_stops_a_round_leaves_the_next_to_the_interval():
    log = MemoryLog()
    log.add_half(a_half("a", check_times=1).put_back(0, T0 - 60_000), stored_ms=T0 - 1_000)
    plan = run(log, rules=RoundRules(recheck_after_ms=30_000))
    assert plan.stop_reason is StopReason.RECHECK_NOT_DUE
    assert plan.due_again_ms is None
    assert plan.to_check == []
    assert plan.half_checkpoint == 0


def test_an_early_round_asks_about_a_copy_put_back_an_interval_ago():
    log = MemoryLog()
    log.add_half(a_half("a", check_times=1).put_back(0, T0 - 90_000), stored_ms=T0 - 30_000)
    assert checked(run(log, rules=RoundRules(recheck_after_ms=30_000))) == ["a"]


def test_an_interval_round_asks_about_a_copy_whenever_it_was_put_back():
    log = MemoryLog()
    log.add_half(a_half("a", check_times=1).put_back(0, T0 - 60_000), stored_ms=T0 - 1_000)
    assert checked(run(log)) == ["a"]
