"""The httpx transports' request rewriting, response reading and retry check,
with a stand-in for the sidecar client and httpx.MockTransport upstreams (the
real sidecar and openai are in e2e/python/test_transport.py)."""

from __future__ import annotations

import gzip
import json
import warnings
from typing import Any

import httpx
import pytest

import polygate
from polygate import Grant, Outcome, Result
from polygate.transport import AsyncPolygateTransport, PolygateTransport, ProviderRetryWarning

USAGE = {"choices": [], "usage": {"total_tokens": 42}}


class FakeClient:
    """Grants each source in turn until an attempt succeeds, like a sidecar
    with max_attempts = len(sources)."""

    def __init__(self, *sources: tuple[str, str], timeout_s: float = 5.0) -> None:
        self.sources = sources
        self.timeout_s = timeout_s
        self.results: list[Result[Any]] = []
        self.estimates: list[int] = []

    def grants(self) -> list[Grant]:
        return [Grant("c1", name, {"base_url": url}, i + 1, False, self.timeout_s, f"p{i}") for i, (name, url) in enumerate(self.sources)]

    def call(self, scope: str, fn: Any, *, estimated_tokens: int = 0, deadline: float | None = None) -> Any:
        self.estimates.append(estimated_tokens)
        for g in self.grants():
            r = fn(g)
            self.results.append(r)
            if r.outcome == Outcome.SUCCESS:
                return r.value
        raise polygate.RetryExhaustedError(scope=scope, call_id="c1", attempts=len(self.sources), last_result=r)


class AsyncFakeClient(FakeClient):
    async def call(self, scope: str, fn: Any, *, estimated_tokens: int = 0, deadline: float | None = None) -> Any:  # type: ignore[override]
        self.estimates.append(estimated_tokens)
        for g in self.grants():
            r = await fn(g)
            self.results.append(r)
            if r.outcome == Outcome.SUCCESS:
                return r.value
        raise polygate.RetryExhaustedError(scope=scope, call_id="c1", attempts=len(self.sources), last_result=r)


def upstream(seen: list[httpx.Request], answers: dict[str, httpx.Response]) -> httpx.MockTransport:
    def handle(req: httpx.Request) -> httpx.Response:
        req.read()
        seen.append(req)
        return answers[req.url.host]

    return httpx.MockTransport(handle)


def test_failover_rewrites_url_host_and_keeps_body_and_query() -> None:
    seen: list[httpx.Request] = []
    inner = upstream(seen, {"a.test": httpx.Response(503, json={"error": {}}), "b.test": httpx.Response(200, json=USAGE)})
    pg = FakeClient(("a", "https://a.test/v1"), ("b", "http://b.test:8080/v1/"))
    with httpx.Client(transport=PolygateTransport(pg, "chat", inner=inner, base_url="http://polygate/v1", estimated_tokens=lambda r: len(r.content))) as http:  # type: ignore[arg-type]
        resp = http.post("http://polygate/v1/chat/completions?x=1", json={"q": 1})
    assert resp.status_code == 200 and resp.json() == USAGE
    assert [str(r.url) for r in seen] == ["https://a.test/v1/chat/completions?x=1", "http://b.test:8080/v1/chat/completions?x=1"]
    assert [r.headers["host"] for r in seen] == ["a.test", "b.test:8080"]
    assert all(json.loads(r.content) == {"q": 1} for r in seen), "the body is sent again to the second source"
    assert [(r.outcome, r.http_status, r.actual_tokens) for r in pg.results] == [(Outcome.TRANSIENT, 503, None), (Outcome.SUCCESS, 200, 42)]
    assert pg.estimates == [len(b'{"q":1}')]


def test_default_base_url_keeps_the_whole_path() -> None:
    seen: list[httpx.Request] = []
    pg = FakeClient(("a", "http://a.test/route"))
    with httpx.Client(transport=PolygateTransport(pg, "chat", inner=upstream(seen, {"a.test": httpx.Response(200)}))) as http:  # type: ignore[arg-type]
        http.get("http://anything.invalid/v1/models")
    assert str(seen[0].url) == "http://a.test/route/v1/models"


def test_request_outside_base_url_is_refused() -> None:
    pg = FakeClient(("a", "http://a.test"))
    with httpx.Client(transport=PolygateTransport(pg, "chat", inner=upstream([], {}), base_url="http://polygate/v1")) as http:  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="not under the transport's base_url"):
            http.get("http://polygate/v10/models")


def test_prepare_sets_each_sources_key_and_the_grants_timeout_caps_the_clients() -> None:
    seen: list[httpx.Request] = []
    keys = {"a": "key-a", "b": "key-b"}
    inner = upstream(seen, {"a.test": httpx.Response(429, json={}), "b.test": httpx.Response(200, json={})})
    pg = FakeClient(("a", "http://a.test"), ("b", "http://b.test"), timeout_s=2.0)

    def prepare(req: httpx.Request, grant: Grant) -> None:
        req.headers["authorization"] = f"Bearer {keys[grant.source]}"

    with httpx.Client(transport=PolygateTransport(pg, "chat", inner=inner, prepare=prepare), timeout=httpx.Timeout(10.0, connect=1.0)) as http:  # type: ignore[arg-type]
        http.post("http://p/x", content=b"hi")
    assert [r.headers["authorization"] for r in seen] == ["Bearer key-a", "Bearer key-b"]
    assert seen[0].extensions["timeout"] == {"connect": 1.0, "read": 2.0, "write": 2.0, "pool": 2.0}


def test_compressed_json_is_classified_decoded_and_still_readable() -> None:
    body = gzip.compress(json.dumps({"error": {"code": "insufficient_quota"}}).encode())
    bad = httpx.Response(429, headers={"content-encoding": "gzip", "content-type": "application/json"}, content=body)
    good_body = gzip.compress(json.dumps(USAGE).encode())
    good = httpx.Response(200, headers={"content-encoding": "gzip", "content-type": "application/json"}, content=good_body)
    pg = FakeClient(("a", "http://a.test"), ("b", "http://b.test"))
    with httpx.Client(transport=PolygateTransport(pg, "chat", inner=upstream([], {"a.test": bad, "b.test": good}))) as http:  # type: ignore[arg-type]
        resp = http.get("http://p/x")
    assert resp.json() == USAGE
    assert [(r.outcome, r.actual_tokens) for r in pg.results] == [(Outcome.SOURCE_DEAD, None), (Outcome.SUCCESS, 42)]


def test_a_stream_is_passed_through_unread() -> None:
    chunks = [b"data: {}\n\n", b"data: [DONE]\n\n"]
    stream = httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=httpx.ByteStream(b"".join(chunks)))
    pg = FakeClient(("a", "http://a.test"))
    with httpx.Client(transport=PolygateTransport(pg, "chat", inner=upstream([], {"a.test": stream}))) as http:  # type: ignore[arg-type]
        with http.stream("POST", "http://p/x", json={"stream": True}) as resp:
            assert b"".join(resp.iter_raw()) == b"".join(chunks)
    assert (pg.results[0].outcome, pg.results[0].actual_tokens) == (Outcome.SUCCESS, None)


def test_non_retryable_returns_the_last_response_with_the_verdict() -> None:
    pg = FakeClient(("a", "http://a.test"), ("b", "http://b.test"))
    answers = {"a.test": httpx.Response(503, json={"n": "a"}), "b.test": httpx.Response(400, json={"n": "b"})}

    def call(scope: str, fn: Any, **kw: Any) -> Any:
        for g in pg.grants():
            r = fn(g)
        raise polygate.NonRetryableError(scope=scope, call_id="c1", attempts=2, last_result=r)

    pg.call = call  # type: ignore[method-assign]
    with httpx.Client(transport=PolygateTransport(pg, "chat", inner=upstream([], answers))) as http:  # type: ignore[arg-type]
        resp = http.get("http://p/x")
    assert (resp.status_code, resp.json()) == (400, {"n": "b"})
    assert isinstance(resp.extensions["polygate_verdict"], polygate.NonRetryableError)


def test_other_verdicts_are_raised_with_the_last_response() -> None:
    pg = FakeClient(("a", "http://a.test"), ("b", "http://b.test"))
    answers = {"a.test": httpx.Response(503, json={"n": "a"}), "b.test": httpx.Response(502, json={"n": "b"})}
    with httpx.Client(transport=PolygateTransport(pg, "chat", inner=upstream([], answers))) as http:  # type: ignore[arg-type]
        with pytest.raises(polygate.RetryExhaustedError) as info:
            http.get("http://p/x")
    last = info.value.last_result
    assert last is not None and last.http_status == 502 and last.value.json() == {"n": "b"}


def test_verdict_without_a_response_is_raised() -> None:
    def refuse(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=req)

    pg = FakeClient(("a", "http://a.test"))
    with httpx.Client(transport=PolygateTransport(pg, "chat", inner=httpx.MockTransport(refuse))) as http:  # type: ignore[arg-type]
        with pytest.raises(polygate.RetryExhaustedError) as info:
            http.get("http://p/x")
    assert info.value.last_result is not None and "ConnectError" in info.value.last_result.detail


def test_provider_retry_warns_once() -> None:
    pg = FakeClient(("a", "http://a.test"))
    with httpx.Client(transport=PolygateTransport(pg, "chat", inner=upstream([], {"a.test": httpx.Response(200)}))) as http:  # type: ignore[arg-type]
        with warnings.catch_warnings():
            warnings.simplefilter("error", ProviderRetryWarning)
            http.get("http://p/x", headers={"x-stainless-retry-count": "0"})
        with pytest.warns(ProviderRetryWarning, match="max_retries=0"):
            http.get("http://p/x", headers={"x-stainless-retry-count": "1"})
        with warnings.catch_warnings():
            warnings.simplefilter("error", ProviderRetryWarning)
            http.get("http://p/x", headers={"x-stainless-retry-count": "2"})  # once per transport


async def test_async_transport_fails_over() -> None:
    seen: list[httpx.Request] = []

    async def handle(req: httpx.Request) -> httpx.Response:
        await req.aread()
        seen.append(req)
        return httpx.Response(503) if req.url.host == "a.test" else httpx.Response(200, json=USAGE)

    pg = AsyncFakeClient(("a", "http://a.test"), ("b", "http://b.test"))
    async with httpx.AsyncClient(transport=AsyncPolygateTransport(pg, "chat", inner=httpx.MockTransport(handle))) as http:  # type: ignore[arg-type]
        resp = await http.post("http://p/v1/chat/completions", json={"q": 1})
    assert resp.json() == USAGE
    assert [r.url.host for r in seen] == ["a.test", "b.test"]
    assert pg.results[-1].actual_tokens == 42


def test_polygate_exports_the_transports_lazily() -> None:
    assert polygate.PolygateTransport is PolygateTransport
    assert polygate.ProviderRetryWarning is ProviderRetryWarning
    with pytest.raises(AttributeError):
        polygate.NoSuchThing  # noqa: B018
