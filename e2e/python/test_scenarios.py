"""Failover, a 429 storm, deadlines, cancellation and sidecar errors, with the
Python SDK against the real sidecar binary."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx
import pytest
import requests
from conftest import TIMEOUT, Sidecar, Upstream, assert_spacing, eventually

import polygate
from polygate._gen.polygate.admission.v1 import admission_pb2 as pb


def sync_attempt(grants: list[polygate.Grant]) -> Callable[[polygate.Grant], polygate.Result]:
    def attempt(grant: polygate.Grant) -> polygate.Result:
        grants.append(grant)
        try:
            resp = requests.post(grant.attributes["base_url"] + "/chat/completions", json={"model": "x"}, timeout=grant.timeout_s)
        except requests.RequestException as exc:
            return polygate.Result.from_exception(exc)
        return polygate.Result.from_response(resp)

    return attempt


def async_attempt(grants: list[polygate.Grant], starts: list[float] | None = None):  # type: ignore[no-untyped-def]
    async def attempt(grant: polygate.Grant) -> polygate.Result:
        grants.append(grant)
        if starts is not None:
            starts.append(time.monotonic())
        async with httpx.AsyncClient(timeout=grant.timeout_s) as http:
            try:
                resp = await http.post(grant.attributes["base_url"] + "/chat/completions", json={"model": "x"})
            except httpx.TransportError as exc:
                return polygate.Result.from_exception(exc)
        return polygate.Result.from_response(resp)

    return attempt


def test_failover(upstream: Upstream, start_sidecar: Callable[[str], Sidecar]) -> None:
    """One source down: calls succeed on the other, the down source is probed
    (at most once per cooldown) and comes back."""
    sc = start_sidecar(f"""
scopes:
  failover:
    circuit_open: fail_fast
    max_attempts: 3
    backoff: {{base: 5ms, max: 10ms}}
    breaker: {{fail_threshold: 2, min_calls: 100, fail_rate: 1.0, window: 60s, cooldown: 1s, max_cooldown: 1s}}
    sources:
      - {{name: a, priority: 0, timeout: 5s, attributes: {{base_url: "{upstream.base_url("a")}"}}}}
      - {{name: b, priority: 1, timeout: 5s, attributes: {{base_url: "{upstream.base_url("b")}"}}}}
""")
    upstream.set("a", {"status": 503})
    with polygate.Client(sc.addr) as client:

        def served() -> tuple[str, bool]:
            grants: list[polygate.Grant] = []
            resp = client.call("failover", sync_attempt(grants))
            assert resp.status_code == 200
            return grants[-1].source, any(g.source == "a" and g.probe for g in grants)

        assert [served()[0] for _ in range(10)] == ["b"] * 10
        assert sc.source("failover", "a").state == pb.BREAKER_STATE_OPEN

        time.sleep(sc.retry_after("failover", "a"))  # a's certain retry moment
        assert served() == ("b", True), "a is probed, fails, and the call goes on to b"

        upstream.set("a", {"status": 200})
        time.sleep(sc.retry_after("failover", "a"))
        assert served() == ("a", True), "a's next probe succeeds"
        assert [served() for _ in range(3)] == [("a", False)] * 3
        assert sc.source("failover", "a").state == pb.BREAKER_STATE_CLOSED

    reqs = upstream.requests("a")
    assert len(reqs) == 7, "2 failures, 1 failed probe, 1 good probe, 3 calls"
    assert_spacing("a's probes while open", reqs[1:4], 1.0)
    assert upstream.count("b") == 11


async def test_rate_limit_storm_ends_stalled(upstream: Upstream, start_sidecar: Callable[[str], Sidecar]) -> None:
    """A 429 storm ends in stalled after the stall window, without burning
    max_attempts and never retrying before the upstream's hint (here OpenAI's
    x-ratelimit-reset-requests)."""
    sc = start_sidecar(f"""
scopes:
  storm:
    circuit_open: wait
    max_attempts: 2
    backoff: {{base: 10ms, max: 50ms}}
    backpressure: {{stall_window: 2500ms, poll_interval: 50ms}}
    sources:
      - {{name: primary, timeout: 5s, attributes: {{base_url: "{upstream.base_url("storm")}"}}}}
""")
    upstream.set("storm", {"status": 429, "headers": {"x-ratelimit-reset-requests": "1s", "x-ratelimit-remaining-requests": "0"}})
    grants: list[polygate.Grant] = []
    async with polygate.AsyncClient(sc.addr) as client:
        start = time.monotonic()
        with pytest.raises(polygate.StalledError) as info:
            await client.call("storm", async_attempt(grants))
        elapsed = time.monotonic() - start
    e = info.value
    assert e.attempts == len(grants) > 2, "429s are not charged to max_attempts (2)"
    assert elapsed >= 2.5, "never before the stall window"
    assert e.retry_after_s >= 1.0
    assert e.last_result is not None and e.last_result.outcome == polygate.Outcome.RATE_LIMITED
    reqs = upstream.requests("storm")
    assert len(reqs) == e.attempts
    assert_spacing("retries of a 429 storm", reqs, 1.0)
    src = sc.source("storm", "primary")
    assert src.state == pb.BREAKER_STATE_CLOSED and src.window_failures == 0


WAIT_SCOPES = """
scopes:
  open:
    circuit_open: wait
    source_dead: wait  # the 401 below only opens the breaker: what is tested is the wait's deadline
    max_attempts: 1
    breaker: {{cooldown: 60s, max_cooldown: 60s}}
    sources:
      - {{name: primary, timeout: 5s, attributes: {{base_url: "{url}/open"}}}}
  slot:
    quota_full: wait
    backpressure: {{stall_window: 60s, poll_interval: 10s}}
    sources:
      - {{name: primary, max_concurrency: 1, timeout: 60s, attributes: {{base_url: "{url}/slot"}}}}
"""


async def test_deadline_never_overslept(upstream: Upstream, start_sidecar: Callable[[str], Sidecar]) -> None:
    sc = start_sidecar(WAIT_SCOPES.format(url=upstream.url))
    async with polygate.AsyncClient(sc.addr) as client:
        # The earliest certain retry is past the deadline: fail now, not then
        # (far below the deadline: a tenth of it).
        upstream.set("open", {"status": 401})
        with pytest.raises(polygate.RetryExhaustedError):
            await client.call("open", async_attempt([]))
        start = time.monotonic()
        with pytest.raises(polygate.DeadlineExceededError) as info:
            await client.call("open", async_attempt([]), deadline=10.0)
        assert time.monotonic() - start < 1.0
        assert info.value.retry_after_s > 59

        # A wait with no certain end is cut at the deadline: the stall budget
        # is 60s, so an uncapped wait would show; a quarter of the deadline is
        # allowed for the round trips.
        upstream.set("slot", {"hang": True})
        holder = asyncio.create_task(client.call("slot", async_attempt([])))
        await asyncio.get_running_loop().run_in_executor(None, upstream.requests, "slot", 1)
        start = time.monotonic()
        with pytest.raises(polygate.DeadlineExceededError):
            await client.call("slot", async_attempt([]), deadline=4.0)
        elapsed = time.monotonic() - start
        assert 4.0 <= elapsed <= 5.0, f"failed after {elapsed:.3f}s; want at the 4s deadline"
        holder.cancel()
        with pytest.raises(asyncio.CancelledError):
            await holder


async def test_cancel_releases_permit(upstream: Upstream, start_sidecar: Callable[[str], Sidecar]) -> None:
    """Cancelling a task whose attempt hangs reports CANCELLED: the caller
    waiting for the only slot is admitted at once, not after the permit's
    lease (65s) or its next poll (5-10s)."""
    sc = start_sidecar(WAIT_SCOPES.format(url=upstream.url))
    upstream.set("slot", {"hang": True, "times": 1}, {"status": 200})
    loop = asyncio.get_running_loop()
    async with polygate.AsyncClient(sc.addr) as client:
        a = asyncio.create_task(client.call("slot", async_attempt([])))
        await loop.run_in_executor(None, upstream.requests, "slot", 1)
        b_starts: list[float] = []
        b = asyncio.create_task(client.call("slot", async_attempt([], b_starts)))
        await loop.run_in_executor(None, eventually, "B open and waiting", lambda: sc.live_calls("slot") == 2)
        cancelled = time.monotonic()
        a.cancel()
        with pytest.raises(asyncio.CancelledError):
            await a
        resp = await asyncio.wait_for(b, TIMEOUT)
    assert resp.status_code == 200 and len(b_starts) == 1
    assert b_starts[0] - cancelled < 5.0, f"B admitted {b_starts[0] - cancelled:.3f}s after A was cancelled"
    assert sc.source("slot", "primary").in_flight == 0


async def test_cancel_while_waiting_ends_the_call(upstream: Upstream, start_sidecar: Callable[[str], Sidecar]) -> None:
    """Cancelling a task that waits for a slot (it holds no permit) ends its
    call in the sidecar before the cancellation propagates (CancelCall): it
    stops counting as a live call at once, not after calls.idle_timeout."""
    # At debug level the sidecar logs "call waiting" for each call that starts waiting.
    sc = start_sidecar("log: {level: debug}\n" + WAIT_SCOPES.format(url=upstream.url))
    upstream.set("slot", {"hang": True})
    loop = asyncio.get_running_loop()
    async with polygate.AsyncClient(sc.addr) as client:
        holder = asyncio.create_task(client.call("slot", async_attempt([])))
        await loop.run_in_executor(None, upstream.requests, "slot", 1)
        waiter = asyncio.create_task(client.call("slot", async_attempt([])))
        await loop.run_in_executor(None, eventually, "the waiter waits in the sidecar", lambda: any("call waiting" in line for line in sc.logs))
        assert sc.live_calls("slot") == 2
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert sc.live_calls("slot") == 1, "the cancelled waiter's call is still live in the sidecar"
        holder.cancel()
        with pytest.raises(asyncio.CancelledError):
            await holder
        assert sc.live_calls("slot") == 0


def test_exception_in_attempt_releases_permit(upstream: Upstream, start_sidecar: Callable[[str], Sidecar]) -> None:
    sc = start_sidecar(WAIT_SCOPES.format(url=upstream.url))

    def broken(grant: polygate.Grant) -> polygate.Result:
        raise KeyError("bug in the application")

    with polygate.Client(sc.addr) as client:
        with pytest.raises(KeyError):
            client.call("slot", broken)
        assert sc.source("slot", "primary").in_flight == 0
        with pytest.raises(TypeError):
            client.call("slot", lambda g: "not a Result")  # type: ignore[arg-type,return-value]
        assert sc.source("slot", "primary").in_flight == 0
        assert client.call("slot", lambda g: polygate.Result(polygate.Outcome.SUCCESS, value="ok")) == "ok"


@pytest.mark.parametrize("use_async", [False, True])
async def test_sidecar_errors_keep_code_and_reason(upstream: Upstream, start_sidecar: Callable[[str], Sidecar], use_async: bool) -> None:
    sc = start_sidecar("""
auth: {token: s3cret}
scopes:
  chat:
    sources: [{name: only, tpm: 100}]
""")
    ok = lambda g: polygate.Result(polygate.Outcome.SUCCESS, value=g.source)  # noqa: E731

    async def call(token: str, scope: str, **kw: int) -> object:
        if use_async:
            async with polygate.AsyncClient(sc.addr, token=token) as ac:
                return await ac.call(scope, ok, **kw)
        with polygate.Client(sc.addr, token=token) as c:
            return c.call(scope, ok, **kw)

    cases = [
        ("s3cret", "nope", {}, polygate.NotFoundError, "ERROR_REASON_UNKNOWN_SCOPE", ""),
        ("wrong", "chat", {}, polygate.UnauthenticatedError, "ERROR_REASON_UNAUTHENTICATED", ""),
        ("s3cret", "chat", {"estimated_tokens": -1}, polygate.InvalidArgumentError, "ERROR_REASON_INVALID_FIELD", "estimated_tokens"),
        ("s3cret", "chat", {"estimated_tokens": 1000}, polygate.InvalidArgumentError, "ERROR_REASON_ESTIMATE_TOO_LARGE", "estimated_tokens"),
    ]
    for token, scope, kw, cls, reason, field in cases:
        with pytest.raises(cls) as info:
            await call(token, scope, **kw)
        e = info.value
        assert (e.method, e.reason, e.metadata.get("field", "")) == ("Pick", reason, field)
        assert e.code == {v: k for k, v in polygate.STATUS_ERRORS.items()}[cls]
    assert await call("s3cret", "chat") == "only"
