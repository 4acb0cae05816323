"""A short chaos run with parking on: Kafka killed for 20-30 s while orders continue.

With ``--park-when-unavailable`` every producer parks a send whose half Kafka does
not take within ``park_after_seconds`` in the transaction log, in the order's own
database transaction, and the checker replicas (reading the log, ``--resolve-from-db``)
publish the parked sends once Kafka is back. The run kills the only broker for 20-30 s
in the middle of the orders: no send may fail while it is away, and every invariant
holds as under the other faults (each committed order landed once, no rolled-back one
visible, no half left pending, nothing left parked). ``make chaos PARK=1`` runs it at
full size with every other fault, and on three nodes (``BROKERS=3``) the fault kills a
majority of them.
"""

import re

import pytest

from tests.chaos.support import NO_DEFAULT_FAULTS, chaos

pytestmark = [pytest.mark.kafka, pytest.mark.postgres]

SEED = 3801
"""Its plan: Kafka away (the broker killed) at 40 % of the orders, for 27.8 s."""


@pytest.mark.timeout(600)
def test_orders_go_on_while_kafka_is_away_and_each_parked_one_lands_once(tmp_path):
    result = chaos(
        f"--seed={SEED}",
        "--transactions=800",
        "--threads=2",
        "--park-when-unavailable",
        f"--work-dir={tmp_path}",
        *NO_DEFAULT_FAULTS,
        timeout=540,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    assert "Kafka away: the broker killed, down 27.8s" in output
    assert re.search(r"broker back \(", output), "the broker never came back"
    last = result.stdout.strip().splitlines()[-1]
    found = re.fullmatch(
        rf"chaos: seed={SEED} transactions=(\d+) committed=(\d+) lost=0 phantom=0 "
        r"duplicates_in_sink=0 raw_duplicates=0 pending=0 orphans_published=0 "
        r"publication_stall_s=([\d.]+) writable_stall_s=([\d.]+) "
        r"parked_sends=(\d+) failed_sends_kafka_away=0",
        last,
    )
    assert found, last
    transactions, committed, parked = (int(found.group(n)) for n in (1, 2, 5))
    assert 0 < committed < transactions
    # Orders kept coming for the whole outage: hundreds of them were parked.
    assert parked >= 100, f"only {parked} sends were parked while the broker was away"
    failed = re.search(r"sends that failed \(raised\)\s*│\s*(\d+)", output)
    assert failed and failed.group(1) == "0", "a send failed with parking on"
