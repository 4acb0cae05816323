"""Times the producer and the checker must agree on, defined once for both.

The checker asks about a half no sooner than the transaction timeout after it was
stored (RocketMQ's ``transactionTimeOut``, 6 s in 5.x); the producer stops ending its
own transactions shortly before then, since past it a check may already have
answered (RocketMQ 5.1.1's rule). ``ProducerSettings`` and ``CheckerSettings`` both
default to this value, and they cannot disagree into a race: each half carries its
producer's timeout (:attr:`~outbox.protocol.Header.END_WINDOW_MS`), and the checker
waits for the longer of that and its own (``outbox_checker.rules.transaction_timeout_ms``).
"""

from __future__ import annotations

TRANSACTION_TIMEOUT_SECONDS = 6.0
"""Age of a half before the checker may check it (RocketMQ ``transactionTimeOut``)."""
