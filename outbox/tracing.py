"""Trace context on halves, and spans of a send, when OpenTelemetry is installed.

The optional ``opentelemetry-api`` (the ``otel`` extra) is looked for once, on
import. Without it every function here returns at once and nothing is traced:
the outbox depends on no tracing package. With it, a send writes the current
trace context into its half through the configured propagator (W3C
``traceparent`` and ``tracestate`` by default) as ordinary user headers. The
protocol copies user headers verbatim onto put-back copies, check requests,
discards and the real record, so a consumer of the real topic continues the
trace the send began, however its transaction was decided.

Spans follow OpenTelemetry's messaging conventions where they apply: the send
is a PRODUCER span and its context is the one written into the half; the local
transaction and the decision are its children; a check answer is a CONSUMER
span whose parent is the context carried by the half it was asked about.
Without an SDK configured nothing would record, so no span is started at all.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from typing import Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import (
        NoOpTracerProvider,
        ProxyTracerProvider,
        SpanKind,
        Status,
        StatusCode,
    )
except ImportError:  # the ``otel`` extra is not installed: tracing stays off
    ENABLED = False
else:
    ENABLED = True

AttributeValue = str | int | bool
HeaderPairs = Sequence[tuple[str, bytes | None]]

SEND = "outbox send"
LOCAL_TRANSACTION = "outbox local transaction"
END = "outbox end"
CHECK = "outbox check"


class _NoSpan:
    """What a span block yields without OpenTelemetry: takes attributes, keeps nothing."""

    __slots__ = ()

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        pass


NO_SPAN = _NoSpan()
NO_SPAN_BLOCK = nullcontext(NO_SPAN)  # reusable: without OpenTelemetry a span costs one call


def span(
    name: str,
    kind: str = "INTERNAL",
    attributes: Mapping[str, AttributeValue] | None = None,
    *,
    parent_headers: HeaderPairs | None = None,
) -> AbstractContextManager[Any]:
    """A block run inside a span named ``name``; it yields the span (or :data:`NO_SPAN`).

    ``kind`` names a ``SpanKind`` member. With ``parent_headers`` the span's
    parent is the trace context those headers carry (a check answer joins the
    trace of the send it is asked about), else the current span. An exception
    leaving the block is recorded on the span and marks it failed.
    """
    if not ENABLED:
        return NO_SPAN_BLOCK
    provider = trace.get_tracer_provider()
    if isinstance(provider, ProxyTracerProvider | NoOpTracerProvider):
        # No SDK: the API's spans would record nothing and stand in for their parent,
        # whose context :func:`with_trace_context` writes all the same.
        return NO_SPAN_BLOCK
    context = None if parent_headers is None else propagate.extract(_carrier(parent_headers))
    started = provider.get_tracer("outbox").start_span(
        name, context=context, kind=SpanKind[kind], attributes=attributes
    )
    return _current(started, context)


def child_span(
    parent: Any,
    name: str,
    transaction_id: str,
    resolution: str | None = None,
    origin: str | None = None,
) -> AbstractContextManager[Any]:
    """A span of the send or check ``parent`` about one transaction (its local transaction,
    its end): none at all when ``parent`` records nothing (:data:`NO_SPAN`)."""
    if parent is NO_SPAN:
        return NO_SPAN_BLOCK
    attributes: dict[str, AttributeValue] = {"outbox.transaction_id": transaction_id}
    if resolution is not None and origin is not None:
        attributes["outbox.resolution"] = resolution
        attributes["outbox.origin"] = origin
    return span(name, attributes=attributes)


@contextmanager
def _current(started: Any, parent: Any) -> Iterator[Any]:
    """``started`` as the current span for the block, ended with it.

    As OpenTelemetry's ``start_as_current_span``, except that a block ending in
    another ``contextvars`` context than it began (``producer.transaction(...)``
    entered and left in two thread-pool calls of a FastAPI dependency) leaves that
    context as it is: there was nothing attached in it to detach.
    """
    token = otel_context.attach(trace.set_span_in_context(started, parent))
    try:
        yield started
    except Exception as exc:
        fail(started, exc)
        raise
    finally:
        started.end()
        _detach(token)


def _detach(token: Any) -> None:
    if not isinstance(token, contextvars.Token):  # another runtime context: its own rules
        otel_context.detach(token)
        return
    with suppress(ValueError):  # made in the context the block began in, not this one
        token.var.reset(token)


def recording() -> bool:
    """Whether :func:`span` records spans now (OpenTelemetry and an SDK are installed)."""
    if not ENABLED:
        return False
    return not isinstance(trace.get_tracer_provider(), ProxyTracerProvider | NoOpTracerProvider)


def fail(current: Any, error: BaseException) -> None:
    """Mark ``current`` failed with ``error``, for failures handled inside its block."""
    if ENABLED and current is not NO_SPAN:
        current.record_exception(error)
        current.set_status(Status(StatusCode.ERROR, str(error)))


def with_trace_context(headers: list[tuple[str, bytes | None]]) -> list[tuple[str, bytes | None]]:
    """``headers`` plus the current trace context's, skipping names the caller set itself.

    A caller that writes its own ``traceparent`` keeps it: it propagates by
    hand, and two values of one header would leave consumers guessing.
    """
    if not ENABLED:
        return headers
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    if not carrier:
        return headers
    taken = {name.lower() for name, _ in headers}
    added = [(k, v.encode("utf-8")) for k, v in carrier.items() if k.lower() not in taken]
    return [*headers, *added] if added else headers


def _carrier(headers: HeaderPairs) -> dict[str, str]:
    return {
        name.lower(): value.decode("utf-8", "replace")
        for name, value in headers
        if value is not None
    }
