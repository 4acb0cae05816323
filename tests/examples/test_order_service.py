"""The README's example runs as written against a real broker."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from outbox.admin import ensure_topics, plan_topics
from outbox.protocol import TopicNames
from outbox.sql import create_engine
from tests.fixtures.postgres import fresh_database

pytestmark = pytest.mark.kafka

EXAMPLE = Path(__file__).parents[2] / "examples" / "order_service.py"
OUTPUT = [
    "o-1: COMMIT_MESSAGE -> COMMITTED",
    "o-2: ROLLBACK_MESSAGE -> ROLLED_BACK",
    "o-3: COMMIT_MESSAGE -> COMMITTED",
]


def run_example(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, timeout=120, env=env
    )


def test_order_service_example(kafka_bootstrap, kafka_admin, unique_prefix):
    ensure_topics(kafka_admin, plan_topics(TopicNames(unique_prefix), 3))
    result = run_example(
        "--bootstrap", kafka_bootstrap,
        "--prefix", unique_prefix, "--topic", f"{unique_prefix}-orders", "--create-topic",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == OUTPUT


@pytest.mark.postgres
def test_order_service_as_the_compose_demo_runs_it(
    kafka_bootstrap, kafka_admin, unique_prefix, postgres_url
):
    """Configured by the environment alone, on PostgreSQL, and run twice: compose's
    database outlives the demo container, so a second run must place its orders again."""
    ensure_topics(kafka_admin, plan_topics(TopicNames(unique_prefix), 3))
    with fresh_database(postgres_url) as url:
        env = {
            **os.environ,
            "OUTBOX_BOOTSTRAP_SERVERS": kafka_bootstrap,
            "OUTBOX_TOPIC_PREFIX": unique_prefix,
            "OUTBOX_DATABASE_URL": url,
        }
        for _ in range(2):
            result = run_example("--topic", f"{unique_prefix}-orders", "--create-topic", env=env)
            assert result.returncode == 0, result.stderr
            assert result.stdout.splitlines() == OUTPUT

        engine = create_engine(url)
        with engine.connect() as connection:
            orders = connection.execute(sa.text("SELECT count(*) FROM orders")).scalar_one()
            logged = connection.execute(
                sa.text("SELECT count(*) FROM outbox_transaction_log")
            ).scalar_one()
        engine.dispose()
    assert orders == logged == 4  # two committed orders a run, each with its log row
