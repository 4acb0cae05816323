"""A Kafka-backed transactional outbox: RocketMQ's transactional messages for Python.

The wire protocol shared by every component is in :mod:`outbox.protocol`.
"""
