"""A network of our own for the chaos run: hosts that can be cut from each other while they run.

Kills, stops and freezes end or pause a process; a network partition leaves both
sides running, each sure it is the one that is right. That is how a zombie is made:
a relay or a round writer that still believes it owns its partitions while the
brokers have given them to another replica. To cut links between processes on one
machine, each process runs in a network namespace of its own (a "host"), made here
with iproute2 and removed when the run ends:

- one namespace per host (``oxchaos<pid>-b1``, ``-c0``, ``-p0``, ...) and one *hub*
  namespace that routes between them (``net.ipv4.ip_forward`` is set in the hub's
  namespace only, never in the machine's);
- each host and the machine's own namespace (the controller, the Spark sink, the
  database) joined to the hub by a veth pair on a /30 of ``10.213.<n>.0/24``, a range
  that exists only inside these namespaces: no packet leaves the machine;
- a cut is a pair of ``blackhole`` policy rules in the hub (``from A to B`` and back):
  the packets are dropped in transit, silently, with no ICMP answer, so a connection
  hangs and a connect times out, as across a real partition, rather than being
  refused (which a client would notice at once); healing removes the rules.

The database is not on this network: namespaced processes reach PostgreSQL through
its Unix socket (the filesystem is shared), so a cut never touches it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType

log = logging.getLogger(__name__)

NAME_PREFIX = "oxchaos"
"""Every namespace this module makes is named ``oxchaos<pid>-<host>``: leftovers of a run that
died (its pid gone) are found by this name and removed by the next one, nothing else."""
ROOT_LINK_PREFIX = "oxc"
"""The machine's end of its veth pair to the hub, ``oxc<pid>`` (a link name has 15 bytes)."""
SUBNET_BASE = "10.213"
FIRST_RULE_PREF = 1000
HOSTS_PER_SUBNET = 63
"""A /24 holds 64 /30 links; the last one is the machine's."""
COMMAND_TIMEOUT = 20.0


class NetworkUnavailableError(RuntimeError):
    """Namespaces cannot be made here (not root, no iproute2, a command refused)."""


@dataclass(frozen=True)
class Cut:
    """Links dropped in both directions, between each pair of hosts, until healed."""

    pairs: tuple[tuple[str, str], ...]
    pref: int
    """The hub's rule priority of this cut's rules: unique per cut, so heal removes only them."""


def unavailable_reason() -> str | None:
    """Why this machine cannot make the chaos network, or None when it can."""
    if os.geteuid() != 0:
        return "network partitions need root (network namespaces and veth pairs)"
    if shutil.which("ip") is None:
        return "network partitions need iproute2 ('ip' is not on PATH)"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """One iproute2 command; a failure names the command and what ip said."""
    result = subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False
    )
    if check and result.returncode != 0:
        raise NetworkUnavailableError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_leftovers() -> list[str]:
    """Remove the namespaces (and root links) of chaos networks whose run is gone.

    A run killed with SIGKILL cannot clean up; its namespaces would stay, and its
    root link with the route to its subnet. Only names of this module's pattern
    whose pid is no longer alive are touched.
    """
    removed: list[str] = []
    listed = _ip("netns", "list", check=False).stdout
    pattern = re.compile(rf"^({NAME_PREFIX}(\d+)-\S+)")
    for line in listed.splitlines():
        found = pattern.match(line)
        if found and not _pid_alive(int(found.group(2))):
            _ip("netns", "del", found.group(1), check=False)
            removed.append(found.group(1))
    links = _ip("-o", "link", "show", check=False).stdout
    for name, pid in re.findall(rf"^\d+: ({ROOT_LINK_PREFIX}(\d+))@", links, re.MULTILINE):
        if not _pid_alive(int(pid)):
            _ip("link", "del", name, check=False)
            removed.append(name)
    return removed


class ChaosNetwork:
    """Hosts in namespaces behind one hub, each reachable from the machine, cut on demand."""

    def __init__(self, hosts: Sequence[str], *, owner_pid: int | None = None) -> None:
        """``hosts``: short names (``b1``, ``c0``, ``p2``); nothing exists until :meth:`create`."""
        if len(set(hosts)) != len(hosts) or len(hosts) > HOSTS_PER_SUBNET:
            raise ValueError(f"up to {HOSTS_PER_SUBNET} distinct host names, not {list(hosts)}")
        self.hosts = list(hosts)
        self.pid = owner_pid if owner_pid is not None else os.getpid()
        self.subnet: str | None = None
        """``10.213.<n>``, chosen by :meth:`create` among the ones the machine does not route."""
        self._created: list[str] = []
        self._next_pref = FIRST_RULE_PREF
        self._cuts: list[Cut] = []

    # -- names and addresses

    def namespace(self, host: str) -> str:
        return f"{NAME_PREFIX}{self.pid}-{host}"

    @property
    def hub(self) -> str:
        return self.namespace("hub")

    @property
    def root_link(self) -> str:
        return f"{ROOT_LINK_PREFIX}{self.pid}"

    def address(self, host: str) -> str:
        """The host's own address, where its servers listen and its clients come from."""
        return self._address(self.hosts.index(host), 2)

    def _address(self, link: int, end: int) -> str:
        """Link ``link``'s /30: ``end`` 1 is the hub's side, 2 the host's."""
        if self.subnet is None:
            raise NetworkUnavailableError("the chaos network is not created")
        return f"{self.subnet}.{4 * link + end}"

    def launcher(self, host: str) -> list[str]:
        """The command prefix that runs a program on ``host`` (same pid: signals reach it)."""
        return ["ip", "netns", "exec", self.namespace(host)]

    # -- lifecycle

    def create(self) -> ChaosNetwork:
        """Make the hub, the hosts and the machine's link; on any failure remove what was made."""
        reason = unavailable_reason()
        if reason is not None:
            raise NetworkUnavailableError(reason)
        sweep_leftovers()
        self.subnet = self._free_subnet()
        try:
            self._add_namespace(self.hub)
            _ip("netns", "exec", self.hub, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            for index, host in enumerate(self.hosts):
                self._add_host(index, host)
            root = HOSTS_PER_SUBNET
            _ip(
                "link",
                "add",
                self.root_link,
                "type",
                "veth",
                "peer",
                "name",
                "h-root",
                "netns",
                self.hub,
            )
            self._up(self.hub, "h-root", f"{self._address(root, 1)}/30")
            _ip("addr", "add", f"{self._address(root, 2)}/30", "dev", self.root_link)
            _ip("link", "set", self.root_link, "up")
            _ip("route", "add", f"{self.subnet}.0/24", "via", self._address(root, 1))
        except BaseException:
            self.close()
            raise
        log.info("chaos network %s.0/24: hosts %s", self.subnet, ", ".join(self.hosts))
        return self

    def _free_subnet(self) -> str:
        """A /24 of 10.213/16 the machine neither routes nor has an address in."""
        taken = _ip("-4", "route", "show", "table", "all", check=False).stdout
        taken += _ip("-4", "addr", check=False).stdout
        for step in range(256):
            candidate = f"{SUBNET_BASE}.{(self.pid + step) % 256}"
            if f"{candidate}." not in taken:
                return candidate
        raise NetworkUnavailableError(f"no free /24 left in {SUBNET_BASE}.0.0/16")

    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self._created.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _add_host(self, index: int, host: str) -> None:
        namespace = self.namespace(host)
        self._add_namespace(namespace)
        port = f"h-{host}"
        _ip(
            "link",
            "add",
            port,
            "netns",
            self.hub,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            namespace,
        )
        self._up(self.hub, port, f"{self._address(index, 1)}/30")
        self._up(namespace, "eth0", f"{self._address(index, 2)}/30")
        _ip("-n", namespace, "route", "add", "default", "via", self._address(index, 1))

    @staticmethod
    def _up(namespace: str, link: str, address: str) -> None:
        _ip("-n", namespace, "addr", "add", address, "dev", link)
        _ip("-n", namespace, "link", "set", link, "up")

    def close(self) -> None:
        """Delete every namespace made (their veth pairs, the root link and its route go too)."""
        for name in reversed(self._created):
            _ip("netns", "del", name, check=False)
        self._created.clear()
        with contextlib.suppress(NetworkUnavailableError, OSError, subprocess.SubprocessError):
            if _ip("link", "show", self.root_link, check=False).returncode == 0:
                _ip("link", "del", self.root_link, check=False)

    def __enter__(self) -> ChaosNetwork:
        return self.create()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- partitions

    def cut(self, host: str, peers: Iterable[str]) -> Cut:
        """Drop every packet between ``host`` and each of ``peers``, both ways, in the hub."""
        pairs = tuple((host, peer) for peer in peers if peer != host)
        cut = Cut(pairs, self._next_pref)
        self._next_pref += 1
        for one, other in pairs:
            for source, target in ((one, other), (other, one)):
                _ip("-n", self.hub, "rule", "add", *self._rule(source, target, cut.pref))
        self._cuts.append(cut)
        return cut

    def heal(self, cut: Cut) -> None:
        """Remove the cut's rules: packets flow again (a connection that hung may resume)."""
        for one, other in cut.pairs:
            for source, target in ((one, other), (other, one)):
                _ip(
                    "-n",
                    self.hub,
                    "rule",
                    "del",
                    *self._rule(source, target, cut.pref),
                    check=False,
                )
        if cut in self._cuts:
            self._cuts.remove(cut)

    def heal_all(self) -> None:
        for cut in list(self._cuts):
            self.heal(cut)

    def _rule(self, source: str, target: str, pref: int) -> list[str]:
        return [
            "from",
            self.address(source),
            "to",
            self.address(target),
            "blackhole",
            "pref",
            str(pref),
        ]
