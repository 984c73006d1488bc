"""The real openai package governed by polygate's transports, against the
real sidecar and the fake upstream. The same tests run with openai 3 on
httpx2 (.venv) and with openai 2 on httpx (.venv-openai2): the application
keeps its own client, and sees its own client's errors with the provider's
words, or polygate's verdict as a status error, never a connection error
for a verdict."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from typing import Any

import openai
import pytest
from conftest import Sidecar, Upstream, assert_spacing

import polygate

if int(openai.__version__.split(".")[0]) >= 3:
    import httpx2 as hx

    from polygate.httpx2 import AsyncPolygateTransport, PolygateTransport
else:
    import httpx as hx  # type: ignore[no-redef]

    from polygate.httpx import AsyncPolygateTransport, PolygateTransport  # type: ignore[assignment]

MESSAGES: Any = [{"role": "user", "content": "Hello"}]
PLACEHOLDER = "http://polygate.invalid/v1"
"""The base URL the openai client is given: the transport replaces its origin with the source's base_url."""
DEAD_KEY = '{"error":{"message":"Incorrect API key provided: sk-dead. You can find your API key at https://platform.openai.com/account/api-keys.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}'
CHUNKS = ["Hel", "lo ", "there"]


def chunk(text: str) -> str:
    return json.dumps(
        {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    )


def two_sources(upstream: Upstream, max_attempts: int = 3, circuit_open: str = "wait", fail_threshold: int = 5) -> str:
    return f"""
scopes:
  chat:
    circuit_open: {circuit_open}
    max_attempts: {max_attempts}
    backoff: {{base: 5ms, max: 10ms}}
    breaker: {{fail_threshold: {fail_threshold}, min_calls: 100, fail_rate: 1.0, window: 60s, cooldown: 30s, max_cooldown: 30s}}
    sources:
      - {{name: a, priority: 0, timeout: 5s, tpm: 100000, attributes: {{base_url: "{upstream.base_url("a")}"}}}}
      - {{name: b, priority: 1, timeout: 5s, tpm: 100000, attributes: {{base_url: "{upstream.base_url("b")}"}}}}
"""


def llm(pg: polygate.Client, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=PLACEHOLDER, api_key="k", http_client=hx.Client(transport=PolygateTransport(pg, "chat", **kw)), max_retries=0)


def test_fails_over_inside_one_create(upstream: Upstream, start_sidecar: Callable[[str], Sidecar]) -> None:
    sc = start_sidecar(two_sources(upstream))
    upstream.set("a", {"status": 503})
    with polygate.Client(sc.addr) as pg, warnings.catch_warnings():
        warnings.simplefilter("error", polygate.ProviderRetryWarning)
        with llm(pg, estimated_tokens=500) as client:
            completion = client.chat.completions.with_raw_response.create(model="x", messages=MESSAGES)
    assert completion.parse().choices[0].message.content == "ok from b"
    assert completion.headers["polygate-call-id"] and "polygate-failure-reason" not in completion.headers
    assert (upstream.count("a"), upstream.count("b")) == (1, 1), "one attempt on each source, no retry by openai"
    assert sc.source("chat", "b").tokens_last_minute == 8, "usage.total_tokens settled the estimate of 500"


async def test_async_fails_over_inside_one_create(upstream: Upstream, start_sidecar: Callable[[str], Sidecar]) -> None:
    sc = start_sidecar(two_sources(upstream))
    upstream.set("a", {"status": 503})
    async with polygate.AsyncClient(sc.addr) as pg:
        transport = AsyncPolygateTransport(pg, "chat", estimated_tokens=lambda req: 500)
        async with openai.AsyncOpenAI(base_url=PLACEHOLDER, api_key="k", http_client=hx.AsyncClient(transport=transport), max_retries=0) as client:
            completion = await client.chat.completions.create(model="x", messages=MESSAGES)
    assert completion.choices[0].message.content == "ok from b"
    assert (upstream.count("a"), upstream.count("b")) == (1, 1)
    assert sc.source("chat", "b").tokens_last_minute == 8


def test_streams_after_failing_over(upstream: Upstream, start_sidecar: Callable[[str], Sidecar]) -> None:
    sc = start_sidecar(two_sources(upstream))
    upstream.set("a", {"status": 503})
    upstream.set("b", {"stream": [chunk(t) for t in CHUNKS]})
    with polygate.Client(sc.addr) as pg, llm(pg) as client:
        stream = client.chat.completions.create(model="x", messages=MESSAGES, stream=True)
        assert [c.choices[0].delta.content for c in stream] == CHUNKS
    assert (upstream.count("a"), upstream.count("b")) == (1, 1)


async def test_async_streams(upstream: Upstream, start_sidecar: Callable[[str], Sidecar]) -> None:
    sc = start_sidecar(two_sources(upstream))
    upstream.set("a", {"stream": [chunk(t) for t in CHUNKS]})
    async with polygate.AsyncClient(sc.addr) as pg:
        http = hx.AsyncClient(transport=AsyncPolygateTransport(pg, "chat"))
        async with openai.AsyncOpenAI(base_url=PLACEHOLDER, api_key="k", http_client=http, max_retries=0) as client:
            stream = await client.chat.completions.create(model="x", messages=MESSAGES, stream=True)
            assert [c.choices[0].delta.content async for c in stream] == CHUNKS


def test_a_429s_retry_after_is_waited_then_retried(upstream: Upstream, start_sidecar: Callable[[str], Sidecar]) -> None:
    sc = start_sidecar(f"""
scopes:
  chat:
    backoff: {{base: 5ms, max: 10ms, max_retry_after: 10s}}
    sources:
      - {{name: a, timeout: 5s, attributes: {{base_url: "{upstream.base_url("a")}"}}}}
""")
    upstream.set("a", {"status": 429, "headers": {"Retry-After": "1"}, "times": 1}, {"status": 200})
    with polygate.Client(sc.addr) as pg, llm(pg) as client:
        completion = client.chat.completions.create(model="x", messages=MESSAGES)
    assert completion.choices[0].message.content == "ok from a"
    assert_spacing("the retry after a 429 with Retry-After: 1", upstream.requests("a"), 1.0)


def test_a_dead_key_is_the_clients_authentication_error_with_the_providers_words(upstream: Upstream, start_sidecar: Callable[[str], Sidecar]) -> None:
    """Both keys are dead: the call ends on b's 401, which openai raises as
    AuthenticationError with the provider's message and polygate's verdict
    beside it; the next call, with every source OPEN because it is dead,
    makes no attempt and is a status error that says so."""
    sc = start_sidecar(two_sources(upstream, circuit_open="fail_fast"))
    upstream.set("a", {"status": 401, "body": DEAD_KEY})
    upstream.set("b", {"status": 401, "body": DEAD_KEY})
    with polygate.Client(sc.addr) as pg, llm(pg) as client:
        with pytest.raises(openai.AuthenticationError) as first:
            client.chat.completions.create(model="x", messages=MESSAGES)
        with pytest.raises(openai.APIStatusError) as second:
            client.chat.completions.create(model="x", messages=MESSAGES)
    e = first.value
    assert "Incorrect API key provided" in str(e) and e.code == "invalid_api_key"
    assert e.response.headers["polygate-failure-reason"] == "source_dead"
    verdict = polygate.failure_of(e)
    assert isinstance(verdict, polygate.SourceDeadError) and verdict.attempts == 2
    assert float(e.response.headers["polygate-retry-after"]) == pytest.approx(verdict.retry_after_s, abs=0.001)
    s = second.value
    assert s.status_code == 503 and not isinstance(s, openai.AuthenticationError)
    assert "source_dead" in str(s) and "retry after" in str(s) and s.code == "source_dead"
    assert (upstream.count("a"), upstream.count("b")) == (1, 1)


def test_a_400_is_the_clients_bad_request_error(upstream: Upstream, start_sidecar: Callable[[str], Sidecar]) -> None:
    sc = start_sidecar(two_sources(upstream))
    upstream.set("a", {"status": 400, "body": '{"error":{"message":"bad model","type":"invalid_request_error","code":null}}'})
    with polygate.Client(sc.addr) as pg, llm(pg) as client:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="x", messages=MESSAGES)
    assert "bad model" in str(info.value)
    assert isinstance(polygate.failure_of(info.value), polygate.NonRetryableError)
    assert info.value.response.headers["polygate-failure-reason"] == "non_retryable"
    assert (upstream.count("a"), upstream.count("b")) == (1, 0)


def test_retries_spent_is_the_last_upstream_answer(upstream: Upstream, start_sidecar: Callable[[str], Sidecar]) -> None:
    sc = start_sidecar(two_sources(upstream, max_attempts=2))
    upstream.set("a", {"status": 503})
    upstream.set("b", {"status": 502})
    with polygate.Client(sc.addr) as pg, llm(pg) as client:
        with pytest.raises(openai.InternalServerError) as info:
            client.chat.completions.create(model="x", messages=MESSAGES)
    assert info.value.status_code == 502 and "Bad Gateway" in str(info.value)
    assert info.value.response.headers["polygate-failure-reason"] == "retry_exhausted"
    assert upstream.count("a") + upstream.count("b") == 2, "two attempts, none by openai"


def every_source_open(upstream: Upstream, start_sidecar: Callable[[str], Sidecar]) -> Sidecar:
    """A fail_fast scope whose two breakers one call of 503s opened."""
    sc = start_sidecar(two_sources(upstream, circuit_open="fail_fast", fail_threshold=1))
    upstream.set("a", {"status": 503})
    upstream.set("b", {"status": 503})
    with polygate.Client(sc.addr) as pg, llm(pg) as client:
        with pytest.raises(openai.InternalServerError) as info:
            client.chat.completions.create(model="x", messages=MESSAGES)
    assert info.value.response.headers["polygate-failure-reason"] == "circuit_open", "the call ended on b's 503 as both opened"
    return sc


def test_every_source_open_is_a_status_error_naming_circuit_open_and_when(upstream: Upstream, start_sidecar: Callable[[str], Sidecar]) -> None:
    sc = every_source_open(upstream, start_sidecar)
    with polygate.Client(sc.addr) as pg, llm(pg) as client:
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(model="x", messages=MESSAGES)
    e = info.value
    assert not isinstance(e, openai.APIConnectionError)
    assert e.status_code == 503 and e.code == "circuit_open" and e.type == "polygate_error"
    assert "circuit_open" in e.message and "retry after" in e.message, e.message
    retry_after = float(e.response.headers["polygate-retry-after"])
    assert 0 < retry_after <= 30 and f"retry after {retry_after:.3f}s" in e.message
    assert e.response.headers["retry-after"] == str(int(-(-retry_after // 1)))
    assert isinstance(polygate.failure_of(e), polygate.CircuitOpenError)
    assert (upstream.count("a"), upstream.count("b")) == (1, 1), "no attempt while every source is open"


async def test_async_every_source_open_is_a_status_error(upstream: Upstream, start_sidecar: Callable[[str], Sidecar]) -> None:
    sc = every_source_open(upstream, start_sidecar)
    async with polygate.AsyncClient(sc.addr) as pg:
        http = hx.AsyncClient(transport=AsyncPolygateTransport(pg, "chat"))
        async with openai.AsyncOpenAI(base_url=PLACEHOLDER, api_key="k", http_client=http, max_retries=0) as client:
            with pytest.raises(openai.APIStatusError) as info:
                await client.chat.completions.create(model="x", messages=MESSAGES)
    assert info.value.status_code == 503 and "circuit_open" in info.value.message


def test_sidecar_down_fail_raises_the_unavailable_error(upstream: Upstream, start_sidecar: Callable[[str], Sidecar]) -> None:
    sc = start_sidecar(two_sources(upstream))
    sc.stop()
    with polygate.Client(sc.addr, on_sidecar_unavailable="fail") as pg:
        with hx.Client(transport=PolygateTransport(pg, "chat")) as http, pytest.raises(polygate.UnavailableError):
            http.post(PLACEHOLDER + "/chat/completions", json={})
        with llm(pg) as client, pytest.raises((polygate.UnavailableError, openai.APIConnectionError)) as info:
            client.chat.completions.create(model="x", messages=MESSAGES)
        # openai 3 lets the transport's own exceptions through; openai 2
        # wraps every one as a connection error, the sidecar's its cause.
        unavailable = info.value if isinstance(info.value, polygate.UnavailableError) else info.value.__cause__
        assert isinstance(unavailable, polygate.UnavailableError) and not unavailable.reason
        assert pg.ungoverned_attempts == 0
    assert upstream.count("a") + upstream.count("b") == 0


def test_sidecar_down_allow_completes_the_call_on_the_upstream(upstream: Upstream, start_sidecar: Callable[[str], Sidecar]) -> None:
    """allow: a call made while the sidecar is down goes to the source the
    last call began on (b, while a was failing), the upstream's status
    passed through; a client that never had a grant uses its Fallback."""
    sc = start_sidecar(two_sources(upstream))
    upstream.set("a", {"status": 503})
    with polygate.Client(sc.addr, on_sidecar_unavailable="allow") as pg, llm(pg) as client:
        client.chat.completions.create(model="x", messages=MESSAGES)  # governed: a fails, b answers
        sc.stop()
        upstream.set("a", {"status": 200})
        upstream.set("b", {"status": 200})
        completion = client.chat.completions.create(model="x", messages=MESSAGES)
        assert completion.choices[0].message.content == "ok from a", "the source the last call began on"
        upstream.set("a", {"status": 401, "body": DEAD_KEY})
        with pytest.raises(openai.AuthenticationError) as info:
            client.chat.completions.create(model="x", messages=MESSAGES)
        assert "Incorrect API key provided" in str(info.value) and polygate.failure_of(info.value) is None
        assert pg.ungoverned_attempts == 2
    fallback = {"chat": polygate.Fallback("b", {"base_url": upstream.base_url("b")})}
    with polygate.Client(sc.addr, on_sidecar_unavailable="allow", fallback=fallback) as pg, llm(pg) as client:
        assert client.chat.completions.create(model="x", messages=MESSAGES).choices[0].message.content == "ok from b"
        assert pg.ungoverned_attempts == 1
    assert (upstream.count("a"), upstream.count("b")) == (3, 2)


def test_environment_alone_configures_the_client(upstream: Upstream, start_sidecar: Callable[[str], Sidecar], monkeypatch: pytest.MonkeyPatch) -> None:
    sc = start_sidecar(
        two_sources(upstream) + "auth: {token: s3cret}\n",
    )
    monkeypatch.setenv("POLYGATE_ADDR", sc.addr)
    monkeypatch.setenv("POLYGATE_TOKEN", "s3cret")
    with polygate.Client() as pg, llm(pg) as client:
        assert client.chat.completions.create(model="x", messages=MESSAGES).choices[0].message.content == "ok from a"
    monkeypatch.setenv("POLYGATE_TOKEN", "wrong")
    with polygate.Client() as pg, hx.Client(transport=PolygateTransport(pg, "chat")) as http, pytest.raises(polygate.UnauthenticatedError):
        http.post(PLACEHOLDER + "/chat/completions", json={})


def test_provider_retries_warn_once(upstream: Upstream, start_sidecar: Callable[[str], Sidecar]) -> None:
    """openai with its retries on retries the verdict's 503: two retry
    layers, which the transport reports."""
    sc = start_sidecar(two_sources(upstream, max_attempts=1))
    upstream.set("a", {"status": 503})
    with polygate.Client(sc.addr) as pg:
        client = openai.OpenAI(base_url=PLACEHOLDER, api_key="k", http_client=hx.Client(transport=PolygateTransport(pg, "chat")), max_retries=2)
        with pytest.warns(polygate.ProviderRetryWarning, match="max_retries=0") as record, pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model="x", messages=MESSAGES)
        client.close()
    assert len([w for w in record if w.category is polygate.ProviderRetryWarning]) == 1
    assert upstream.count("a") + upstream.count("b") == 3, "one governed call per openai try: two retry layers"


def test_source_without_base_url_is_a_clear_error(upstream: Upstream, start_sidecar: Callable[[str], Sidecar]) -> None:
    sc = start_sidecar("""
scopes:
  chat:
    sources: [{name: bare}]
""")
    with polygate.Client(sc.addr) as pg, hx.Client(transport=PolygateTransport(pg, "chat")) as http:
        with pytest.raises(ValueError, match="source bare has no 'base_url' attribute"):
            http.get(PLACEHOLDER + "/models")
        assert sc.source("chat", "bare").in_flight == 0, "the permit was given back"
