"""The demo's accounting: a send the producer did not end is judged by the database."""

from pathlib import Path

import sqlalchemy as sa

from outbox.sql import create_engine
from outbox_devtools.demo import Outcomes, prepare_database


def test_a_send_left_to_the_check_back_is_filed_by_what_the_database_holds(tmp_path: Path):
    # On a loaded machine a local transaction can outlive the direct-end window:
    # the send ends REFUSED_LATE and the check-back ends it from the database.
    # Its order in the table means committed; no order means rolled back.
    url = f"sqlite:///{tmp_path / 'orders.db'}"
    prepare_database(url)
    engine = create_engine(url)
    with engine.begin() as connection:
        connection.execute(sa.text("INSERT INTO orders (id, total) VALUES (1, 10.0)"))
    outcomes = Outcomes(left_to_check={"late-committed": 1, "late-refused": 2})

    outcomes.settle_left_to_check(engine)

    assert outcomes.all_committed == {"late-committed"}
    assert outcomes.rolled_back == {"late-refused"}
    engine.dispose()
