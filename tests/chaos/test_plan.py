"""The fault schedule is a pure function of its seed, inside the run's fault window."""

from outbox_devtools.chaos.plan import FIRST_FAULT_AT, LAST_FAULT_AT, FaultKind, fault_plan

SIZES = {
    "producers": 4,
    "checkers": 2,
    "producer_kills": 6,
    "checker_kills": 2,
    "checker_outages": 1,
    "answering_producer_kills": 1,
}


def test_the_same_seed_gives_the_same_plan_and_another_seed_another():
    assert fault_plan(7, broker_restarts=2, **SIZES) == fault_plan(7, broker_restarts=2, **SIZES)
    assert fault_plan(7, broker_restarts=2, **SIZES) != fault_plan(8, broker_restarts=2, **SIZES)


def test_the_plan_has_every_fault_asked_for_in_firing_order_within_the_window():
    plan = fault_plan(3, broker_restarts=3, **SIZES)
    kinds = [fault.kind for fault in plan]
    assert kinds.count(FaultKind.KILL_PRODUCER) == 6
    assert kinds.count(FaultKind.KILL_CHECKER) == 2
    assert kinds.count(FaultKind.STOP_BROKER) + kinds.count(FaultKind.KILL_BROKER) == 3
    assert kinds.count(FaultKind.KILL_ALL_CHECKERS) == 1
    assert kinds.count(FaultKind.KILL_ANSWERING_PRODUCER) == 1
    shares = [fault.at_share for fault in plan]
    assert shares == sorted(shares)
    assert all(FIRST_FAULT_AT <= share <= LAST_FAULT_AT for share in shares)
    producer_kinds = (FaultKind.KILL_PRODUCER, FaultKind.KILL_ANSWERING_PRODUCER)
    assert all(0 <= f.target < 4 for f in plan if f.kind in producer_kinds)
    assert all(0 <= f.target < 2 for f in plan if f.kind is FaultKind.KILL_CHECKER)


def test_broker_outages_alternate_between_a_clean_stop_and_a_kill():
    kinds = [
        f.kind
        for f in fault_plan(5, broker_restarts=2, **SIZES)
        if f.kind in (FaultKind.STOP_BROKER, FaultKind.KILL_BROKER)
    ]
    assert sorted(kinds) == [FaultKind.KILL_BROKER, FaultKind.STOP_BROKER]


def test_the_new_kinds_are_drawn_per_seed_and_their_counts_are_honoured():
    sizes = {**SIZES, "checker_outages": 3, "answering_producer_kills": 2}
    plan = fault_plan(11, broker_restarts=0, **sizes)
    assert plan == fault_plan(11, broker_restarts=0, **sizes)
    outages = [f for f in plan if f.kind is FaultKind.KILL_ALL_CHECKERS]
    answering = [f for f in plan if f.kind is FaultKind.KILL_ANSWERING_PRODUCER]
    assert len(outages) == 3 and len(answering) == 2
    assert all(10.0 <= f.down_seconds <= 20.0 for f in outages)
    assert fault_plan(11, broker_restarts=0, **{**sizes, "checker_outages": 0}) == [
        f for f in plan if f.kind is not FaultKind.KILL_ALL_CHECKERS
    ]


def test_adding_the_new_kinds_leaves_the_older_faults_of_a_seed_where_they_were():
    """Seeds quoted in tests and issues keep meaning the same kills."""
    older = fault_plan(
        1, broker_restarts=1, **{**SIZES, "checker_outages": 0, "answering_producer_kills": 0}
    )
    plan = fault_plan(1, broker_restarts=1, **SIZES)
    assert [f for f in plan if f in older] == older


def test_freezes_pause_the_broker_or_one_checker_for_10_to_20_seconds():
    plan = fault_plan(13, broker_restarts=2, broker_freezes=2, checker_freezes=3, **SIZES)
    broker = [f for f in plan if f.kind is FaultKind.FREEZE_BROKER]
    checker = [f for f in plan if f.kind is FaultKind.FREEZE_CHECKER]
    assert len(broker) == 2 and len(checker) == 3
    assert all(10.0 <= f.down_seconds <= 20.0 for f in broker + checker)
    assert all(0 <= f.target < 2 for f in checker)
    assert all(f.kind.verb == "freeze" and f.kind.freezes for f in broker + checker)
    assert checker[0].describe().startswith("freeze checker #")
    without = fault_plan(13, broker_restarts=2, **SIZES)
    assert without == [f for f in plan if not f.kind.freezes]


CLUSTER = {"brokers": 3, "partitions": 4}


def test_a_single_broker_plan_is_the_same_whatever_the_cluster_counts_say():
    """Seeds 1-4 of the one-broker runs keep meaning the same faults."""
    plan = fault_plan(1, broker_restarts=1, broker_freezes=1, **SIZES)
    assert plan == fault_plan(
        1,
        broker_restarts=1,
        broker_freezes=1,
        rolling_restarts=1,
        half_leader_kills=1,
        coordinator_kills=1,
        **SIZES,
    )
    assert all(f.target == 0 for f in plan if f.kind.hits_a_broker)


def test_a_cluster_plan_adds_its_faults_and_strikes_seeded_nodes():
    counts = {"rolling_restarts": 1, "half_leader_kills": 2, "coordinator_kills": 1}
    plan = fault_plan(5, broker_restarts=2, broker_freezes=1, **SIZES, **CLUSTER, **counts)
    assert plan == fault_plan(5, broker_restarts=2, broker_freezes=1, **SIZES, **CLUSTER, **counts)
    kinds = [f.kind for f in plan]
    assert kinds.count(FaultKind.ROLLING_RESTART) == 1
    assert kinds.count(FaultKind.KILL_HALF_LEADER) == 2
    assert kinds.count(FaultKind.KILL_RELAY_COORDINATOR) == 1
    nodes = [f for f in plan if f.kind in (FaultKind.STOP_BROKER, FaultKind.KILL_BROKER)]
    assert len(nodes) == 2 and all(1 <= f.target <= 3 for f in nodes)
    assert all(0 <= f.target < 4 for f in plan if f.kind is FaultKind.KILL_HALF_LEADER)
    assert all(0 <= f.target < 2 for f in plan if f.kind is FaultKind.KILL_RELAY_COORDINATOR)
    shares = [f.at_share for f in plan]
    assert shares == sorted(shares)
    assert all(FIRST_FAULT_AT <= share <= LAST_FAULT_AT for share in shares)
    single = fault_plan(5, broker_restarts=2, broker_freezes=1, **SIZES)
    assert [(f.at_share, f.kind) for f in plan if f.kind.hits_a_broker is False] == [
        (f.at_share, f.kind) for f in single if f.kind.hits_a_broker is False
    ]


def test_cluster_faults_say_whom_they_strike():
    plan = fault_plan(
        6,
        broker_restarts=1,
        broker_freezes=1,
        rolling_restarts=1,
        half_leader_kills=1,
        coordinator_kills=1,
        **SIZES,
        **CLUSTER,
    )
    described = {f.kind: f.describe() for f in plan}
    assert described[FaultKind.ROLLING_RESTART] == "rolling restart of every node"
    assert described[FaultKind.KILL_HALF_LEADER].startswith("kill -9 half leader of partition ")
    assert described[FaultKind.KILL_RELAY_COORDINATOR].startswith(
        "kill -9 relay coordinator of checker #"
    )
    assert described[FaultKind.FREEZE_BROKER].startswith("freeze broker node ")


def test_mid_chunk_kills_strike_a_checker_and_leave_the_older_faults_where_they_were():
    for sizes in (SIZES, {**SIZES, **CLUSTER, "rolling_restarts": 1, "coordinator_kills": 1}):
        older = fault_plan(2, broker_restarts=1, **sizes)
        plan = fault_plan(2, broker_restarts=1, mid_chunk_kills=2, **sizes)
        kills = [f for f in plan if f.kind is FaultKind.KILL_CHECKER_MID_CHUNK]
        assert len(kills) == 2 and all(0 <= f.target < 2 for f in kills)
        assert [f for f in plan if f not in kills] == older
        assert kills[0].describe().startswith("kill -9 checker mid-chunk #")


def test_discard_cycles_are_drawn_last_and_leave_the_older_faults_where_they_were():
    older = fault_plan(2, broker_restarts=1, mid_chunk_kills=1, **SIZES)
    plan = fault_plan(2, broker_restarts=1, mid_chunk_kills=1, discard_cycles=2, **SIZES)
    cycles = [f for f in plan if f.kind is FaultKind.DISCARD_RESUME_CYCLE]
    assert len(cycles) == 2
    assert [f for f in plan if f not in cycles] == older
    assert all(f.describe() == "discard-and-resume cycle" for f in cycles)


CUTS = {"checker_cuts": 2, "producer_cuts": 1, "node_cuts": 1, "half_leader_cuts": 1}


def test_network_cuts_are_drawn_last_and_leave_the_older_faults_where_they_were():
    """Seeds quoted before --network-partitions keep meaning the same kills and freezes."""
    for sizes in (SIZES, {**SIZES, **CLUSTER, "rolling_restarts": 1, "coordinator_kills": 1}):
        older = fault_plan(4, broker_restarts=2, broker_freezes=1, mid_chunk_kills=1, **sizes)
        plan = fault_plan(
            4, broker_restarts=2, broker_freezes=1, mid_chunk_kills=1, **sizes, **CUTS
        )
        cuts = [f for f in plan if f.kind.cuts]
        assert [f for f in plan if not f.kind.cuts] == older
        assert all(f.kind.verb == "cut" and not f.kind.freezes for f in cuts)
        assert plan == fault_plan(
            4, broker_restarts=2, broker_freezes=1, mid_chunk_kills=1, **sizes, **CUTS
        )


def test_a_cut_checker_stays_cut_past_its_session_and_a_producer_mid_send():
    plan = fault_plan(9, broker_restarts=0, **SIZES, **CUTS)
    checkers = [f for f in plan if f.kind is FaultKind.CUT_CHECKER]
    producers = [f for f in plan if f.kind is FaultKind.CUT_PRODUCER]
    assert len(checkers) == 2 and len(producers) == 1
    assert all(10.0 <= f.down_seconds <= 25.0 and 0 <= f.target < 2 for f in checkers)
    assert all(5.0 <= f.down_seconds <= 15.0 and 0 <= f.target < 4 for f in producers)
    assert checkers[0].describe().startswith("cut checker #")
    assert (
        checkers[0]
        .describe()
        .endswith("from every broker, cut " + f"{checkers[0].down_seconds:.1f}s")
    )
    # One broker has no other node to be cut from: the node cuts need a cluster.
    assert not any(f.kind.cuts_nodes for f in plan)


def test_a_cluster_adds_a_minority_node_cut_and_a_leader_cut_from_its_followers():
    plan = fault_plan(9, broker_restarts=0, **SIZES, **CLUSTER, **CUTS)
    nodes = [f for f in plan if f.kind is FaultKind.CUT_NODE]
    leaders = [f for f in plan if f.kind is FaultKind.CUT_HALF_LEADER]
    assert len(nodes) == 1 and 1 <= nodes[0].target <= 3  # a node id
    assert len(leaders) == 1 and 0 <= leaders[0].target < 4  # a half partition
    assert all(f.kind.cuts_nodes and 10.0 <= f.down_seconds <= 20.0 for f in nodes + leaders)
    assert nodes[0].describe().startswith(f"cut node {nodes[0].target} from the other nodes")
    assert leaders[0].describe().startswith("cut half leader of partition ")
    single = fault_plan(9, broker_restarts=0, **SIZES, **CUTS)
    assert [f for f in plan if not f.kind.cuts_nodes] == single


def test_kafka_away_is_drawn_last_for_20_to_30_seconds_and_leaves_the_older_faults_alone():
    """Seeds quoted before --park-when-unavailable keep meaning the same faults."""
    for sizes in (SIZES, {**SIZES, **CLUSTER, "rolling_restarts": 1}):
        older = fault_plan(6, broker_restarts=2, broker_freezes=1, **sizes, **CUTS)
        plan = fault_plan(6, broker_restarts=2, broker_freezes=1, **sizes, **CUTS, kafka_outages=2)
        away = [f for f in plan if f.kind is FaultKind.KAFKA_AWAY]
        assert [f for f in plan if f.kind is not FaultKind.KAFKA_AWAY] == older
        assert len(away) == 2
        assert all(20.0 <= f.down_seconds <= 30.0 and f.kind.hits_a_broker for f in away)
        assert all(f.kind.verb == "kill -9" and not f.kind.freezes for f in away)


def test_a_drain_freeze_is_drawn_after_kafka_away_at_its_moment_and_leaves_the_rest_alone():
    """Armed as Kafka goes (parked rows exist only after), frozen past the 6 s session and
    within the round writer's 30 s transaction timeout; seeds quoted before keep their faults."""
    for sizes in (SIZES, {**SIZES, **CLUSTER}):
        older = fault_plan(6, broker_restarts=1, **sizes, **CUTS, kafka_outages=2)
        plan = fault_plan(6, broker_restarts=1, **sizes, **CUTS, kafka_outages=2, drain_freezes=5)
        frozen = [f for f in plan if f.kind is FaultKind.FREEZE_DRAINING_CHECKER]
        assert [f for f in plan if f not in frozen] == older
        away = [f for f in plan if f.kind is FaultKind.KAFKA_AWAY]
        assert len(frozen) == len(away) == 2  # one per outage at most
        assert sorted(f.at_share for f in frozen) == sorted(f.at_share for f in away)
        for fault in frozen:
            assert plan.index(fault) > plan.index(
                next(a for a in away if a.at_share == fault.at_share)
            )
            assert 8.0 <= fault.down_seconds <= 16.0 and fault.kind.freezes
            assert fault.describe().startswith("freeze draining checker (the first caught")
    assert not [
        f
        for f in fault_plan(6, broker_restarts=0, **SIZES, drain_freezes=1)
        if f.kind is FaultKind.FREEZE_DRAINING_CHECKER
    ], "no drain to freeze without Kafka away"


def test_kafka_away_kills_the_broker_or_a_majority_of_the_nodes():
    (single,) = [
        f
        for f in fault_plan(6, broker_restarts=0, **SIZES, kafka_outages=1)
        if f.kind is FaultKind.KAFKA_AWAY
    ]
    assert single.target == 0 and single.nodes(1) == (1,)
    assert single.describe() == f"Kafka away: the broker killed, down {single.down_seconds:.1f}s"
    for seed in range(20):
        (away,) = [
            f
            for f in fault_plan(seed, broker_restarts=0, **SIZES, **CLUSTER, kafka_outages=1)
            if f.kind is FaultKind.KAFKA_AWAY
        ]
        nodes = away.nodes(3)
        assert len(set(nodes)) == 2 and set(nodes) <= {1, 2, 3} and nodes[0] == away.target
        assert away.describe().startswith(f"Kafka away: a majority from node {away.target} killed")
    assert len(set(away.nodes(5))) == 3  # a majority of five
