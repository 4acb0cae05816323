"""The shortened chaos run: every fault kind once, real processes, every invariant holds.

``make chaos`` runs the full size (10 000 transactions, 16 faults); this is the
same controller with fewer transactions and one fault of each kind, so that
``make test`` proves on every change that a producer (also one caught answering a
check-back), a checker replica, every checker replica at once and the broker can
die mid-transaction, and the broker and a checker can freeze (SIGSTOP) for 10-20 s,
without losing or inventing an event. It runs on a three-node cluster, which adds a
rolling restart of every node and kills of a half partition's leader and of a relay's
transaction coordinator.
"""

import re

import pytest

from tests.chaos.support import chaos

pytestmark = [pytest.mark.kafka, pytest.mark.postgres]

SEED = 1
"""Its plan: kill -9 a producer answering a check (armed at 7%), a producer at 16%, a checker
at 45%, all checkers at 66% (down 10 s), the broker (kill -9) at 68%. The broker faults strike
node 1, and the cluster's own come first: a rolling restart at 7% (the broker
faults after it wait until it is over), the leader of half partition 3 at 48%, the relay
coordinator of checker #0 at 83%."""
CLUSTER_FAULTS = (
    "kill -9 node 1",
    "freeze node 1",
    "rolling restart of every node",
    "(leader of chaos.half[3])",
    "(coordinator of chaos.checker.relay.checker-0)",
)


@pytest.mark.timeout(900)
def test_a_short_chaos_run_loses_nothing_and_shows_nothing_rolled_back(tmp_path):
    """The producers answer the checks, the sink MERGEs into a Delta table (idempotent
    batches, MERGE de-duplication), on a three-node cluster: one run, every fault kind.

    One run, not one per choice: the suite's time is short. The choices left out here
    have their own proofs: the Parquet sink's window de-duplication under faults in
    tests/spark_sink, answers from the transaction log (``--resolve-from-db``) with real
    checker processes in tests/checker/test_resolve_from_db.py, the single broker's
    kill and freeze in tests/checker/test_outage.py; ``make chaos`` runs them all at
    full size (``SINK=``, ``BROKERS=``)."""
    result = chaos(
        f"--seed={SEED}",
        "--transactions=800",
        "--threads=2",
        "--producer-kills=1",
        "--checker-kills=1",
        "--broker-restarts=1",
        f"--work-dir={tmp_path}",
        "--no-resolve-from-db",
        "--sink-format=delta",
        "--brokers=3",
        "--discard-cycles=0",
        timeout=840,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    last = result.stdout.strip().splitlines()[-1]
    found = re.fullmatch(
        rf"chaos: seed={SEED} transactions=(\d+) committed=(\d+) lost=0 phantom=0 "
        r"duplicates_in_sink=0 raw_duplicates=(\d+) pending=0 orphans_published=0 "
        r"publication_stall_s=([\d.]+) writable_stall_s=([\d.]+)",
        last,
    )
    assert found, last
    transactions, committed, _ = map(int, found.groups()[:3])
    assert transactions >= 800
    assert 0 < committed < transactions  # some orders were refused and rolled back
    faults = (
        "kill -9 producer 0",
        "kill -9 checker",
        "kill -9 all checkers",
        "freeze checker",
        *CLUSTER_FAULTS,
    )
    for fault in faults:
        assert fault in output, f"the fault {fault!r} never fired"
    orphaned = re.search(r"orphaned attempts of reused ids \(halves\)\s*│\s*(\d+)", output)
    assert orphaned and int(orphaned.group(1)) > 0, "no transaction id was reused"
    answered = re.findall(r"kill -9 producer \d+ while it answered a check", output)
    # In 800 transactions the first check may come late (a run whose checkers and
    # broker all went down early): the fault then says so, and the run must still
    # hold. The full `make chaos` runs show it striking at every seed.
    assert answered or "no check seen" in output, "the answering-producer fault never ran"
    mid_chunk = re.findall(r"kill -9 checker \d+ inside a chunk's transaction", output)
    assert mid_chunk or "no chunk seen" in output, "the mid-chunk checker kill never ran"
    comebacks = re.findall(
        r"(producer \d+|checker \d+|all checkers|broker|node \d+[^\n]*?|every node) back \(",
        output,
    )
    assert len(comebacks) == 9 + len(answered) + len(mid_chunk), (
        f"every killed or frozen process must have come back: {comebacks}"
    )
    stalls = re.findall(r"│ +(\d+\.\d)s │\n", output)
    assert len(stalls) == len(comebacks), "each fault's publication stall is reported"
