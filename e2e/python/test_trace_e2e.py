"""One trace across the application, the Python SDK and the real sidecar:
openai through PolygateTransport fails over from a 503 to the other source
inside one create, the SDK's spans go to an in-memory exporter, and the
sidecar exports its spans over OTLP/HTTP (the protocol's default) to a
receiver this test serves. The sidecar's Pick and RecordOutcome spans must
be children of the SDK's attempt spans."""

from __future__ import annotations

import gzip
import http.server
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest
from conftest import TIMEOUT, Sidecar, Upstream
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_openai import MESSAGES, PLACEHOLDER, two_sources

import polygate
from polygate.transport import PolygateTransport


@dataclass
class Span:
    trace_id: bytes
    span_id: bytes
    parent_span_id: bytes
    name: str


def _fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
    """The (field number, value) pairs of a protobuf message: varints as
    ints, length-delimited fields as bytes (the wire format; fixed-width
    fields are skipped)."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _varint(buf, i)
            yield num, v
        elif wire == 2:
            n, i = _varint(buf, i)
            yield num, buf[i : i + n]
            i += n
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError(f"wire type {wire}")


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def _spans(export_request: bytes) -> list[Span]:
    """The spans of an ExportTraceServiceRequest: resource_spans (1) ->
    scope_spans (2) -> spans (2) -> trace_id (1), span_id (2),
    parent_span_id (4), name (5)."""
    out = []
    for n1, rs in _fields(export_request):
        if n1 != 1 or not isinstance(rs, bytes):
            continue
        for n2, ss in _fields(rs):
            if n2 != 2 or not isinstance(ss, bytes):
                continue
            for n3, sp in _fields(ss):
                if n3 != 2 or not isinstance(sp, bytes):
                    continue
                f = {n: v for n, v in _fields(sp) if isinstance(v, bytes)}
                out.append(Span(f.get(1, b""), f.get(2, b""), f.get(4, b""), f.get(5, b"").decode()))
    return out


class Receiver(http.server.ThreadingHTTPServer):
    """An OTLP/HTTP trace receiver: POST /v1/traces of application/x-protobuf."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                ok = self.path == "/v1/traces" and self.headers.get("Content-Type") == "application/x-protobuf"
                if ok:
                    with receiver.lock:
                        receiver.spans.extend(_spans(body))
                self.send_response(200 if ok else 400)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    t = threading.Thread(target=r.serve_forever, daemon=True)
    t.start()
    yield r
    r.shutdown()
    r.server_close()


def test_one_trace_from_the_app_through_the_sidecar(upstream: Upstream, start_sidecar: Callable[..., Sidecar], receiver: Receiver) -> None:
    sc = start_sidecar(
        two_sources(upstream),
        env={
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.server_address[1]}",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        },
    )
    upstream.set("a", {"status": 503})
    exporter = InMemorySpanExporter()
    tp = TracerProvider()
    tp.add_span_processor(SimpleSpanProcessor(exporter))
    with polygate.Client(sc.addr, tracer_provider=tp) as pg:
        transport = PolygateTransport(pg, "chat", estimated_tokens=500)
        with openai.OpenAI(base_url=PLACEHOLDER, api_key="k", http_client=httpx.Client(transport=transport), max_retries=0) as llm:
            with tp.get_tracer("app").start_as_current_span("app request") as app:
                completion = llm.chat.completions.create(model="x", messages=MESSAGES)  # type: ignore[arg-type]
    assert completion.choices[0].message.content == "ok from b"

    sdk = exporter.get_finished_spans()
    attempts = sorted((s for s in sdk if s.name == "polygate.attempt"), key=lambda s: s.start_time or 0)
    assert [(s.attributes or {}).get("polygate.source") for s in attempts] == ["a", "b"]
    assert [(s.attributes or {}).get("polygate.http_status") for s in attempts] == [503, 200]
    trace_id = app.get_span_context().trace_id.to_bytes(16, "big")
    attempt_ids = [s.context.span_id.to_bytes(8, "big") for s in attempts if s.context is not None]

    def sidecar_spans() -> list[Span]:
        with receiver.lock:
            return [s for s in receiver.spans if s.trace_id == trace_id]

    deadline = time.monotonic() + TIMEOUT
    while len(sidecar_spans()) < 4:
        assert time.monotonic() < deadline, f"the sidecar's spans of the trace: {sidecar_spans()}\n{''.join(sc.logs)}"
        time.sleep(0.02)
    under = {a: sorted(s.name.rsplit("/", 1)[-1] for s in sidecar_spans() if s.parent_span_id == a) for a in attempt_ids}
    assert list(under.values()) == [["Pick", "RecordOutcome"], ["Pick", "RecordOutcome"]], under

    lines = [f"trace {trace_id.hex()}", "└─ app request", "   └─ polygate.call"]
    for i, a in enumerate(attempts):
        attrs = a.attributes or {}
        last = i == len(attempts) - 1
        lines.append(
            f"      {'└─' if last else '├─'} polygate.attempt source={attrs.get('polygate.source')} "
            f"outcome={attrs.get('polygate.outcome')} http_status={attrs.get('polygate.http_status')} verdict={attrs.get('polygate.verdict')}"
        )
        names = under[attempt_ids[i]]
        for j, n in enumerate(names):
            lines.append(f"      {'   ' if last else '│  '}{'└─' if j == len(names) - 1 else '├─'} {n} (the sidecar's)")
    print("\n".join(lines))
