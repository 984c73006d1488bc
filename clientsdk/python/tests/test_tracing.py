"""OpenTelemetry spans of a call and the trace context sent to the sidecar,
against an in-process gRPC server that plays the sidecar, with the SDK's
InMemorySpanExporter."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

import polygate
from polygate._gen.polygate.admission.v1 import admission_pb2 as pb
from polygate._gen.polygate.admission.v1 import admission_pb2_grpc as pb_grpc


class Scripted(pb_grpc.AdmissionServiceServicer):
    """One call: it waits once (a circuit_open, b rate_limited), gets source
    a, is told to retry, gets b and is done. Keeps each RPC's method and
    traceparent."""

    def __init__(self) -> None:
        self.rpcs: list[str] = []
        self.picks = 0
        self.lock = threading.Lock()

    def _seen(self, method: str, context: Any) -> None:
        with self.lock:
            self.rpcs.append(f"{method} {dict(context.invocation_metadata()).get('traceparent', '')}")

    def Pick(self, request: pb.PickRequest, context: Any) -> pb.PickResponse:
        self._seen("Pick", context)
        with self.lock:
            self.picks += 1
            n = self.picks
        if n == 1:
            return pb.PickResponse(
                call_id="c1",
                no_runnable=pb.NoRunnable(
                    per_source_reasons=[
                        pb.SourceReason(source="a", reason=pb.REASON_CIRCUIT_OPEN),
                        pb.SourceReason(source="b", reason=pb.REASON_RATE_LIMITED),
                    ]
                ),
            )
        if n == 2:
            return pb.PickResponse(call_id="c1", grant=pb.Grant(source="a", attempt=1, permit_id="p1"))
        return pb.PickResponse(call_id="c1", grant=pb.Grant(source="b", attempt=2, permit_id="p2"))

    def OnNoRunnable(self, request: pb.OnNoRunnableRequest, context: Any) -> pb.OnNoRunnableResponse:
        self._seen("OnNoRunnable", context)
        w = pb.Wait()
        w.sleep.FromMilliseconds(1)
        return pb.OnNoRunnableResponse(wait=w)

    def RecordOutcome(self, request: pb.RecordOutcomeRequest, context: Any) -> pb.RecordOutcomeResponse:
        self._seen("RecordOutcome", context)
        if request.permit_id == "p1":
            r = pb.Retry()
            r.backoff.FromMilliseconds(1)
            return pb.RecordOutcomeResponse(retry=r)
        return pb.RecordOutcomeResponse(done=pb.Done())

    def CancelCall(self, request: pb.CancelCallRequest, context: Any) -> pb.CancelCallResponse:
        self._seen("CancelCall", context)
        return pb.CancelCallResponse(ended_now=True)


@pytest.fixture
def sidecar() -> Iterator[tuple[str, Scripted]]:
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = Scripted()
    pb_grpc.add_AdmissionServiceServicer_to_server(servicer, srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    yield f"127.0.0.1:{port}", servicer
    srv.stop(None)


@pytest.fixture
def spans() -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    return tp, exporter


def attempt(g: polygate.Grant) -> polygate.Result[str]:
    if g.source == "a":
        return polygate.Result(polygate.Outcome.TRANSIENT, http_status=503)
    return polygate.Result(polygate.Outcome.SUCCESS, value="answer", http_status=200)


def traceparent(span: ReadableSpan) -> str:
    c = span.get_span_context()
    assert c is not None
    return f"00-{c.trace_id:032x}-{c.span_id:016x}-{c.trace_flags:02x}"


def check_tree(exporter: InMemorySpanExporter, app: Any, side: Scripted, fn_spans: list[Any]) -> None:
    got = exporter.get_finished_spans()
    by_name: dict[str, list[ReadableSpan]] = {}
    for s in got:
        by_name.setdefault(s.name, []).append(s)
    assert sorted(by_name) == ["app request", "polygate.attempt", "polygate.call"], by_name
    (call,) = by_name["polygate.call"]
    a1, a2 = sorted(by_name["polygate.attempt"], key=lambda s: s.start_time or 0)
    app_ctx = app.get_span_context()
    assert call.parent is not None and call.parent.span_id == app_ctx.span_id
    assert call.context is not None and call.context.trace_id == app_ctx.trace_id
    for a in (a1, a2):
        assert a.parent is not None and call.context is not None and a.parent.span_id == call.context.span_id
    assert dict(a1.attributes or {}) == {
        "polygate.scope": "chat",
        "polygate.source": "a",
        "polygate.attempt": 1,
        "polygate.probe": False,
        "polygate.outcome": "TRANSIENT",
        "polygate.http_status": 503,
        "polygate.verdict": "retry",
        "polygate.backoff_s": 0.001,
        "polygate.waits": 1,
        "polygate.wait.cause": "a=circuit_open,b=rate_limited",
    }
    assert [e.name for e in a1.events] == ["wait"]
    assert dict(a2.attributes or {}) == {
        "polygate.scope": "chat",
        "polygate.source": "b",
        "polygate.attempt": 2,
        "polygate.probe": False,
        "polygate.outcome": "SUCCESS",
        "polygate.http_status": 200,
        "polygate.verdict": "done",
    }
    attrs = dict(call.attributes or {})
    assert attrs["polygate.verdict"] == "done" and attrs["polygate.attempts"] == 2 and attrs["polygate.call_id"] == "c1"
    # The attempt function ran under its attempt's span.
    assert [s.span_id for s in fn_spans] == [a1.context.span_id, a2.context.span_id]  # type: ignore[union-attr]
    p1, p2 = traceparent(a1), traceparent(a2)
    assert side.rpcs == [f"Pick {p1}", f"OnNoRunnable {p1}", f"Pick {p1}", f"RecordOutcome {p1}", f"Pick {p2}", f"RecordOutcome {p2}"]


def test_call_and_attempt_spans_and_the_trace_context(sidecar: tuple[str, Scripted], spans: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    target, side = sidecar
    tp, exporter = spans
    fn_spans: list[Any] = []

    def fn(g: polygate.Grant) -> polygate.Result[str]:
        fn_spans.append(trace.get_current_span().get_span_context())
        return attempt(g)

    with polygate.Client(target, tracer_provider=tp) as client:
        with tp.get_tracer("app").start_as_current_span("app request") as app:
            assert client.call("chat", fn) == "answer"
    check_tree(exporter, app, side, fn_spans)


async def test_async_call_and_attempt_spans(sidecar: tuple[str, Scripted], spans: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    target, side = sidecar
    tp, exporter = spans
    fn_spans: list[Any] = []

    async def fn(g: polygate.Grant) -> polygate.Result[str]:
        fn_spans.append(trace.get_current_span().get_span_context())
        return attempt(g)

    async with polygate.AsyncClient(target, tracer_provider=tp) as client:
        with tp.get_tracer("app").start_as_current_span("app request") as app:
            assert await client.call("chat", fn) == "answer"
    check_tree(exporter, app, side, fn_spans)


def test_a_verdict_ends_the_spans_as_errors(spans: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    class Refuses(pb_grpc.AdmissionServiceServicer):
        def Pick(self, request: pb.PickRequest, context: Any) -> pb.PickResponse:
            return pb.PickResponse(call_id="c1", failure=pb.Failure(reason=pb.FAILURE_REASON_CIRCUIT_OPEN))

    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    pb_grpc.add_AdmissionServiceServicer_to_server(Refuses(), srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    tp, exporter = spans
    try:
        with polygate.Client(f"127.0.0.1:{port}", tracer_provider=tp) as client, pytest.raises(polygate.CircuitOpenError):
            client.call("chat", attempt)
    finally:
        srv.stop(None)
    got = exporter.get_finished_spans()
    assert sorted(s.name for s in got) == ["polygate.attempt", "polygate.call"]
    for s in got:
        attrs = dict(s.attributes or {})
        assert attrs["polygate.verdict"] == "failure" and attrs["polygate.reason"] == "circuit_open", attrs
        assert s.status.status_code == trace.StatusCode.ERROR


def test_no_tracer_provider_sends_no_trace_context(sidecar: tuple[str, Scripted]) -> None:
    """The global provider, unset, is a no-op: nothing reaches the sidecar."""
    target, side = sidecar
    with polygate.Client(target) as client:
        assert client.call("chat", attempt) == "answer"
    assert all(r.endswith(" ") for r in side.rpcs), side.rpcs


def test_without_opentelemetry_the_sdk_works(sidecar: tuple[str, Scripted]) -> None:
    """With opentelemetry not importable (the otel extra not installed) a
    call runs as before, with no trace context."""
    target, side = sidecar
    code = f"""
import sys
sys.modules["opentelemetry"] = None  # import opentelemetry raises ImportError
import polygate, polygate._tracing
assert polygate._tracing.tracer() is None
def attempt(g):
    if g.source == "a":
        return polygate.Result(polygate.Outcome.TRANSIENT, http_status=503)
    return polygate.Result(polygate.Outcome.SUCCESS, value="answer")
with polygate.Client("{target}") as c:
    assert c.call("chat", attempt) == "answer"
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert len(side.rpcs) == 6 and all(r.endswith(" ") for r in side.rpcs), side.rpcs


@pytest.mark.parametrize(("exc", "verdict"), [(RuntimeError("boom"), "error"), (KeyboardInterrupt(), "cancelled")])
def test_an_exception_in_the_attempt_ends_the_spans(
    sidecar: tuple[str, Scripted], spans: tuple[TracerProvider, InMemorySpanExporter], exc: BaseException, verdict: str
) -> None:
    target, side = sidecar
    tp, exporter = spans

    def fn(g: polygate.Grant) -> polygate.Result[str]:
        raise exc

    with polygate.Client(target, tracer_provider=tp) as client, pytest.raises(type(exc)):
        client.call("chat", fn)
    got = {s.name: s for s in exporter.get_finished_spans()}
    assert sorted(got) == ["polygate.attempt", "polygate.call"]
    for s in got.values():
        assert (s.attributes or {})["polygate.verdict"] == verdict and s.status.status_code == trace.StatusCode.ERROR
    assert side.rpcs[-1].startswith("CancelCall 00-"), "the CancelCall carries the attempt's trace context"


def test_an_unsampled_call_propagates_its_context_and_builds_no_attributes(sidecar: tuple[str, Scripted]) -> None:
    """A call whose trace is not sampled still sends the trace context (the
    sidecar's spans follow the caller's decision), and the SDK builds no
    attributes for spans nobody records."""
    target, side = sidecar
    tp = TracerProvider(sampler=ALWAYS_OFF)
    built: list[str] = []
    real = trace.NonRecordingSpan.set_attributes

    def spy(self: Any, attributes: Any) -> None:
        built.append(str(attributes))
        real(self, attributes)

    trace.NonRecordingSpan.set_attributes = spy  # type: ignore[method-assign]
    try:
        with polygate.Client(target, tracer_provider=tp) as client:
            assert client.call("chat", attempt) == "answer"
    finally:
        trace.NonRecordingSpan.set_attributes = real  # type: ignore[method-assign]
    # Every RPC carries a trace context whose sampled flag is off.
    assert len(side.rpcs) == 6 and all(int(r.rsplit("-", 1)[1], 16) & 1 == 0 for r in side.rpcs), side.rpcs
    assert built == [], built
