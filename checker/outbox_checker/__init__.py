"""The checker sidecar: finds halves with no outcome and asks their producers.

It reproduces RocketMQ's ``TransactionalMessageServiceImpl#check`` over the
half and op topics defined in :mod:`outbox.protocol`.
"""
