"""How long a checker group leaves partitions without an owner, per group protocol.

Two members built like the checker's (:func:`outbox_checker.membership.group_consumer_config`,
its default session timeout), each a process of its own so ``kill -9`` is real, over
one 8-partition topic on a local broker. Scenarios, each repeated:

- ``kill``: one member is killed for good; until the survivor owns every partition.
- ``restart``: one member is killed and started again at once with its instance id;
  until every partition has an owner again.
- ``rolling``: the same, but the member is stopped (SIGTERM: its consumer closes, as
  the checker's do) rather than killed.
- ``join``: a second member joins a lone one; the longest time a partition had no
  owner, from the members' own timestamps of what they gave up and were given.

``classic`` is the checker's protocol (eager ``range``); ``consumer`` is KIP-848, whose
session and heartbeat are the broker's (``group.consumer.*``): run it once on a broker
with the defaults and once with ``--broker-session-ms`` lowering them.

    python -m bench.group_protocol --repeats 3
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

PARTITIONS = 8


def member_main(bootstrap: str, topic: str, group: str, instance: str, protocol: str) -> None:
    """One member: prints ``{"t", "owned"}`` on every change, ``{"t", "error"}`` on errors.

    A fatal error (fenced, unreleased instance id) is met as the checker meets a fence:
    a fresh consumer with the same instance id.
    """
    from confluent_kafka import Consumer

    from outbox_checker.membership import group_consumer_config
    from outbox_checker.settings import CHECKER_DEFAULTS

    owned: set[int] = set()

    def say(**event: object) -> None:
        print(json.dumps({"t": time.time(), **event}), flush=True)

    def config() -> dict:
        conf = group_consumer_config(
            {"bootstrap.servers": bootstrap}, group, instance, CHECKER_DEFAULTS.session_timeout_ms
        )
        del conf["logger"]
        if protocol == "consumer":  # refused or ignored under KIP-848: the broker's
            for key in ("session.timeout.ms", "heartbeat.interval.ms"):
                del conf[key]
            del conf["partition.assignment.strategy"]
            conf["group.protocol"] = "consumer"
        return conf

    def assigned(consumer: Consumer, partitions: list) -> None:
        if protocol == "consumer":
            consumer.incremental_assign(partitions)
            owned.update(tp.partition for tp in partitions)
        else:
            consumer.assign(partitions)
            owned.clear()
            owned.update(tp.partition for tp in partitions)
        say(owned=sorted(owned))

    def revoked(consumer: Consumer, partitions: list) -> None:
        if protocol == "consumer":
            consumer.incremental_unassign(partitions)
            owned.difference_update(tp.partition for tp in partitions)
        else:
            consumer.unassign()
            owned.clear()
        say(owned=sorted(owned))

    def fresh() -> Consumer:
        consumer = Consumer(config())
        consumer.subscribe([topic], on_assign=assigned, on_revoke=revoked, on_lost=revoked)
        return consumer

    consumer = fresh()
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    say(started=True)
    while not stopping.is_set():
        message = consumer.poll(0.1)
        if message is None or message.error() is None:
            continue
        error = message.error()
        say(error=error.str(), fatal=error.fatal())
        if error.fatal():
            owned.clear()
            say(owned=[])
            threading.Thread(target=consumer.close, daemon=True).start()
            time.sleep(0.5)
            consumer = fresh()
    consumer.close()


@dataclass
class Member:
    """A member process and what it said, read in a thread."""

    instance: str
    proc: subprocess.Popen
    owned: set[int] = field(default_factory=set)
    events: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            event = json.loads(line)
            self.events.append(event)
            if "owned" in event:
                self.owned = set(event["owned"])

    def kill(self) -> float:
        self.proc.kill()
        at = time.time()
        self.proc.wait()
        self.owned = set()
        return at

    def errors(self) -> list[str]:
        return [e["error"] for e in self.events if "error" in e]


class Run:
    def __init__(self, bootstrap: str, protocol: str, tag: str) -> None:
        self.bootstrap, self.protocol = bootstrap, protocol
        self.topic = f"gp-{tag}"
        self.group = f"gp-{tag}.checker"
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(self.topic, PARTITIONS, 1)])[self.topic].result(30)

    def start(self, instance: str) -> Member:
        argv = [sys.executable, "-m", "bench.group_protocol", "--member", self.bootstrap]
        argv += [self.topic, self.group, instance, self.protocol]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        return Member(instance, proc)


def wait(condition, timeout: float, step: float = 0.01) -> float:
    """The time ``condition`` first held, or raises after ``timeout``."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return time.time()
        time.sleep(step)
    raise TimeoutError("condition never held")


def everything(*members: Member) -> bool:
    owned = [m.owned for m in members]
    return set().union(*owned) == set(range(PARTITIONS)) and sum(map(len, owned)) == PARTITIONS


def steady(a: Member, b: Member, timeout: float = 120) -> None:
    wait(lambda: everything(a, b) and a.owned and b.owned, timeout)
    time.sleep(1.0)  # past the join's last heartbeats


def scenario_kill(bootstrap: str, protocol: str, tag: str) -> dict:
    run = Run(bootstrap, protocol, tag)
    a, b = run.start("a"), run.start("b")
    try:
        steady(a, b)
        killed = b.kill()
        done = wait(lambda: a.owned == set(range(PARTITIONS)), 180)
        return {"stall": done - killed}
    finally:
        for m in (a, b):
            m.proc.kill()


def scenario_restart(bootstrap: str, protocol: str, tag: str, clean: bool = False) -> dict:
    run = Run(bootstrap, protocol, tag)
    a, b = run.start("a"), run.start("b")
    try:
        steady(a, b)
        before = set(b.owned)
        if clean:
            killed = time.time()
            b.proc.terminate()
            b.proc.wait(60)
        else:
            killed = b.kill()
        b2 = run.start("b")
        done = wait(lambda: everything(a, b2), 180)
        return {
            "stall": done - killed,
            "own_back": b2.owned == before,
            "b2_errors": sorted(set(b2.errors()))[:3],
        }
    finally:
        for m in (a, b, locals().get("b2")):
            if m is not None:
                m.proc.kill()


def scenario_join(bootstrap: str, protocol: str, tag: str) -> dict:
    run = Run(bootstrap, protocol, tag)
    a = run.start("a")
    b = None
    try:
        wait(lambda: a.owned == set(range(PARTITIONS)), 60)
        time.sleep(1.0)
        joined = time.time()
        b = run.start("b")
        settled = wait(lambda: everything(a, b) and b.owned, 120)
        time.sleep(3.0)
        return {"stall": longest_unowned(a, b, joined), "settled": settled - joined}
    finally:
        a.proc.kill()
        if b is not None:
            b.proc.kill()


def longest_unowned(a: Member, b: Member, since: float) -> float:
    """The longest a partition was owned by neither member after ``since``, per their events."""
    events = sorted(
        (e["t"], name, set(e["owned"]))
        for name, m in (("a", a), ("b", b))
        for e in m.events
        if "owned" in e
    )
    owned = {"a": set(), "b": set()}
    lost: dict[int, float] = {}
    longest = 0.0
    for t, name, now in events:
        owned[name] = now
        for p in range(PARTITIONS):
            if p in owned["a"] or p in owned["b"]:
                if p in lost:
                    longest = max(longest, t - lost.pop(p))
            elif t >= since:
                lost.setdefault(p, t)
    return longest


SCENARIOS = {
    "kill": scenario_kill,
    "restart": scenario_restart,
    "rolling": lambda *args: scenario_restart(*args, clean=True),
    "join": scenario_join,
}


def broker_group_defaults(bootstrap: str) -> dict[str, str]:
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(ResourceType.BROKER, "1")
    entries = admin.describe_configs([resource])[resource].result(30)
    return {k: v.value for k, v in sorted(entries.items()) if k.startswith("group.consumer.")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--member", nargs=5, metavar="ARG", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--protocols", default="classic,consumer")
    parser.add_argument("--scenarios", default="kill,restart,rolling,join")
    parser.add_argument(
        "--broker-session-ms",
        type=int,
        help="lower the broker's group.consumer session timeout (and its floor) to this",
    )
    args = parser.parse_args()
    if args.member:
        member_main(*args.member)
        return
    from confluent_kafka import libversion

    from outbox_devtools.kafka import LocalKafka

    overrides = {}
    if args.broker_session_ms:
        ms = args.broker_session_ms
        overrides = {
            "group.consumer.min.session.timeout.ms": str(ms),
            "group.consumer.session.timeout.ms": str(ms),
            "group.consumer.min.heartbeat.interval.ms": str(max(100, ms // 3)),
            "group.consumer.heartbeat.interval.ms": str(max(100, ms // 3)),
        }
    with LocalKafka(overrides=overrides).start() as broker:
        print(
            "librdkafka", libversion()[0], "broker", broker_group_defaults(broker.bootstrap_servers)
        )
        for protocol in args.protocols.split(","):
            for name in args.scenarios.split(","):
                figures = []
                for i in range(args.repeats):
                    tag = f"{protocol}-{name}-{i}-{int(time.time())}"
                    result = SCENARIOS[name](broker.bootstrap_servers, protocol, tag)
                    figures.append(result["stall"])
                    print(f"  {protocol:8} {name:8} #{i}: {json.dumps(result)}", flush=True)
                print(
                    f"{protocol:8} {name:8} median {statistics.median(figures):6.2f} s"
                    f"  max {max(figures):6.2f} s",
                    flush=True,
                )


if __name__ == "__main__":
    main()
