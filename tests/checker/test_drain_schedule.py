"""When the checker loop looks for parked sends: :class:`outbox_checker.parked.DrainSchedule`."""

from outbox_checker.parked import DrainSchedule, DrainTrigger


def test_the_drain_runs_every_interval():
    schedule = DrainSchedule(interval_seconds=1.0)
    assert schedule.due(99.5, []) is DrainTrigger.INTERVAL  # the first look, nothing owned
    assert schedule.due(100.0, [0, 1]) is DrainTrigger.ASSIGNED  # its first assignment
    assert schedule.due(100.5, [0, 1]) is None
    assert schedule.due(101.0, [0, 1]) is DrainTrigger.INTERVAL
    assert schedule.due(101.2, [0, 1]) is None


def test_a_new_assignment_makes_the_drain_due_at_once():
    """After an outage the replica gets its partitions back with a round due: the parked
    sends of those partitions go first, not after the round (seconds on a backlog)."""
    schedule = DrainSchedule(interval_seconds=1.0)
    schedule.due(100.0, [])  # during the outage: nothing owned
    assert schedule.due(100.3, [0, 1]) is DrainTrigger.ASSIGNED
    assert schedule.due(100.4, [0, 1]) is None
    assert schedule.due(100.5, [1]) is DrainTrigger.ASSIGNED  # a rebalance took one away
    assert schedule.due(101.5, [1]) is DrainTrigger.INTERVAL
