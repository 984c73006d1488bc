"""The transports' request rewriting, response reading, answers to verdicts
and retry check, for each HTTP library flavour (httpx, httpx2: one
implementation), with a stand-in for the sidecar client and MockTransport
upstreams (the real sidecar and openai are in e2e/python/)."""

from __future__ import annotations

import gzip
import importlib
import json
import types
import warnings
from typing import Any

import pytest

import polygate
from polygate import Grant, Outcome, Result

USAGE = {"choices": [], "usage": {"total_tokens": 42}}


@pytest.fixture(params=["httpx", "httpx2"])
def hx(request: pytest.FixtureRequest) -> types.SimpleNamespace:
    """The HTTP library (``hx.lib``) and polygate's transports for it."""
    lib = pytest.importorskip(request.param)
    pg = importlib.import_module(f"polygate.{request.param}")
    return types.SimpleNamespace(lib=lib, PolygateTransport=pg.PolygateTransport, AsyncPolygateTransport=pg.AsyncPolygateTransport)


class FakeClient:
    """Grants each source in turn until an attempt succeeds, like a sidecar
    with max_attempts = len(sources)."""

    on_sidecar_unavailable = "fail"

    def __init__(self, *sources: tuple[str, str], timeout_s: float = 5.0) -> None:
        self.sources = sources
        self.timeout_s = timeout_s
        self.results: list[Result[Any]] = []
        self.estimates: list[int] = []

    def grants(self) -> list[Grant]:
        return [Grant("c1", name, {"base_url": url}, i + 1, False, self.timeout_s, f"p{i}") for i, (name, url) in enumerate(self.sources)]

    def call(self, scope: str, fn: Any, *, estimated_tokens: int = 0, deadline: float | None = None, priority: int | None = None, tenant: str | None = None) -> Any:
        self.estimates.append(estimated_tokens)
        for g in self.grants():
            r = fn(g)
            self.results.append(r)
            if r.outcome == Outcome.SUCCESS:
                return r.value
        raise polygate.RetryExhaustedError(scope=scope, call_id="c1", attempts=len(self.sources), last_result=r)


class AsyncFakeClient(FakeClient):
    async def call(self, scope: str, fn: Any, *, estimated_tokens: int = 0, deadline: float | None = None, priority: int | None = None, tenant: str | None = None) -> Any:  # type: ignore[override]
        self.estimates.append(estimated_tokens)
        for g in self.grants():
            r = await fn(g)
            self.results.append(r)
            if r.outcome == Outcome.SUCCESS:
                return r.value
        raise polygate.RetryExhaustedError(scope=scope, call_id="c1", attempts=len(self.sources), last_result=r)


def upstream(hx: types.SimpleNamespace, seen: list[Any], answers: dict[str, Any]) -> Any:
    def handle(req: Any) -> Any:
        req.read()
        seen.append(req)
        return answers[req.url.host]

    return hx.lib.MockTransport(handle)


def test_failover_rewrites_url_host_and_keeps_body_and_query(hx: types.SimpleNamespace) -> None:
    seen: list[Any] = []
    inner = upstream(hx, seen, {"a.test": hx.lib.Response(503, json={"error": {}}), "b.test": hx.lib.Response(200, json=USAGE)})
    pg = FakeClient(("a", "https://a.test/v1"), ("b", "http://b.test:8080/v1/"))
    with hx.lib.Client(transport=hx.PolygateTransport(pg, "chat", inner=inner, base_url="http://polygate/v1", estimated_tokens=lambda r: len(r.content))) as http:  # type: ignore[arg-type]
        resp = http.post("http://polygate/v1/chat/completions?x=1", json={"q": 1})
    assert resp.status_code == 200 and resp.json() == USAGE
    assert [str(r.url) for r in seen] == ["https://a.test/v1/chat/completions?x=1", "http://b.test:8080/v1/chat/completions?x=1"]
    assert [r.headers["host"] for r in seen] == ["a.test", "b.test:8080"]
    assert all(json.loads(r.content) == {"q": 1} for r in seen), "the body is sent again to the second source"
    assert [(r.outcome, r.http_status, r.actual_tokens) for r in pg.results] == [(Outcome.TRANSIENT, 503, None), (Outcome.SUCCESS, 200, 42)]
    assert pg.estimates == [len(b'{"q":1}')]


def test_default_base_url_keeps_the_whole_path(hx: types.SimpleNamespace) -> None:
    seen: list[Any] = []
    pg = FakeClient(("a", "http://a.test/route"))
    with hx.lib.Client(transport=hx.PolygateTransport(pg, "chat", inner=upstream(hx, seen, {"a.test": hx.lib.Response(200)}))) as http:  # type: ignore[arg-type]
        http.get("http://anything.invalid/v1/models")
    assert str(seen[0].url) == "http://a.test/route/v1/models"


def test_request_outside_base_url_is_refused(hx: types.SimpleNamespace) -> None:
    pg = FakeClient(("a", "http://a.test"))
    with hx.lib.Client(transport=hx.PolygateTransport(pg, "chat", inner=upstream(hx, [], {}), base_url="http://polygate/v1")) as http:  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="not under the transport's base_url"):
            http.get("http://polygate/v10/models")


def test_prepare_sets_each_sources_key_and_the_grants_timeout_caps_the_clients(hx: types.SimpleNamespace) -> None:
    seen: list[Any] = []
    keys = {"a": "key-a", "b": "key-b"}
    inner = upstream(hx, seen, {"a.test": hx.lib.Response(429, json={}), "b.test": hx.lib.Response(200, json={})})
    pg = FakeClient(("a", "http://a.test"), ("b", "http://b.test"), timeout_s=2.0)

    def prepare(req: Any, grant: Grant) -> None:
        req.headers["authorization"] = f"Bearer {keys[grant.source]}"

    with hx.lib.Client(transport=hx.PolygateTransport(pg, "chat", inner=inner, prepare=prepare), timeout=hx.lib.Timeout(10.0, connect=1.0)) as http:  # type: ignore[arg-type]
        http.post("http://p/x", content=b"hi")
    assert [r.headers["authorization"] for r in seen] == ["Bearer key-a", "Bearer key-b"]
    assert seen[0].extensions["timeout"] == {"connect": 1.0, "read": 2.0, "write": 2.0, "pool": 2.0}


def test_compressed_json_is_classified_decoded_and_still_readable(hx: types.SimpleNamespace) -> None:
    body = gzip.compress(json.dumps({"error": {"code": "insufficient_quota"}}).encode())
    bad = hx.lib.Response(429, headers={"content-encoding": "gzip", "content-type": "application/json"}, content=body)
    good_body = gzip.compress(json.dumps(USAGE).encode())
    good = hx.lib.Response(200, headers={"content-encoding": "gzip", "content-type": "application/json"}, content=good_body)
    pg = FakeClient(("a", "http://a.test"), ("b", "http://b.test"))
    with hx.lib.Client(transport=hx.PolygateTransport(pg, "chat", inner=upstream(hx, [], {"a.test": bad, "b.test": good}))) as http:  # type: ignore[arg-type]
        resp = http.get("http://p/x")
    assert resp.json() == USAGE
    assert [(r.outcome, r.actual_tokens) for r in pg.results] == [(Outcome.SOURCE_DEAD, None), (Outcome.SUCCESS, 42)]


def test_a_stream_is_passed_through_unread(hx: types.SimpleNamespace) -> None:
    chunks = [b"data: {}\n\n", b"data: [DONE]\n\n"]
    stream = hx.lib.Response(200, headers={"content-type": "text/event-stream"}, stream=hx.lib.ByteStream(b"".join(chunks)))
    pg = FakeClient(("a", "http://a.test"))
    with hx.lib.Client(transport=hx.PolygateTransport(pg, "chat", inner=upstream(hx, [], {"a.test": stream}))) as http:  # type: ignore[arg-type]
        with http.stream("POST", "http://p/x", json={"stream": True}) as resp:
            assert b"".join(resp.iter_raw()) == b"".join(chunks)
    assert (pg.results[0].outcome, pg.results[0].actual_tokens) == (Outcome.SUCCESS, None)


def test_non_retryable_returns_the_last_response_with_the_verdict(hx: types.SimpleNamespace) -> None:
    pg = FakeClient(("a", "http://a.test"), ("b", "http://b.test"))
    answers = {"a.test": hx.lib.Response(503, json={"n": "a"}), "b.test": hx.lib.Response(400, json={"n": "b"})}

    def call(scope: str, fn: Any, **kw: Any) -> Any:
        for g in pg.grants():
            r = fn(g)
        raise polygate.NonRetryableError(scope=scope, call_id="c1", attempts=2, last_result=r)

    pg.call = call  # type: ignore[method-assign]
    with hx.lib.Client(transport=hx.PolygateTransport(pg, "chat", inner=upstream(hx, [], answers))) as http:  # type: ignore[arg-type]
        resp = http.get("http://p/x")
    assert (resp.status_code, resp.json()) == (400, {"n": "b"})
    assert isinstance(resp.extensions["polygate_verdict"], polygate.NonRetryableError)


def test_a_verdict_after_upstream_answers_returns_the_last_one_with_the_verdicts_headers(hx: types.SimpleNamespace) -> None:
    pg = FakeClient(("a", "http://a.test"), ("b", "http://b.test"))
    answers = {"a.test": hx.lib.Response(503, json={"n": "a"}), "b.test": hx.lib.Response(502, json={"n": "b"})}
    with hx.lib.Client(transport=hx.PolygateTransport(pg, "chat", inner=upstream(hx, [], answers))) as http:  # type: ignore[arg-type]
        resp = http.get("http://p/x")
    assert (resp.status_code, resp.json()) == (502, {"n": "b"}), "the upstream's own answer"
    assert resp.headers["polygate-failure-reason"] == "retry_exhausted"
    assert resp.headers["polygate-retry-after"] == "0.000"
    assert resp.headers["polygate-call-id"] == "c1"
    err = polygate.failure_of(resp)
    assert isinstance(err, polygate.RetryExhaustedError) and err.attempts == 2


def test_a_verdict_without_an_upstream_answer_is_a_synthesized_503(hx: types.SimpleNamespace) -> None:
    def refuse(req: Any) -> Any:
        raise hx.lib.ConnectError("refused", request=req)

    pg = FakeClient(("a", "http://a.test"))
    with hx.lib.Client(transport=hx.PolygateTransport(pg, "chat", inner=hx.lib.MockTransport(refuse))) as http:  # type: ignore[arg-type]
        resp = http.get("http://p/x")
    assert resp.status_code == 503 and resp.headers["content-type"] == "application/json"
    assert resp.headers["polygate-failure-reason"] == "retry_exhausted" and "retry-after" not in resp.headers
    error = resp.json()["error"]
    assert (error["type"], error["code"], error["polygate"]["attempts"]) == ("polygate_error", "retry_exhausted", 1)
    assert error["message"] == "polygate: retry_exhausted in scope chat (call c1)"
    err = polygate.failure_of(resp)
    assert err is not None and err.last_result is not None and "ConnectError" in err.last_result.detail


@pytest.mark.parametrize(
    ("verdict", "status"),
    [
        (polygate.CircuitOpenError, 503),
        (polygate.QuotaExhaustedError, 429),
        (polygate.StalledError, 503),
        (polygate.SourceDeadError, 503),
        (polygate.BudgetExhaustedError, 429),
    ],
)
def test_refusals_are_synthesized_with_the_reason_and_when_to_retry(hx: types.SimpleNamespace, verdict: type[polygate.CallFailedError], status: int) -> None:
    reasons = [polygate.SourceReason("a", "circuit_open", 29.8712), polygate.SourceReason("b", "probe_in_flight", 0.0)]
    pg = FakeClient()

    def call(scope: str, fn: Any, **kw: Any) -> Any:
        raise verdict(scope=scope, call_id="c9", retry_after_s=29.8712, per_source_reasons=reasons)

    pg.call = call  # type: ignore[method-assign]
    with hx.lib.Client(transport=hx.PolygateTransport(pg, "chat")) as http:  # type: ignore[arg-type]
        resp = http.post("http://p/v1/chat/completions", json={})
    reason = verdict.reason
    assert resp.status_code == status
    assert (resp.headers["polygate-failure-reason"], resp.headers["polygate-retry-after"], resp.headers["retry-after"]) == (reason, "29.872", "30")
    assert resp.json() == {
        "error": {
            "message": f"polygate: {reason} in scope chat, retry after 29.872s (call c9): a circuit_open 29.872s; b probe_in_flight",
            "type": "polygate_error",
            "code": reason,
            "param": None,
            "polygate": {
                "reason": reason,
                "retry_after_s": 29.872,
                "scope": "chat",
                "call_id": "c9",
                "attempts": 0,
                "per_source": [{"source": "a", "reason": "circuit_open", "retry_after_s": 29.872}, {"source": "b", "reason": "probe_in_flight", "retry_after_s": 0.0}],
            },
        }
    }
    assert isinstance(polygate.failure_of(resp), verdict)


def test_a_success_carries_the_call_id(hx: types.SimpleNamespace) -> None:
    pg = FakeClient(("a", "http://a.test"))
    with hx.lib.Client(transport=hx.PolygateTransport(pg, "chat", inner=upstream(hx, [], {"a.test": hx.lib.Response(200, json=USAGE)}))) as http:  # type: ignore[arg-type]
        resp = http.get("http://p/x")
    assert resp.headers["polygate-call-id"] == "c1" and "polygate-failure-reason" not in resp.headers
    assert polygate.failure_of(resp) is None


def test_sidecar_unreachable_raises_unless_allowed_then_passes_the_upstream_through(hx: types.SimpleNamespace) -> None:
    import grpc

    answers = {"a.test": hx.lib.Response(401, json={"error": {"message": "Incorrect API key provided"}})}
    down = polygate.UnavailableError("Pick", grpc.StatusCode.UNAVAILABLE, "connection refused")
    backend = polygate.UnavailableError("Pick", grpc.StatusCode.UNAVAILABLE, "redis down", "ERROR_REASON_BACKEND_UNAVAILABLE")
    for mode, err, attempted, passes in (("fail", down, True, False), ("allow", down, True, True), ("allow", down, False, False), ("allow", backend, True, False)):
        pg = FakeClient(("a", "http://a.test"))
        pg.on_sidecar_unavailable = mode

        def call(scope: str, fn: Any, **kw: Any) -> Any:
            if attempted:  # the ungoverned attempt, made by the client's loop
                fn(Grant("", "a", {"base_url": "http://a.test"}, 1, False, 0.0, ""))
            raise err

        pg.call = call  # type: ignore[method-assign]
        with hx.lib.Client(transport=hx.PolygateTransport(pg, "chat", inner=upstream(hx, [], answers))) as http:  # type: ignore[arg-type]
            if passes:
                resp = http.get("http://p/x")
                assert resp.status_code == 401 and "polygate-failure-reason" not in resp.headers, "the upstream's own answer, as it came"
                continue
            with pytest.raises(polygate.UnavailableError) as info:
                http.get("http://p/x")
            assert info.value is err, (mode, err.reason, attempted)


def test_provider_retry_warns_once(hx: types.SimpleNamespace) -> None:
    pg = FakeClient(("a", "http://a.test"))
    with hx.lib.Client(transport=hx.PolygateTransport(pg, "chat", inner=upstream(hx, [], {"a.test": hx.lib.Response(200)}))) as http:  # type: ignore[arg-type]
        with warnings.catch_warnings():
            warnings.simplefilter("error", polygate.ProviderRetryWarning)
            http.get("http://p/x", headers={"x-stainless-retry-count": "0"})
        with pytest.warns(polygate.ProviderRetryWarning, match="max_retries=0"):
            http.get("http://p/x", headers={"x-stainless-retry-count": "1"})
        with warnings.catch_warnings():
            warnings.simplefilter("error", polygate.ProviderRetryWarning)
            http.get("http://p/x", headers={"x-stainless-retry-count": "2"})  # once per transport


async def test_async_transport_fails_over(hx: types.SimpleNamespace) -> None:
    seen: list[Any] = []

    async def handle(req: Any) -> hx.lib.Response:
        await req.aread()
        seen.append(req)
        return hx.lib.Response(503) if req.url.host == "a.test" else hx.lib.Response(200, json=USAGE)

    pg = AsyncFakeClient(("a", "http://a.test"), ("b", "http://b.test"))
    async with hx.lib.AsyncClient(transport=hx.AsyncPolygateTransport(pg, "chat", inner=hx.lib.MockTransport(handle))) as http:  # type: ignore[arg-type]
        resp = await http.post("http://p/v1/chat/completions", json={"q": 1})
    assert resp.json() == USAGE
    assert [r.url.host for r in seen] == ["a.test", "b.test"]
    assert pg.results[-1].actual_tokens == 42


def test_polygate_exports_the_httpx_transports_lazily() -> None:
    import polygate.httpx
    import polygate.transport

    assert polygate.PolygateTransport is polygate.httpx.PolygateTransport is polygate.transport.PolygateTransport
    assert polygate.transport.ProviderRetryWarning is polygate.ProviderRetryWarning
    with pytest.raises(AttributeError):
        polygate.NoSuchThing  # noqa: B018
