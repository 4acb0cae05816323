"""When Kafka itself could take the relay's transactions, from the metadata and the run's faults."""

from __future__ import annotations

from outbox_devtools.chaos.writability import (
    PartitionState,
    concerned_partitions,
    coordinator_partition,
    unwritable_intervals,
    unwritable_reason,
)

WRITTEN = frozenset({"real", "__transaction_state"})


def test_a_partition_led_by_a_node_the_run_downed_is_not_writable_before_the_controller_notices():
    partitions = [PartitionState("op", 0, leader=2, in_sync=frozenset({1, 2, 3}))]
    assert unwritable_reason(partitions, WRITTEN, 2, frozenset()) is None
    assert unwritable_reason(partitions, WRITTEN, 2, frozenset({2})) == "op[0] has no live leader"
    orphan = [PartitionState("op", 1, leader=-1, in_sync=frozenset())]
    assert unwritable_reason(orphan, WRITTEN, 2, frozenset()) == "op[1] has no live leader"


def test_a_written_topic_needs_min_in_sync_live_replicas_and_a_read_one_does_not():
    caught_up = PartitionState("real", 0, leader=1, in_sync=frozenset({1, 3}))
    behind = PartitionState("real", 0, leader=1, in_sync=frozenset({1}))
    read_only = PartitionState("op", 0, leader=1, in_sync=frozenset({1}))
    assert unwritable_reason([caught_up, read_only], WRITTEN, 2, frozenset()) is None
    assert unwritable_reason([behind], WRITTEN, 2, frozenset()) == "real[0] has 1 of 2 in sync"
    # a frozen node still listed in sync does not count
    assert (
        unwritable_reason([caught_up], WRITTEN, 2, frozenset({3})) == "real[0] has 1 of 2 in sync"
    )


def test_a_written_partition_waits_for_a_downed_follower_until_it_leaves_the_in_sync_set():
    # acks=all: the leader acknowledges once every replica in sync has the write, so a
    # frozen or killed follower still listed there holds every write to the partition
    # (until the controller fences its node), however many live replicas are in sync.
    listed = PartitionState("real", 0, leader=1, in_sync=frozenset({1, 2, 3}))
    dropped = PartitionState("real", 0, leader=1, in_sync=frozenset({1, 2}))
    assert unwritable_reason([listed], WRITTEN, 2, frozenset({3})) == (
        "real[0] waits for node 3, down but in sync"
    )
    assert unwritable_reason([dropped], WRITTEN, 2, frozenset({3})) is None
    read_only = PartitionState("op", 0, leader=1, in_sync=frozenset({1, 2, 3}))
    assert unwritable_reason([read_only], WRITTEN, 2, frozenset({3})) is None


def test_unwritable_stretches_run_from_the_first_bad_sample_to_the_next_good_one():
    samples = [(1.0, True), (1.25, False), (1.5, False), (1.75, True), (2.0, False)]
    assert unwritable_intervals(samples) == [(1.25, 1.75), (2.0, 2.0)]
    assert unwritable_intervals([(1.0, True), (1.25, True)]) == []
    assert unwritable_intervals([]) == []


def test_a_coordinator_partition_is_the_one_kafka_hashes_the_key_to():
    """Kafka's ``Utils.abs(key.hashCode()) % partitions``, as Java 17 computes it: overflow,
    the one hash whose absolute value overflows too, and UTF-16 code units."""
    assert [
        coordinator_partition(key, 50)
        for key in (
            "hello",
            "chaos.checker.relay",
            "chaos.checker.relay.checker-1",
            "polygenelubricants",  # hashCode() == Integer.MIN_VALUE
            "ünïcode-é",
        )
    ] == [22, 22, 9, 0, 42]


def test_only_the_coordinators_partitions_of_an_internal_topic_concern_the_relay():
    """A leaderless partition of ``__consumer_offsets`` that coordinates no group of the
    relay's takes none of its writes: the stall then is ours, not Kafka's."""
    theirs = PartitionState("__consumer_offsets", 3, leader=-1, in_sync=frozenset())
    ours = PartitionState("__consumer_offsets", 22, leader=-1, in_sync=frozenset())
    real = PartitionState("real", 0, leader=1, in_sync=frozenset({1}))
    keys = {"__consumer_offsets": ("chaos.checker.relay",)}
    counts = {"__consumer_offsets": 50, "real": 1}
    assert concerned_partitions([theirs, real], keys, counts) == [real]
    assert concerned_partitions([theirs, ours, real], keys, counts) == [ours, real]
    assert concerned_partitions([theirs, real], {}, counts) == [theirs, real]
    assert concerned_partitions([theirs, real], keys, {}) == [theirs, real]  # count unknown
