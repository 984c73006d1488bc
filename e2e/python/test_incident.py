"""The user's incident, time-compressed, with the Python SDK."""

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


def incident_config(policy: str, base_url: str, cooldown: str, max_cooldown: str) -> str:
    attempts = {"fail_fast": 3, "wait": 30}[policy]
    return f"""
scopes:
  incident:
    circuit_open: {policy}
    max_attempts: {attempts}
    backoff: {{base: 10ms, max: 20ms}}
    backpressure: {{stall_window: 30s, poll_interval: 20ms}}
    breaker: {{fail_threshold: 3, min_calls: 100, fail_rate: 1.0, window: 60s, cooldown: {cooldown}, max_cooldown: {max_cooldown}}}
    sources:
      - name: primary
        max_concurrency: 16
        timeout: 5s
        attributes: {{base_url: "{base_url}"}}
"""


class SyncAttempt:
    """An application's attempt with requests; records its grants and when it ended."""

    def __init__(self) -> None:
        self.grants: list[polygate.Grant] = []
        self.ends: list[float] = []

    def __call__(self, grant: polygate.Grant) -> polygate.Result:
        self.grants.append(grant)
        try:
            resp = requests.post(grant.attributes["base_url"] + "/chat/completions", json={"model": "x"}, timeout=grant.timeout_s)
        except requests.RequestException as exc:
            return polygate.Result.from_exception(exc)
        finally:
            self.ends.append(time.monotonic())
        return polygate.Result.from_response(resp)


def test_incident_fail_fast(upstream: Upstream, start_sidecar: Callable[[str], Sidecar]) -> None:
    cooldown = 10.0
    sc = start_sidecar(incident_config("fail_fast", upstream.base_url("primary"), "10s", "10s"))
    upstream.set("primary", {"status": 503})
    with polygate.Client(sc.addr) as client:
        trip = SyncAttempt()
        with pytest.raises(polygate.RetryExhaustedError):
            client.call("incident", trip)
        tripped = time.monotonic()
        assert len(trip.ends) == 3
        opened_after, opened_before = trip.ends[2], tripped
        assert sc.source("incident", "primary").state == pb.BREAKER_STATE_OPEN

        last = None
        for i in range(5):
            start = time.monotonic()
            with pytest.raises(polygate.CircuitOpenError) as info:
                client.call("incident", SyncAttempt())
            elapsed = time.monotonic() - start
            e = info.value
            assert isinstance(e, polygate.AllSourcesExhaustedError) and e.reason == "circuit_open"
            # "Fails within milliseconds": far below the cooldown (a tenth of it).
            assert elapsed < cooldown / 10, f"call {i + 1} while open took {elapsed:.3f}s"
            # The remaining cooldown; the breaker counts whole milliseconds.
            low = opened_after + cooldown - (start + elapsed) - 0.001
            high = opened_before + cooldown - start + 0.001
            assert low <= e.retry_after_s <= high, f"retry_after {e.retry_after_s} not in [{low}, {high}]"
            assert [r.source for r in e.per_source_reasons] == ["primary"] and e.per_source_reasons[0].retry_after_s > 0
            assert e.attempts == 0
            last = e
        assert upstream.count("primary") == 3

        upstream.set("primary", {"status": 200})
        assert last is not None
        time.sleep(last.retry_after_s)  # the certain retry moment: never early
        probe = SyncAttempt()
        resp = client.call("incident", probe)
        assert resp.status_code == 200 and [g.probe for g in probe.grants] == [True]
        after = SyncAttempt()
        client.call("incident", after)
        assert [g.probe for g in after.grants] == [False]
        assert sc.source("incident", "primary").state == pb.BREAKER_STATE_CLOSED


async def test_incident_wait(upstream: Upstream, start_sidecar: Callable[[str], Sidecar]) -> None:
    cooldown = 0.3
    sc = start_sidecar(incident_config("wait", upstream.base_url("primary"), "300ms", "600ms"))
    upstream.set("primary", {"status": 503})
    loop = asyncio.get_running_loop()

    async def attempt(grant: polygate.Grant) -> polygate.Result:
        async with httpx.AsyncClient(timeout=grant.timeout_s) as http:
            try:
                resp = await http.post(grant.attributes["base_url"] + "/chat/completions", json={"model": "x"})
            except httpx.TransportError as exc:
                return polygate.Result.from_exception(exc)
        return polygate.Result.from_response(resp)

    async with polygate.AsyncClient(sc.addr) as client:
        calls: list[asyncio.Task[object]] = []

        def call() -> None:
            calls.append(asyncio.create_task(client.call("incident", attempt)))

        async def wait_count(n: int) -> None:
            await loop.run_in_executor(None, upstream.requests, "primary", n)

        call()  # its first three attempts open the breaker; then it waits
        await loop.run_in_executor(None, eventually, "breaker OPEN", lambda: sc.source("incident", "primary").state == pb.BREAKER_STATE_OPEN)
        tripped = upstream.count("primary")
        assert tripped == 3
        call()
        call()
        await wait_count(tripped + 1)  # the first probe failed
        call()
        call()
        await wait_count(tripped + 2)  # the second probe failed
        call()
        upstream.set("primary", {"status": 200})  # the provider recovers
        failed_probes = upstream.count("primary") - tripped
        results = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), TIMEOUT)

    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, f"calls of the outage failed: {errors}"
    assert all(isinstance(r, httpx.Response) and r.status_code == 200 for r in results)
    reqs = upstream.requests("primary")
    closing = next(i for i, r in enumerate(reqs) if r["status"] == 200)
    assert closing == tripped + failed_probes
    assert_spacing("probes while open", reqs[tripped - 1 : closing + 1], cooldown)
    assert len(reqs) - closing == len(results), "after the closing probe, one request per call"
