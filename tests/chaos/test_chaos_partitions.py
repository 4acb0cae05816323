"""A short chaos run whose only faults are network partitions, on a three-node cluster.

``tests/chaos/test_chaos_run.py`` kills, stops and freezes; this run cuts links while
both sides keep running (``--network-partitions``): a checker replica cut from every
broker past its session (its partitions move to the other replica while it still
believes it owns them: a zombie relay or round writer would publish twice or skip a
half), a producer cut in the middle of its sends, one node cut from the other two (a
minority that clients still reach), and a half partition's leader cut from its
followers. Every invariant must hold as under the other faults.

Needs root (network namespaces); without it the run refuses with one line, which
the test checks instead.
"""

import io
import os
import re
import subprocess

import pytest
from rich.console import Console

from outbox_devtools.chaos import run as chaos_run
from outbox_devtools.chaos.settings import ChaosSettings
from tests.chaos.support import NO_CLUSTER_FAULTS, NO_DEFAULT_FAULTS, chaos

pytestmark = [pytest.mark.kafka, pytest.mark.postgres]

SEED = 41
"""Its plan: the leader of half partition 1 cut from its followers at 6 % (16.6 s), checker #0
cut from every broker at 32 % (23.5 s), node 3 cut from the other nodes at 36 % (17.6 s, once
the cluster is in sync again), producer #2 cut from every broker at 36 % (10.5 s)."""
ONLY_CUTS = (*NO_DEFAULT_FAULTS, *NO_CLUSTER_FAULTS)


@pytest.mark.timeout(600)
def test_partitions_of_a_checker_a_producer_a_minority_node_and_a_leader_lose_nothing(tmp_path):
    result = chaos(
        f"--seed={SEED}",
        "--transactions=500",
        "--threads=2",
        "--brokers=3",
        "--network-partitions",
        f"--work-dir={tmp_path}",
        *ONLY_CUTS,
        timeout=540,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]
    last = result.stdout.strip().splitlines()[-1]
    found = re.fullmatch(
        rf"chaos: seed={SEED} transactions=(\d+) committed=(\d+) lost=0 phantom=0 "
        r"duplicates_in_sink=0 raw_duplicates=0 pending=0 orphans_published=0 "
        r"publication_stall_s=([\d.]+) writable_stall_s=([\d.]+)",
        last,
    )
    assert found, last
    for cut in (
        "cut checker 0 from every broker",
        "cut producer 2 from every broker",
        "cut node 3 from the other nodes",
        "(leader of chaos.half[1]) from its followers",
    ):
        assert cut in output, f"the partition {cut!r} never happened"
    healed = re.findall(r"(producer \d+|checker \d+|node \d+[^\n]*?) healed \(", output)
    assert len(healed) == 4, f"every cut must have healed: {healed}"
    named = re.search(r"in namespaces (oxchaos\d+-)\*", output)
    assert named, "the run did not say where its hosts were"
    assert named.group(1) not in _namespaces(), "a namespace was left behind"


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_without_root_the_run_refuses_partitions_in_one_line(
    tmp_path, monkeypatch: pytest.MonkeyPatch
):
    """As any user but root: one whole line (at any width) and exit 2, before anything starts.
    The user id is faked for the check alone (the suite runs as root, and a real other user
    could not read the work tree); the run's own entry point does the rest."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    console = Console(file=io.StringIO(), width=40)
    settings = ChaosSettings(network_partitions=True, work_dir=str(tmp_path))
    assert chaos_run.run(console, settings) == 2
    printed = console.file.getvalue()
    assert printed.splitlines() == [
        "chaos: refused: network partitions need root (network namespaces and veth pairs);"
        " run without --network-partitions"
    ]
    assert list(tmp_path.iterdir()) == []
