"""The checker sidecar: finds halves with no outcome and asks their producers.

It reproduces RocketMQ's ``TransactionalMessageServiceImpl#check`` over the
half and op topics defined in :mod:`outbox.protocol`.

Three programs live here: the check rounds (:mod:`outbox_checker.rounds` and what it
drives), the relay that publishes committed halves (:mod:`outbox_checker.relay` and
``relay_*``), and the operator commands (``outbox status``, ``outbox discard``). A replica
(:mod:`outbox_checker.service`, run by ``outbox checker``) runs the rounds and the relay
side by side. What they agree on is written once, in modules they share:
:mod:`outbox_checker.names` (every group id and transactional id, the checkpoint's commit
metadata), :mod:`outbox_checker.publishable`, settings, errors, membership, reading and
metrics; no program imports another (``tests/layout/test_checker_programs.py``).
"""
