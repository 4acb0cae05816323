"""The check round's rule table, one case per branch, with time driven by a fake clock."""

from __future__ import annotations

from checker.ended import EndedTransactions
from checker.rules import RoundRules, StopReason, iter_round, plan_round
from outbox.protocol import DiscardReason, Header, RawRecord
from tests.checker.memory_log import T0, TOPICS, Clock, MemoryLog, a_half

RULES = RoundRules(transaction_timeout_ms=6_000, check_max=3, op_read_batch=2)


def run(log: MemoryLog, *, half=0, op=0, clock=None, rules=RULES, ended=None, half_end=None):
    return plan_round(
        log,
        partition=0,
        half_checkpoint=half,
        op_checkpoint=op,
        ended=ended if ended is not None else EndedTransactions(1000),
        rules=rules,
        now_ms=clock or Clock(),
        half_end=half_end,
    )


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
    log.add_half(a_half("a", check_times=1))
    log.add_op("a", original)
    second = run(log, half=first.half_checkpoint, op=first.op_checkpoint, ended=ended)
    assert second.to_check == []
    assert second.skipped_ended == 1
    # And after a restart (a fresh ended set), the op history rebuilt into it does the same.
    rebuilt = EndedTransactions(1000)
    rebuilt.add("a")
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
    op_a = log.add_op("a", a)  # done: its half is walked
    op_far = log.add_op("far", 50)  # names a half past where the walk stops: not done
    log.add_op("old", 0, half_partition=0)  # also done, but after the undone one
    plan = run(log, half_end=100)
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
    clock = Clock(step_ms=1_000)  # every look at the clock costs a second
    plan = run(log, clock=clock, rules=RoundRules(check_max=3, max_process_ms=5_000))
    assert plan.stop_reason is StopReason.TIME_BUDGET
    assert 0 < len(plan.to_check) < 10
    assert plan.half_checkpoint == len(plan.to_check)


def test_clock_behind_the_born_time_checks_at_once():
    log = MemoryLog()
    log.add_half(a_half("future", born_ms=T0 + 10_000), stored_ms=T0 - 1)
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
    chunks = list(
        iter_round(
            log,
            partition=0,
            half_checkpoint=0,
            op_checkpoint=0,
            ended=EndedTransactions(1000),
            rules=RoundRules(chunk_size=3),
            now_ms=Clock(),
        )
    )
    assert [len(c.to_check) for c in chunks] == [3, 3, 1]
    assert [c.half_checkpoint for c in chunks] == [3, 6, 7]
    assert [c.stop_reason for c in chunks] == [None, None, StopReason.END]


def test_ended_set_is_bounded():
    ended = EndedTransactions(1000)
    for i in range(1500):
        ended.add(f"t{i}")
    assert len(ended) == 1000
    assert "t0" not in ended
    assert "t1499" in ended


def test_halves_appended_during_the_round_stop_it_whatever_their_timestamps():
    """Copies the round itself appends may carry any clock; offsets decide."""
    log = MemoryLog()
    log.add_half(a_half("due"))
    end = log.next_half_offset()
    log.add_half(a_half("appended-later"), stored_ms=T0 - 120_000)  # an old-looking stamp
    plan = run(log, half_end=end)
    assert checked(plan) == ["due"]
    assert plan.stop_reason is StopReason.FRESH
