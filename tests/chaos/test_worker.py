"""The producer process's check marker: the controller kills it on this line, mid-answer."""

import time

import pytest
from sqlalchemy.orm import sessionmaker

from outbox.message import LocalTransactionState, Message
from outbox.sql import create_engine, upgrade
from outbox_devtools.chaos import worker
from outbox_devtools.chaos.worker import GROUP, ChaosListener, place_order


@pytest.fixture
def listener(sqlite_url, monkeypatch):
    monkeypatch.setattr(worker, "CHECK_PAUSE_SECONDS", 0.3)
    upgrade(sqlite_url)
    engine = create_engine(sqlite_url)
    yield ChaosListener(sessionmaker(engine), place_order, group=GROUP, grace_seconds=3600)
    engine.dispose()


def _check(listener: ChaosListener, transaction_id: str) -> LocalTransactionState:
    message = Message("chaos.orders", b"{}", transaction_id=transaction_id, born_ms=0)
    return listener.check_local_transaction(message)


def test_an_armed_listener_announces_one_check_and_pauses_before_answering(listener, capsys):
    unarmed = _check(listener, "t0")
    assert capsys.readouterr().out == ""
    listener.armed.set()
    started = time.monotonic()
    answer = _check(listener, "t1")
    assert time.monotonic() - started >= 0.3  # the window the controller kills in
    assert capsys.readouterr().out == "CHECKING t1\n"
    assert answer is unarmed  # the pause changes when it answers, not what
    _check(listener, "t2")
    assert capsys.readouterr().out == ""  # armed for one check only
