"""The FastAPI example serves POST /orders on a real broker and PostgreSQL, through ASGI.

``/orders`` places each order in the request's own session, joined by
``producer.transaction(...)``; ``/orders/via-listener`` through the listener's
business function. Both commit, decline and publish alike.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from outbox import ProducerSettings
from outbox.admin import TopicSpec, ensure_topics, plan_topics
from outbox.config import kafka_client_config
from outbox.protocol import OpRecord, RealRecord, Resolution, TopicNames
from outbox.reading import read_topic
from outbox.sql import create_engine
from tests.fixtures.postgres import fresh_database
from tests.fixtures.relay import running_relay
from tests.producer.test_check_back import wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.postgres]

EXAMPLE = Path(__file__).parents[2] / "examples" / "async_order_service.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("async_order_service", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def post_orders(
    app: Any, orders: Sequence[Any], via_listener: Sequence[Any] = ()
) -> list[httpx.Response]:
    """The orders posted at once, with the app's start-up and shutdown around them.

    ``via_listener`` go to the endpoint whose local transaction the listener runs.
    """
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client,
    ):
        return await asyncio.gather(
            *(client.post("/orders", json=order) for order in orders),
            *(client.post("/orders/via-listener", json=order) for order in via_listener),
        )


def test_post_orders_commits_rows_and_events_declines_and_refuses(
    kafka_bootstrap, kafka_admin, unique_prefix, postgres_url
):
    names = TopicNames(unique_prefix)
    topic = f"{unique_prefix}-orders"
    ensure_topics(kafka_admin, [*plan_topics(names, 3), TopicSpec(topic, 3, 1)])
    client_config = kafka_client_config(kafka_bootstrap)
    placed = [{"reference": f"o-{n}", "total": 10.0 + n} for n in range(20)]
    declined = {"reference": "o-free", "total": 0.0}
    malformed = {"reference": "o-bad"}  # no total
    via_listener = [{"reference": "l-1", "total": 5.0}, {"reference": "l-free", "total": 0.0}]

    with fresh_database(postgres_url) as url, running_relay(client_config, names):
        settings = ProducerSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=unique_prefix)
        app = load_example().create_app(settings, url, topic)
        responses = asyncio.run(post_orders(app, [*placed, declined, malformed], via_listener))

        *ok, no, bad, listened, refused = responses
        assert (listened.status_code, listened.json()["end"]) == (201, "COMMITTED"), listened.text
        ok.append(listened)
        placed.append(via_listener[0])
        assert [r.status_code for r in ok] == [201] * len(placed), [r.text for r in ok]
        assert {r.json()["end"] for r in ok} == {"COMMITTED"}
        for declined_response in (no, refused):  # the same answer from either form
            assert declined_response.status_code == 422, declined_response.text
            body = declined_response.json()
            assert (body["state"], body["end"]) == ("ROLLBACK_MESSAGE", "ROLLED_BACK")
            assert body["declined"] == "declined: the total must be positive"
        assert bad.status_code == 422 and "total" in bad.text  # refused before any send
        committed = {r.json()["transaction_id"] for r in ok}

        engine = create_engine(url)
        with engine.connect() as connection:
            rows = connection.execute(sa.text("SELECT reference, transaction_id FROM orders"))
            orders = {reference: transaction_id for reference, transaction_id in rows}
            logged = connection.execute(
                sa.text("SELECT transaction_id FROM outbox_transaction_log")
            ).scalars()
            log_ids = set(logged)
        engine.dispose()
        assert set(orders) == {order["reference"] for order in placed}
        assert set(orders.values()) == log_ids == committed

        ops = [OpRecord.from_record(r) for r in read_topic(client_config, names.op, timeout=60)]
        assert sorted(op.resolution.value for op in ops) == sorted(
            [Resolution.COMMIT.value] * len(placed) + [Resolution.ROLLBACK.value] * 2
        )

        def events() -> list[RealRecord]:
            return [RealRecord.from_record(r) for r in read_topic(client_config, topic, timeout=60)]

        wait_for(lambda: len(events()) == len(placed))  # published by the checker's relay
        assert {event.transaction_id for event in events()} == committed
