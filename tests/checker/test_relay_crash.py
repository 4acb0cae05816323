"""kill -9 of relaying checker replicas under a stream of decisions: every commit once, no rollback.

Two ``outbox checker`` processes share the op partitions; one of them is killed
and restarted again and again while halves and decisions (some of them second
decisions for the same half, as late ends and repeated check answers are) keep
arriving. The real topic must end up with each committed half exactly once.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter

import pytest

from outbox.protocol import OpRecord, RealRecord, Resolution
from tests.checker.support import pending_half, wait_for, write
from tests.checker.test_checker_processes import CheckerProcess
from tests.producer.conftest import OutboxTopics

pytestmark = pytest.mark.kafka

TRANSACTIONS = 1_500
KILLS = 3


def _stream_decisions(topics: OutboxTopics, committed: set[str], done: threading.Event) -> None:
    rng = random.Random(11)
    for batch_start in range(0, TRANSACTIONS, 50):
        halves = [
            pending_half(topics, f"crash-{n}-{uuid.uuid4().hex[:6]}")
            for n in range(batch_start, batch_start + 50)
        ]
        positions = write(topics, *(h.to_record(topics.names, n % 3) for n, h in enumerate(halves)))
        ops = []
        for half, (partition, offset) in zip(halves, positions, strict=True):
            resolution = Resolution.COMMIT if rng.random() < 0.8 else Resolution.ROLLBACK
            if resolution is Resolution.COMMIT:
                committed.add(half.transaction_id)
            op = OpRecord(half.transaction_id, "orders", partition, offset, resolution, 1, offset)
            ops.append(op)
            if rng.random() < 0.15:  # a second decision: always ignored
                ops.append(
                    OpRecord(
                        half.transaction_id,
                        "orders",
                        partition,
                        offset,
                        Resolution.COMMIT,
                        2,
                        offset,
                    )
                )
        write(topics, *(op.to_record(topics.names) for op in ops))
        time.sleep(0.05)
    done.set()


def test_killed_relays_publish_every_commit_exactly_once(outbox_topics: OutboxTopics):
    t = outbox_topics
    env = {"OUTBOX_CHECK_INTERVAL_SECONDS": "3600"}
    replicas = [CheckerProcess(t, f"relay-{n}", **env) for n in range(2)]
    committed: set[str] = set()
    done = threading.Event()
    writer = threading.Thread(target=_stream_decisions, args=(t, committed, done), daemon=True)
    try:
        wait_for(lambda: all(r.ready() for r in replicas), 90, "replicas ready")
        writer.start()
        rng = random.Random(5)
        for _ in range(KILLS):
            time.sleep(rng.uniform(1.0, 3.0))
            victim = rng.randrange(2)
            replicas[victim].kill()
            time.sleep(rng.uniform(0.2, 2.0))
            replicas[victim] = CheckerProcess(t, f"relay-{victim}", **env)
        assert done.wait(180), "the decision stream did not finish"

        def all_published() -> bool:
            return set(published(t)) >= committed

        try:
            wait_for(all_published, 120, "every commit on the real topic")
        except AssertionError:
            missing = committed - set(published(t))
            logs = "\n".join(line for r in replicas for line in r.lines[-40:])
            raise AssertionError(f"{len(missing)} commits never published; logs:\n{logs}") from None
        time.sleep(2)  # anything published twice would show up by now
        counts = published(t)
        assert set(counts) == committed, "a rolled-back or unknown half was published"
        assert [tx for tx, n in counts.items() if n > 1] == []
    finally:
        for replica in replicas:
            replica.kill()


def published(topics: OutboxTopics) -> Counter[str]:
    return Counter(RealRecord.from_record(r).transaction_id for r in topics.read(topics.real_topic))
