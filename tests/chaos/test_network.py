"""The chaos run's network: hosts in namespaces reach each other and the machine until cut.

A cut must be a partition, not a refusal: the packets vanish in transit, so a
connect waits out its timeout (as across a real partition) instead of failing at
once with ``ECONNREFUSED`` or ``EHOSTUNREACH``, which a client would notice and
handle. Needs root and iproute2; without them the test says so.
"""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from outbox_devtools.chaos.network import NAME_PREFIX, ChaosNetwork

pytestmark = pytest.mark.kafka  # needs root and iproute2, as CI has: fails, never skips, without

PORT = 9092
CONNECT = (
    "import socket, sys, time\n"
    "began = time.monotonic()\n"
    "try:\n"
    "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1.5).close()\n"
    "    print('connected')\n"
    "except TimeoutError:\n"
    "    print(f'timed out after {time.monotonic() - began:.1f}s')\n"
    "except OSError as exc:\n"
    "    print(f'refused: {exc}')\n"
)


def _connect_from(network: ChaosNetwork, host: str, target: str) -> str:
    """What a TCP connect from ``host`` to ``target``'s listener does."""
    argv = [*network.launcher(host), sys.executable, "-c", CONNECT, network.address(target)]
    result = subprocess.run([*argv, str(PORT)], capture_output=True, text=True, timeout=30)
    return result.stdout.strip() or result.stderr.strip()


def _namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def test_a_cut_drops_packets_silently_both_ways_and_healing_restores_the_link():
    network = ChaosNetwork(["b1", "c0", "p0"])
    with network:
        server = subprocess.Popen(
            [
                *network.launcher("b1"),
                sys.executable,
                "-c",
                "import socket, sys\n"
                "s = socket.create_server((sys.argv[1], int(sys.argv[2])))\n"
                "print('ready', flush=True)\n"
                "while True:\n"
                "    s.accept()[0].close()\n",
                network.address("b1"),
                str(PORT),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert server.stdout is not None and server.stdout.readline().strip() == "ready"
            assert _connect_from(network, "c0", "b1") == "connected"
            cut = network.cut("c0", ["b1"])
            assert _connect_from(network, "c0", "b1").startswith("timed out")
            # Only the cut pair: another host and the machine itself still reach the broker.
            assert _connect_from(network, "p0", "b1") == "connected"
            socket.create_connection((network.address("b1"), PORT), timeout=5).close()
            network.heal(cut)
            assert _connect_from(network, "c0", "b1") == "connected"
        finally:
            server.kill()
            server.wait()
    assert f"{NAME_PREFIX}{network.pid}-" not in _namespaces(), "a namespace was left behind"


def test_the_namespaces_of_a_run_that_died_are_swept_by_the_next():
    """A run killed with SIGKILL leaves its namespaces; the next run removes them (and only
    those whose pid is gone)."""
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    leftover = ChaosNetwork(["c0"], owner_pid=int(dead.stdout))
    leftover.create()
    try:
        assert leftover.namespace("c0") in _namespaces()
        with ChaosNetwork(["c0"]):
            assert leftover.namespace("c0") not in _namespaces()
            assert leftover.hub not in _namespaces()
    finally:
        leftover.close()
