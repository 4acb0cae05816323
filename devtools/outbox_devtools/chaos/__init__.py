"""``outbox chaos``: the whole pipeline under seeded faults, then every invariant checked.

Producer processes write orders to PostgreSQL through the SQL listener while
two checker replicas and the Spark sink run; a controller kills producers (one
of them while it answers a check-back), one or every checker replica with
SIGKILL and stops or kills the Kafka broker at seeded moments. With
``--brokers 3`` Kafka is a three-node cluster: each broker stop, kill or freeze
strikes one seeded node, and a rolling restart of every node, a kill of a half
partition's leader and a kill of a relay's transaction coordinator are added.
After the faults stop and the checker settles, the verdict is taken from the
database and the topics: every committed order is in the sink exactly once and on its real topic
exactly once, no rolled-back one is visible anywhere, no half is left pending.

Modules: :mod:`~outbox_devtools.chaos.plan` (the seeded fault schedule),
:mod:`~outbox_devtools.chaos.worker` (a producer process), :mod:`~outbox_devtools.chaos.verdict`
(the invariants), :mod:`~outbox_devtools.chaos.run` (the controller).
"""
