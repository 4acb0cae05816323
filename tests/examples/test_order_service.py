"""The README's example runs as written against a real broker."""

import subprocess
import sys
from pathlib import Path

import pytest

from outbox.admin import ensure_topics, plan_topics
from outbox.protocol import TopicNames

pytestmark = pytest.mark.kafka

EXAMPLE = Path(__file__).parents[2] / "examples" / "order_service.py"


def test_order_service_example(kafka_bootstrap, kafka_admin, unique_prefix):
    ensure_topics(kafka_admin, plan_topics(TopicNames(unique_prefix), 3))
    result = subprocess.run(
        [
            sys.executable, str(EXAMPLE), "--bootstrap", kafka_bootstrap,
            "--prefix", unique_prefix, "--topic", f"{unique_prefix}-orders", "--create-topic",
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "o-1: COMMIT_MESSAGE -> COMMITTED",
        "o-2: ROLLBACK_MESSAGE -> ROLLED_BACK",
        "o-3: COMMIT_MESSAGE -> COMMITTED",
    ]
