"""The chaos run counts a failed send against Kafka only while a Kafka fault was under way."""

import time

from outbox_devtools.chaos.plan import Fault, FaultKind
from outbox_devtools.chaos.processes import ProducerProcess, SendCounts
from outbox_devtools.chaos.run import AWAY_MARGIN_SECONDS, Cluster, FaultEvent
from outbox_devtools.chaos.worker import WorkerConfig


def _producer(tmp_path, failures: list[tuple[float, int]]) -> ProducerProcess:
    config = WorkerConfig("b:9092", "chaos", "orders", "sqlite://", 0, 0, 1, 1, 0, 0, 0, 0, 20, {})
    producer = ProducerProcess(config, tmp_path)
    producer.failures.extend(failures)
    return producer


def _event(kind: FaultKind, began: float, ended: float | None) -> FaultEvent:
    event = FaultEvent(Fault(0.5, kind, 0, 20.0), 0.0, "broker", time.monotonic())
    event.began_wall, event.ended_wall = began, ended
    return event


def test_failures_during_a_kafka_fault_or_just_after_it_count_and_others_do_not(tmp_path):
    failures = [
        (99.0, 1),  # before the fault
        (105.0, 2),  # during it
        (130.0 + AWAY_MARGIN_SECONDS - 0.1, 4),  # a send that started during it, ended after
        (130.0 + AWAY_MARGIN_SECONDS + 1, 8),  # long after it
    ]
    cluster = Cluster(None, [], [_producer(tmp_path, failures)])  # type: ignore[arg-type]
    cluster.events = [
        _event(FaultKind.KAFKA_AWAY, 100.0, 130.0),
        _event(FaultKind.KILL_PRODUCER, 90.0, 140.0),  # not a Kafka fault
    ]
    assert cluster.failed_while_kafka_away() == 6
    cluster.events.append(_event(FaultKind.FREEZE_BROKER, 135.5, None))  # still under way
    assert cluster.failed_while_kafka_away() == 14


def test_a_producers_counts_add_up_across_its_incarnations():
    assert SendCounts(5, 1, 2) + SendCounts(3, 0, 1) == SendCounts(8, 1, 3)
