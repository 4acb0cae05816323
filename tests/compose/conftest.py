"""The image tests run the checker against fresh outbox topics, as the producer tests do."""

from tests.producer.conftest import outbox_topics  # noqa: F401
