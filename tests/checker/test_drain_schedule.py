"""When the checker loop looks for parked sends: :class:`outbox_checker.parked.DrainSchedule`."""

from outbox_checker.parked import DrainSchedule, DrainTrigger


def test_the_drain_runs_every_interval():
    schedule = DrainSchedule(interval_seconds=1.0)
    assert schedule.due(100.0, generation=0) is DrainTrigger.INTERVAL  # the first look
    assert schedule.due(100.5, generation=0) is None
    assert schedule.due(101.0, generation=0) is DrainTrigger.INTERVAL
    assert schedule.due(101.2, generation=0) is None


def test_a_new_assignment_makes_the_drain_due_at_once():
    """After an outage the replica gets its partitions back with a round due: the parked
    sends of those partitions go first, not after the round (seconds on a backlog). A
    static member can lose and regain the same partitions within one poll: the assignment's
    generation tells, not the set of partitions."""
    schedule = DrainSchedule(interval_seconds=1.0)
    assert schedule.due(100.0, generation=1) is DrainTrigger.ASSIGNED
    assert schedule.due(100.3, generation=1) is None
    assert schedule.due(100.4, generation=2) is DrainTrigger.ASSIGNED  # revoked, given back
    assert schedule.due(101.4, generation=2) is DrainTrigger.INTERVAL


def test_while_a_round_backs_off_only_an_assignment_drains():
    """A round retried after an outage backs off serving its group; an assignment heard
    there drains at once, but the interval's drains wait for the loop (they would fail
    against a Kafka still away, a warning a second)."""
    schedule = DrainSchedule(interval_seconds=1.0)
    schedule.due(100.0, generation=1)
    assert schedule.due(105.0, generation=1, assigned_only=True) is None
    assert schedule.due(105.1, generation=2, assigned_only=True) is DrainTrigger.ASSIGNED
    assert schedule.due(105.2, generation=2) is None  # the assignment's drain counts
