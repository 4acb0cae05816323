"""When a chaos run's broker fault on a cluster may fire, and which waits count against
its patience (:data:`BROKER_FAULT_WAIT_SECONDS`) before it is skipped."""

import time

from rich.console import Console

from outbox_devtools.chaos.plan import Fault, FaultKind
from outbox_devtools.chaos.processes import CheckerProcess, Pause
from outbox_devtools.chaos.run import Cluster, FaultEvent, fire
from outbox_devtools.kafka import LocalKafka, LocalKafkaCluster


def _cluster(kafka) -> Cluster:
    return Cluster(kafka, [], [])


def test_a_broker_fault_behind_another_fault_waits_without_spending_its_patience(tmp_path):
    """A rolling restart on a loaded machine took 180 s; the broker faults queued behind it
    spent their patience on it and were skipped (the suite's short run then failed)."""
    cluster = _cluster(LocalKafkaCluster(tmp_path / "kafka", nodes=3))
    restart = FaultEvent(Fault(0.07, FaultKind.ROLLING_RESTART, 0, 0.0), 4.0, "every node", 0.0)
    restart.steps = iter(())
    cluster.events.append(restart)
    kill = Fault(0.68, FaultKind.KILL_BROKER, 1, 1.5)
    blocker = cluster.waits_for(kill)
    assert blocker is not None and not blocker.patience_runs
    assert "every node is not back from" in blocker.reason

    restart.back_after = 180.0  # over: now the cluster itself must come back in sync
    blocker = cluster.waits_for(kill)
    assert blocker is not None and blocker.patience_runs
    assert blocker.reason == "a node is not running"  # nothing was started here


def test_on_one_broker_and_for_other_kinds_nothing_waits(tmp_path):
    single = _cluster(LocalKafka(tmp_path / "kafka"))
    assert single.waits_for(Fault(0.5, FaultKind.KILL_BROKER, 1, 1.5)) is None
    cluster = _cluster(LocalKafkaCluster(tmp_path / "cluster", nodes=3))
    cluster.events.append(
        FaultEvent(Fault(0.1, FaultKind.KILL_BROKER, 1, 1.5), 1.0, "node 1", time.monotonic())
    )
    assert cluster.waits_for(Fault(0.5, FaultKind.KILL_PRODUCER, 0, 1.0)) is None


def test_a_drain_freeze_waits_for_its_kafka_outage_to_strike(tmp_path):
    """Armed before its outage (a cluster's outage waits for the last node fault), it caught
    a drain of rows parked by another fault: it must wait, without spending any patience."""
    for kafka in (LocalKafka(tmp_path / "one"), LocalKafkaCluster(tmp_path / "three", nodes=3)):
        cluster = _cluster(kafka)
        away = Fault(0.61, FaultKind.KAFKA_AWAY, 2, 20.1)
        frozen = Fault(0.61, FaultKind.FREEZE_DRAINING_CHECKER, 0, 9.0)
        blocker = cluster.waits_for(frozen, [away, frozen])
        assert blocker is not None and not blocker.patience_runs
        assert blocker.reason.startswith("Kafka away") and blocker.reason.endswith("not struck")
        assert cluster.waits_for(frozen, [frozen]) is None  # struck (or skipped): armed now


def test_a_drain_freeze_arms_every_replica_even_one_down(tmp_path):
    """Seed 8111 armed only checker 0: checker 1 was down from a mid-chunk kill when Kafka
    went away, and back 1.7 s later; had it owned the parked rows, no drain was seen."""
    checkers = [CheckerProcess(n, {}, tmp_path) for n in range(2)]
    cluster = Cluster(LocalKafka(tmp_path / "kafka"), checkers, [])
    assert not any(checker.alive for checker in checkers)
    fire(cluster, Fault(0.61, FaultKind.FREEZE_DRAINING_CHECKER, 0, 9.0), Console(quiet=True))
    (drain,) = cluster.armed_drains
    assert drain.checkers == [0, 1]
    assert all(checker.arm_files[Pause.DRAIN].exists() for checker in checkers)
