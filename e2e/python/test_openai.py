"""The httpx transports under the real openai package, against the real
sidecar and the fake upstream: one chat.completions.create is one governed
call, failing over between sources inside it, with openai's own retries off."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import httpx
import openai
import pytest
from conftest import Sidecar, Upstream

import polygate
from polygate.transport import AsyncPolygateTransport, PolygateTransport, ProviderRetryWarning

MESSAGES = [{"role": "user", "content": "Hello"}]
PLACEHOLDER = "http://polygate.invalid/v1"
"""The base URL the openai client is given: the transport replaces its origin with the source's base_url."""


def two_sources(upstream: Upstream, max_attempts: int = 3, circuit_open: str = "wait") -> str:
    return f"""
scopes:
  chat:
    circuit_open: {circuit_open}
    max_attempts: {max_attempts}
    backoff: {{base: 5ms, max: 10ms}}
    breaker: {{fail_threshold: 5, min_calls: 100, fail_rate: 1.0, window: 60s, cooldown: 30s, max_cooldown: 30s}}
    sources:
      - {{name: a, priority: 0, timeout: 5s, tpm: 100000, attributes: {{base_url: "{upstream.base_url("a")}"}}}}
      - {{name: b, priority: 1, timeout: 5s, tpm: 100000, attributes: {{base_url: "{upstream.base_url("b")}"}}}}
"""


def test_openai_fails_over_inside_one_create(upstream: Upstream, start_sidecar: Callable[[str], Sidecar]) -> None:
    sc = start_sidecar(two_sources(upstream))
    upstream.set("a", {"status": 503})
    with polygate.Client(sc.addr) as pg, warnings.catch_warnings():
        warnings.simplefilter("error", ProviderRetryWarning)
        transport = PolygateTransport(pg, "chat", estimated_tokens=500)
        with openai.OpenAI(base_url=PLACEHOLDER, api_key="k", http_client=httpx.Client(transport=transport), max_retries=0) as llm:
            completion = llm.chat.completions.create(model="x", messages=MESSAGES)  # type: ignore[arg-type]
    assert completion.choices[0].message.content == "ok from b"
    assert completion.usage is not None and completion.usage.total_tokens == 8, "the caller still reads the body the transport read"
    assert (upstream.count("a"), upstream.count("b")) == (1, 1), "one attempt on each source, no retry by openai"
    assert sc.source("chat", "b").tokens_last_minute == 8, "usage.total_tokens settled the estimate of 500"
    assert sc.source("chat", "a").window_failures == 1


async def test_async_openai_fails_over_inside_one_create(upstream: Upstream, start_sidecar: Callable[[str], Sidecar]) -> None:
    sc = start_sidecar(two_sources(upstream))
    upstream.set("a", {"status": 503})
    async with polygate.AsyncClient(sc.addr) as pg:
        transport = AsyncPolygateTransport(pg, "chat", estimated_tokens=lambda req: 500)
        async with openai.AsyncOpenAI(base_url=PLACEHOLDER, api_key="k", http_client=httpx.AsyncClient(transport=transport), max_retries=0) as llm:
            completion = await llm.chat.completions.create(model="x", messages=MESSAGES)  # type: ignore[arg-type]
    assert completion.choices[0].message.content == "ok from b"
    assert (upstream.count("a"), upstream.count("b")) == (1, 1)
    assert sc.source("chat", "b").tokens_last_minute == 8


def test_retry_exhausted_is_raised(upstream: Upstream, start_sidecar: Callable[[str], Sidecar]) -> None:
    """Both sources fail: the sidecar's max_attempts ends the call with its
    verdict, which openai (retries off) surfaces as the cause of its error."""
    sc = start_sidecar(two_sources(upstream, max_attempts=2))
    upstream.set("a", {"status": 503})
    upstream.set("b", {"status": 502})
    with polygate.Client(sc.addr) as pg:
        with httpx.Client(transport=PolygateTransport(pg, "chat")) as http:
            with pytest.raises(polygate.RetryExhaustedError) as info:
                http.post(PLACEHOLDER + "/chat/completions", json={"model": "x"})
        last = info.value.last_result
        assert info.value.attempts == 2 and last is not None and last.http_status == 502
        assert last.value.json()["error"]["message"] == "Bad Gateway", "the last response, read, is in the verdict"

        with openai.OpenAI(base_url=PLACEHOLDER, api_key="k", http_client=httpx.Client(transport=PolygateTransport(pg, "chat")), max_retries=0) as llm:
            with pytest.raises(openai.APIConnectionError) as oinfo:
                llm.chat.completions.create(model="x", messages=MESSAGES)  # type: ignore[arg-type]
        assert isinstance(oinfo.value.__cause__, polygate.RetryExhaustedError)
    assert upstream.count("a") + upstream.count("b") == 4, "two attempts per call, none by openai"


def test_non_retryable_returns_the_upstreams_answer(upstream: Upstream, start_sidecar: Callable[[str], Sidecar]) -> None:
    sc = start_sidecar(two_sources(upstream))
    upstream.set("a", {"status": 400, "body": '{"error":{"message":"bad model","type":"invalid_request_error","code":null}}'})
    with polygate.Client(sc.addr) as pg:
        with openai.OpenAI(base_url=PLACEHOLDER, api_key="k", http_client=httpx.Client(transport=PolygateTransport(pg, "chat")), max_retries=0) as llm:
            with pytest.raises(openai.BadRequestError) as info:
                llm.chat.completions.create(model="x", messages=MESSAGES)  # type: ignore[arg-type]
        assert "bad model" in str(info.value)
        assert isinstance(info.value.response.extensions["polygate_verdict"], polygate.NonRetryableError)
    assert (upstream.count("a"), upstream.count("b")) == (1, 0)


def test_open_breakers_are_raised(upstream: Upstream, start_sidecar: Callable[[str], Sidecar]) -> None:
    """Two 401s force both breakers open because the sources are dead: that
    call, and the next one (which makes no attempt), fail with source_dead
    (source_dead: fail_fast, the default) and the cooldown left."""
    sc = start_sidecar(two_sources(upstream, circuit_open="fail_fast"))
    upstream.set("a", {"status": 401})
    upstream.set("b", {"status": 401})
    with polygate.Client(sc.addr) as pg, httpx.Client(transport=PolygateTransport(pg, "chat")) as http:
        with pytest.raises(polygate.SourceDeadError) as first:
            http.post(PLACEHOLDER + "/chat/completions", json={})
        with pytest.raises(polygate.SourceDeadError) as second:
            http.post(PLACEHOLDER + "/chat/completions", json={})
    last = first.value.last_result
    assert first.value.attempts == 2 and last is not None and last.http_status == 401
    e = second.value
    assert (e.attempts, e.last_result) == (0, None)
    assert e.retry_after_s > 0 and {r.source for r in e.per_source_reasons} == {"a", "b"}
    assert (upstream.count("a"), upstream.count("b")) == (1, 1)


def test_provider_retries_warn_once(upstream: Upstream, start_sidecar: Callable[[str], Sidecar]) -> None:
    """openai with its retries on retries the sidecar's verdict: two retry
    layers, which the transport reports."""
    sc = start_sidecar(two_sources(upstream, max_attempts=1))
    upstream.set("a", {"status": 503})
    upstream.set("b", {"status": 503})
    with polygate.Client(sc.addr) as pg:
        llm = openai.OpenAI(base_url=PLACEHOLDER, api_key="k", http_client=httpx.Client(transport=PolygateTransport(pg, "chat")), max_retries=2)
        with pytest.warns(ProviderRetryWarning, match="max_retries=0") as record, pytest.raises(openai.APIConnectionError):
            llm.chat.completions.create(model="x", messages=MESSAGES)  # type: ignore[arg-type]
        llm.close()
    assert len([w for w in record if w.category is ProviderRetryWarning]) == 1
    assert upstream.count("a") + upstream.count("b") == 3, "one governed call per openai try: two retry layers"


def test_source_without_base_url_is_a_clear_error(upstream: Upstream, start_sidecar: Callable[[str], Sidecar]) -> None:
    sc = start_sidecar("""
scopes:
  chat:
    sources: [{name: bare}]
""")
    with polygate.Client(sc.addr) as pg, httpx.Client(transport=PolygateTransport(pg, "chat")) as http:
        with pytest.raises(ValueError, match="source bare has no 'base_url' attribute"):
            http.get(PLACEHOLDER + "/models")
        assert sc.source("chat", "bare").in_flight == 0, "the permit was given back"
