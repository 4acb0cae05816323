"""A producer's answers to check requests: the listener asked, its answer written as an op.

RocketMQ's ``checkLocalTransaction``: the checker asks about a half still undecided
(through a put-back copy and a check request, which :mod:`outbox.check_responder`
consumes), the listener's ``check_local_transaction`` says what its local transaction
did, and the answer's op names the copy and the original's offset, as a send's own end
would (:mod:`outbox.end_flow`); it is always acknowledged, never oneway. A batch of
requests is answered with its ops written together
(:func:`outbox.flow_steps.run_blocking_together`).

Logged as ``outbox.producer``, where these messages have always been.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from outbox import metrics, tracing
from outbox.end_flow import EndFlow, as_state
from outbox.flow_steps import Flow, Step, run_blocking, run_blocking_together
from outbox.message import LocalTransactionState, Message, checked_message
from outbox.protocol import CheckRequest

log = logging.getLogger("outbox.producer")


class CheckAnswers:
    """The check answers of one producer group, carried out in the calling thread.

    ``ask`` is the listener's answer to a check (``check_local_transaction``); the
    asyncio producer's asks its listener on the application's loop. ``take`` and
    ``start`` carry out the steps (:meth:`outbox.send_flow.SendCore.take` and
    :meth:`~outbox.send_flow.SendCore.start_step`).
    """

    def __init__(
        self,
        group: str,
        group_metrics: metrics.GroupMetrics,
        ends: EndFlow,
        *,
        ask: Callable[[Message], object],
        take: Callable[[Step], Any],
        start: Callable[[Step], Callable[[], Any]],
    ) -> None:
        self.group = group
        self.metrics = group_metrics
        self.ends = ends
        self.ask = ask
        self.take = take
        self.start = start

    def answer(self, request: CheckRequest) -> None:
        """Ask the listener about ``request``'s half, write its answer as an op on the copy.

        The op names the copy it answers and the original's offset (the identity
        the relay keys decisions on); it is always acknowledged, never oneway.
        """
        half = request.half
        attributes = {
            "messaging.system": "kafka",
            "messaging.destination.name": half.real_topic,
            "outbox.producer_group": self.group,
            "outbox.transaction_id": half.transaction_id,
            "outbox.check_times": half.check_times,
        }
        with tracing.span(
            tracing.CHECK, "CONSUMER", attributes, parent_headers=half.user_headers
        ) as span:
            run_blocking(self.check(request, span), self.take)

    def answer_batch(self, requests: list[CheckRequest]) -> None:
        """Answer ``requests`` as :meth:`answer` does each, their ops written together and
        their acknowledgements awaited together; a failure is logged, not raised.

        Spans are opened and closed one check at a time, so with tracing on
        the checks are answered one by one.
        """
        if tracing.recording():
            for request in requests:
                self._answer_one(request)
            return
        flows = [self.check(request, tracing.NO_SPAN) for request in requests]
        failures = run_blocking_together(flows, self.start, self.take)
        for failure in failures:
            if failure is not None:
                log.error("answering a check request failed", exc_info=failure)

    def _answer_one(self, request: CheckRequest) -> None:
        try:
            self.answer(request)
        except Exception:
            log.exception("answering a check request failed")

    def check(self, request: CheckRequest, span: Any) -> Flow[Any]:
        """The listener's answer to ``request``, then its op on the copy (if it has one)."""
        half = request.half
        identity = half.identity(request.half_offset)
        message = checked_message(half, request.half_partition, request.half_offset)
        try:
            answer = self.ask(message)
            state = as_state(answer, half.transaction_id, "check_local_transaction")
        except Exception as exc:
            log.exception(
                "check_local_transaction raised; answering UNKNOW transaction_id=%s",
                half.transaction_id,
            )
            tracing.fail(span, exc)
            state = LocalTransactionState.UNKNOW
        span.set_attribute("outbox.local_transaction_state", state.value)
        self.metrics.child(metrics.CHECKS_ANSWERED, state.value).inc()
        log.info("check answered transaction_id=%s state=%s", half.transaction_id, state.value)
        return (
            yield from self.ends.end(
                half,
                request.half_partition,
                request.half_offset,
                identity,
                state,
                origin="check",
                parent=span,
            )
        )
