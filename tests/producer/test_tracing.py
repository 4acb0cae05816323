"""Trace context from a send to its real record, and spans, with the OpenTelemetry SDK.

The SDK's in-memory exporter records the spans; the trace header is read back
from the real topic, where the checker's relay published it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager

import pytest
from opentelemetry import context, propagate, trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Span, SpanKind, StatusCode
from opentelemetry.util._once import Once

from outbox import LocalTransactionState, Message, TransactionProducer
from outbox.protocol import Header, RawRecord, RealRecord
from tests.checker.support import SkewedClock, check_requests, running_checker, wait_for
from tests.producer.conftest import OutboxTopics, ScriptedListener

pytestmark = pytest.mark.kafka

COMMIT = LocalTransactionState.COMMIT_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW
CALLER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """An SDK tracer provider for this test only, exporting to memory."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    yield exporter
    provider.shutdown()
    # The API sets its provider once per process; later tests run untraced, as before.
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None


def header(raw: RawRecord, name: str) -> bytes | None:
    (value,) = [v for n, v in raw.headers if n == name]
    return value


def trace_ids(traceparent: bytes | None) -> tuple[int, int]:
    """(trace id, parent span id) of a W3C ``traceparent`` value."""
    assert traceparent is not None
    version, trace_id, span_id, flags = traceparent.decode().split("-")
    assert version == "00" and int(flags, 16) & 1  # sampled
    return int(trace_id, 16), int(span_id, 16)


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def real_records(topics: OutboxTopics, count: int) -> list[RawRecord]:
    records: list[RawRecord] = []

    def arrived() -> bool:
        records[:] = topics.read(topics.real_topic)
        return len(records) >= count

    wait_for(arrived, what="the real record")
    return records


def caller_span_from(traceparent: str, tracestate: str) -> AbstractContextManager[Span]:
    """A span continuing an incoming request's trace, with a tracestate of its own."""
    incoming = propagate.extract({"traceparent": traceparent, "tracestate": tracestate})
    return trace.get_tracer("test").start_as_current_span("checkout", context=incoming)


def test_a_send_in_a_span_carries_its_trace_to_the_real_record(
    producer: TransactionProducer, outbox_topics: OutboxTopics, relay: None, spans
):
    with caller_span_from(CALLER, "vendor=abc") as caller:
        message = Message(outbox_topics.real_topic, b"v", headers=[("h", b"1")])
        sent = producer.send_message_in_transaction(message, COMMIT)

    (raw,) = real_records(outbox_topics, 1)
    real = RealRecord.from_record(raw)
    assert real.transaction_id == sent.transaction_id
    trace_id, parent_id = trace_ids(header(raw, "traceparent"))
    assert trace_id == caller.get_span_context().trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert header(raw, "tracestate") == b"vendor=abc"
    assert real.user_headers[0] == ("h", b"1")
    (send,) = named(spans, "outbox send")
    assert parent_id == send.context.span_id  # the consumer continues from the send span
    assert send.parent is not None and send.parent.span_id == caller.get_span_context().span_id
    assert send.kind is SpanKind.PRODUCER
    assert send.attributes is not None
    assert send.attributes["messaging.destination.name"] == outbox_topics.real_topic
    assert send.attributes["outbox.half_offset"] == sent.half_offset
    assert send.attributes["outbox.end_status"] == "COMMITTED"
    for child in ("outbox local transaction", "outbox end"):
        (span,) = named(spans, child)
        assert span.parent is not None and span.parent.span_id == send.context.span_id
    (end,) = named(spans, "outbox end")
    assert end.attributes is not None and end.attributes["outbox.resolution"] == "commit"


def test_a_check_back_answer_joins_the_trace_and_the_put_back_copy_keeps_it(
    producer: TransactionProducer,
    outbox_topics: OutboxTopics,
    listener: ScriptedListener,
    spans,
):
    """Left UNKNOW, put back and asked by a real checker, committed by the answer, relayed."""
    t = outbox_topics
    with trace.get_tracer("test").start_as_current_span("checkout") as caller:
        sent = producer.send_message_in_transaction(Message(t.real_topic, b"v"), UNKNOW)
    trace_id = caller.get_span_context().trace_id
    (send,) = named(spans, "outbox send")
    with running_checker(t, SkewedClock(60), relay=True) as checker:
        assert checker.run_round().checks_sent == 1
        (raw,) = real_records(t, 1)
    assert RealRecord.from_record(raw).transaction_id == sent.transaction_id
    original, copy = t.read(t.names.half)
    assert header(copy, Header.ORIGIN_OFFSET.value) == str(sent.half_offset).encode()
    traceparent = header(original, "traceparent")
    assert header(copy, "traceparent") == header(raw, "traceparent") == traceparent
    assert trace_ids(traceparent) == (trace_id, send.context.span_id)
    (request,) = check_requests(t)
    assert ("traceparent", traceparent) in request.half.user_headers

    wait_for(lambda: len(named(spans, "outbox end")) == 1, what="the check answer's span")
    (check,) = named(spans, "outbox check")
    assert check.kind is SpanKind.CONSUMER
    assert check.context.trace_id == trace_id
    assert check.parent is not None and check.parent.span_id == send.context.span_id
    assert check.attributes is not None and check.attributes["outbox.check_times"] == 1
    (end,) = named(spans, "outbox end")
    assert end.parent is not None and end.parent.span_id == check.context.span_id
    assert end.attributes is not None and end.attributes["outbox.origin"] == "check"


def test_a_callers_own_trace_header_is_kept_and_not_doubled(
    producer: TransactionProducer, outbox_topics: OutboxTopics, spans
):
    own = b"00-11111111111111111111111111111111-2222222222222222-01"
    with trace.get_tracer("test").start_as_current_span("checkout"):
        message = Message(outbox_topics.real_topic, b"v", headers={"traceparent": own})
        producer.send_message_in_transaction(message, COMMIT)
    (half,) = outbox_topics.read(outbox_topics.names.half)
    assert header(half, "traceparent") == own


def test_a_failing_local_transaction_marks_its_span(
    producer: TransactionProducer, outbox_topics: OutboxTopics, spans
):
    with trace.get_tracer("test").start_as_current_span("checkout"):
        result = producer.send_message_in_transaction(
            Message(outbox_topics.real_topic, b"v"), RuntimeError("database down")
        )
    assert result.local_transaction_state is UNKNOW
    (local,) = named(spans, "outbox local transaction")
    assert local.status.status_code is StatusCode.ERROR
    assert [e.name for e in local.events] == ["exception"]
    (send,) = named(spans, "outbox send")
    assert send.attributes is not None and send.attributes["outbox.end_status"] == "LEFT_UNKNOWN"


NO_OPENTELEMETRY = """
import importlib.abc
import sys


class NoOpenTelemetry(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ModuleNotFoundError(f"No module named {name!r}")
        return None


sys.meta_path.insert(0, NoOpenTelemetry())

from outbox import LocalTransactionState, Message, ProducerSettings, TransactionProducer, tracing


class Commits:
    def execute_local_transaction(self, message, arg):
        return LocalTransactionState.COMMIT_MESSAGE

    def check_local_transaction(self, message):
        return LocalTransactionState.COMMIT_MESSAGE


bootstrap, prefix, topic = sys.argv[1:]
settings = ProducerSettings(bootstrap_servers=bootstrap, topic_prefix=prefix)
with TransactionProducer("orders", Commits(), settings) as producer:
    result = producer.send_message_in_transaction(Message(topic, b"v"))
assert not tracing.ENABLED
assert not [name for name in sys.modules if name.startswith("opentelemetry")]
print(result.end_status.value)
"""


def test_without_opentelemetry_a_send_works_and_carries_no_trace_header(
    outbox_topics: OutboxTopics,
):
    t = outbox_topics
    ran = subprocess.run(
        [sys.executable, "-c", NO_OPENTELEMETRY, t.bootstrap, t.names.prefix, t.real_topic],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.strip() == "COMMITTED"
    (half,) = t.read(t.names.half)
    assert [name for name, _ in half.headers if not name.startswith("outbox-")] == []


def test_with_the_api_alone_an_incoming_trace_is_passed_on_and_none_is_made_up(
    producer: TransactionProducer, outbox_topics: OutboxTopics
):
    """No SDK: no span is started, yet a context the service received travels on."""
    t = outbox_topics
    producer.send_message_in_transaction(Message(t.real_topic, b"untraced"), COMMIT)
    incoming = propagate.extract({"traceparent": CALLER, "tracestate": "vendor=abc"})
    token = context.attach(incoming)
    try:
        producer.send_message_in_transaction(Message(t.real_topic, b"traced"), COMMIT)
    finally:
        context.detach(token)
    halves = {raw.value: raw for raw in t.read(t.names.half)}
    untraced, traced = halves[b"untraced"], halves[b"traced"]
    assert [name for name, _ in untraced.headers if not name.startswith("outbox-")] == []
    assert header(traced, "traceparent") == CALLER.encode()
    assert header(traced, "tracestate") == b"vendor=abc"
