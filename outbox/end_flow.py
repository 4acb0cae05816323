"""The end of a send or of a check's answer: its decision written as an op record.

RocketMQ's ``endTransaction``: COMMIT or ROLLBACK becomes an op on the op topic,
naming the half (the copy asked about, and the original's offset, which the
checker's relay keys decisions on); UNKNOW writes nothing and leaves the half to
the check-back. A send's own end keeps RocketMQ 5.1.1's late-end rule, and may be
oneway (``end_oneway``: handed over, its delivery only watched). The flow of an end
is steps for a driver (:mod:`outbox.flow_steps`), ``yield from`` the send's
(:mod:`outbox.send_flow`) or the check's (:mod:`outbox.check_answers`).

Logged as ``outbox.producer``, where these messages have always been.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from outbox import metrics, tracing
from outbox.acked_writer import Acknowledgement
from outbox.errors import EndTransactionError, LateEndRefusedError
from outbox.flow_steps import Flow, Write
from outbox.message import EndStatus, LocalTransactionState
from outbox.protocol import HalfRecord, OpRecord, Resolution
from outbox.protocol.records import frozen_instance
from outbox.settings import ProducerSettings

log = logging.getLogger("outbox.producer")

_RESOLUTIONS = {
    LocalTransactionState.COMMIT_MESSAGE: Resolution.COMMIT,
    LocalTransactionState.ROLLBACK_MESSAGE: Resolution.ROLLBACK,
}

Ended = tuple[EndStatus, BaseException | None]
"""How an end went, and the error that made it fail (or be refused)."""


class EndFlow:
    """The ends of one producer group's sends and check answers."""

    def __init__(
        self,
        group: str,
        settings: ProducerSettings,
        group_metrics: metrics.GroupMetrics,
        clock: Callable[[], float],
        half_timeout: float,
    ) -> None:
        self.group = group
        self.settings = settings
        self.topics = settings.topics
        self.metrics = group_metrics
        self.clock = clock
        self.half_timeout = half_timeout
        """How long a send waits for its half, and so for its own op."""

    def end(
        self,
        half: HalfRecord,
        half_partition: int,
        half_offset: int,
        origin_offset: int,
        state: LocalTransactionState,
        *,
        origin: str,
        parent: Any,
    ) -> Flow[Ended]:
        """Write the decision on ``half`` (the copy at ``half_offset``) as an op, if it has one.

        ``origin_offset`` is the half's identity, which the relay keys decisions on;
        ``origin`` is ``"send"`` or ``"check"``; ``parent`` the span of the send or check
        (no end span under :data:`~outbox.tracing.NO_SPAN`). Not a generator itself: it
        returns the flow of the end, which for a send with no span is
        :meth:`_write_decision`'s, with no layer to pass its steps on.
        """
        resolution = _RESOLUTIONS.get(state)
        if resolution is None:
            self.metrics.child(metrics.UNKNOWNS, origin).inc()
            log.info("transaction left unknown transaction_id=%s", half.transaction_id)
            return _ended(EndStatus.LEFT_UNKNOWN, None)
        decision = self._write_decision(
            half, half_partition, half_offset, origin_offset, resolution, origin
        )
        if parent is tracing.NO_SPAN:
            return decision
        return self._end_in_span(decision, half.transaction_id, resolution, origin, parent)

    def _end_in_span(
        self,
        decision: Flow[Ended],
        transaction_id: str,
        resolution: Resolution,
        origin: str,
        parent: Any,
    ) -> Flow[Ended]:
        child = tracing.child_span(parent, tracing.END, transaction_id, resolution.value, origin)
        with child as span:
            status, error = yield from decision
            if span is not tracing.NO_SPAN:
                span.set_attribute("outbox.end_status", status.value)
                if error is not None:
                    tracing.fail(span, error)
            return status, error

    def _write_decision(
        self,
        half: HalfRecord,
        half_partition: int,
        half_offset: int,
        origin_offset: int,
        resolution: Resolution,
        origin: str,
    ) -> Flow[Ended]:
        if origin == "send":
            # RocketMQ 5.1.1's rule, checked once before the op is written: past
            # the window a check may already have answered, and the relay keeps
            # the first decision, so a late COMMIT after a ROLLBACK answer would
            # be silently ignored. Refusing it tells the caller instead.
            remaining = self._seconds_left_to_end(half)
            if remaining <= 0:
                error = LateEndRefusedError(
                    f"local transaction ended {-remaining:.1f}s past the direct-end window; "
                    "left to the check-back"
                )
                self.metrics.child(metrics.END_FAILURES, "late").inc()
                log.warning("late end refused transaction_id=%s", half.transaction_id)
                return EndStatus.REFUSED_LATE, error
        op = frozen_instance(
            OpRecord,
            {
                "transaction_id": half.transaction_id,
                "producer_group": self.group,
                "half_partition": half_partition,
                "half_offset": half_offset,
                "resolution": resolution,
                "ended_ms": int(self.clock() * 1000),
                "origin_offset": origin_offset,
            },
        )
        started = time.monotonic()
        oneway = origin == "send" and self.settings.end_oneway
        try:
            # A parking send waits for its op no longer than for its half: a lost or late op
            # is the check-back's to stand in for (a late one records the same decision).
            timeout = self.half_timeout if origin == "send" else self.settings.send_timeout_seconds
            written = yield Write.within(
                op.to_record(self.topics), EndTransactionError, timeout, not oneway
            )
        except EndTransactionError as exc:
            self.metrics.child(metrics.END_FAILURES, "failed").inc()
            log.error("end failed transaction_id=%s error=%s", half.transaction_id, exc)
            return EndStatus.FAILED, exc
        if oneway:
            written.add_done_callback(_OnewayReport(self.metrics, half.real_topic, op, started))
            return EndStatus.SENT_ONEWAY, None
        _count_end(self.metrics, half.real_topic, resolution, origin, started)
        if resolution is Resolution.COMMIT:
            return EndStatus.COMMITTED, None
        return EndStatus.ROLLED_BACK, None

    def _seconds_left_to_end(self, half: HalfRecord) -> float:
        """Time left before RocketMQ 5.1.1 would refuse this producer's own end."""
        window = max(float(half.immunity_seconds or 0), self.settings.transaction_timeout_seconds)
        age = self.clock() - half.born_ms / 1000
        return window - self.settings.late_end_margin_seconds - age


def as_state(answer: object, transaction_id: str, method: str) -> LocalTransactionState:
    """The listener's answer as the state a decision is made of: UNKNOW unless it is one."""
    if isinstance(answer, LocalTransactionState):
        return answer
    if answer is not None:
        log.warning(
            "%s returned %r, not a LocalTransactionState; treating as UNKNOW transaction_id=%s",
            method,
            answer,
            transaction_id,
        )
    return LocalTransactionState.UNKNOW


def _ended(status: EndStatus, error: BaseException | None) -> Flow[Ended]:
    """The flow of an end with nothing to write: no step, its outcome at once."""
    return status, error
    yield  # a generator, which finishes at its first step


def _count_end(
    group: metrics.GroupMetrics,
    real_topic: str,
    resolution: Resolution,
    origin: str,
    started: float,
) -> None:
    group.end_latency.observe(time.monotonic() - started)
    counter = metrics.COMMITS if resolution is Resolution.COMMIT else metrics.ROLLBACKS
    group.child(counter, real_topic, origin).inc()


class _OnewayReport:
    """Learns, on the client's thread, whether a oneway op was stored (watching its report).

    The caller has returned already, so a lost op can only be logged and
    counted; the half then has no op and the checker resolves it by check-back.
    """

    __slots__ = ("metrics", "op", "real_topic", "started")

    def __init__(
        self, group: metrics.GroupMetrics, real_topic: str, op: OpRecord, started: float
    ) -> None:
        self.metrics = group
        self.real_topic = real_topic
        self.op = op
        self.started = started

    def __call__(self, acknowledgement: Acknowledgement) -> None:
        error = acknowledgement.exception()
        if error is None:
            _count_end(self.metrics, self.real_topic, self.op.resolution, "send", self.started)
            return
        self.metrics.child(metrics.END_FAILURES, "oneway").inc()
        log.warning(
            "oneway end not delivered; left to the check-back transaction_id=%s error=%s",
            self.op.transaction_id,
            error,
        )
