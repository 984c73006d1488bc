"""The call loop's decisions, driven step by step with made-up answers and a
fake clock: no sidecar, no gRPC, no sleeping."""

from __future__ import annotations

import math
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest
from mypy import api as mypy_api

import polygate
from polygate._gen.polygate.admission.v1 import admission_pb2 as pb
from polygate._loop import REPORT_TIMEOUT_S, RPC_GRACE_S, Attempt, CallLoop, Rpc, Sleep, Step


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def grant(source: str = "a", permit: str = "p1", attempt: int = 1) -> pb.PickResponse:
    g = pb.Grant(source=source, permit_id=permit, attempt=attempt, attributes={"base_url": "http://a"})
    g.timeout.FromMilliseconds(5000)
    return pb.PickResponse(call_id="c1", grant=g)


def record(kind: str, **kw: Any) -> pb.RecordOutcomeResponse:
    if kind == "done":
        return pb.RecordOutcomeResponse(done=pb.Done())
    if kind == "retry":
        r = pb.Retry()
        r.backoff.FromMilliseconds(kw["backoff_ms"])
        return pb.RecordOutcomeResponse(retry=r)
    return pb.RecordOutcomeResponse(failure=pb.Failure(reason=kw["reason"]))


def ok(value: Any = "answer") -> polygate.Result[Any]:
    return polygate.Result(polygate.Outcome.SUCCESS, value=value)


def step(gen: Generator[Step, Any, Any], answer: Any) -> Step:
    return gen.send(answer)


def finish(gen: Generator[Step, Any, Any], answer: Any) -> Any:
    with pytest.raises(StopIteration) as stop:
        gen.send(answer)
    return stop.value.value


def test_grant_then_done_returns_the_value() -> None:
    loop: CallLoop[str] = CallLoop("chat", estimated_tokens=500)
    gen = loop.run()
    s = next(gen)
    assert isinstance(s, Rpc) and s.method == "Pick" and s.timeout is None
    assert (s.request.scope, s.request.estimated_tokens, s.request.call_id) == ("chat", 500, "")
    s = step(gen, grant())
    assert isinstance(s, Attempt) and (s.grant.source, s.grant.permit_id, s.grant.timeout_s) == ("a", "p1", 5.0)
    assert loop.attempts == 1
    s = step(gen, polygate.Result(polygate.Outcome.SUCCESS, http_status=200, actual_tokens=8, value="answer"))
    assert isinstance(s, Rpc) and s.method == "RecordOutcome"
    assert (s.request.permit_id, s.request.outcome, s.request.http_status, s.request.actual_tokens) == ("p1", pb.OUTCOME_SUCCESS, 200, 8)
    assert finish(gen, record("done")) == "answer"


def test_retry_sleeps_the_backoff_then_picks_again_with_the_call_id() -> None:
    loop: CallLoop[str] = CallLoop("chat")
    gen = loop.run()
    next(gen)
    step(gen, grant())
    step(gen, polygate.Result(polygate.Outcome.TRANSIENT, http_status=503))
    s = step(gen, record("retry", backoff_ms=250))
    assert s == Sleep(0.25)
    s = step(gen, None)
    assert isinstance(s, Rpc) and s.method == "Pick" and s.request.call_id == "c1"
    step(gen, grant("b", "p2", 2))
    step(gen, ok())
    assert finish(gen, record("done")) == "answer"
    assert loop.attempts == 2


def test_no_runnable_waits_what_the_sidecar_says() -> None:
    loop: CallLoop[str] = CallLoop("chat")
    gen = loop.run()
    next(gen)
    s = step(gen, pb.PickResponse(call_id="c1", no_runnable=pb.NoRunnable()))
    assert isinstance(s, Rpc) and s.method == "OnNoRunnable" and s.request.call_id == "c1"
    w = pb.Wait()
    w.sleep.FromMilliseconds(1500)
    assert step(gen, pb.OnNoRunnableResponse(wait=w)) == Sleep(1.5)
    s = step(gen, None)
    assert isinstance(s, Rpc) and s.method == "Pick"


def test_no_runnable_failure_keeps_the_picks_refusals() -> None:
    loop: CallLoop[str] = CallLoop("chat")
    gen = loop.run()
    next(gen)
    refusal = pb.SourceReason(source="a", reason=pb.REASON_CIRCUIT_OPEN)
    refusal.retry_after.FromSeconds(3)
    step(gen, pb.PickResponse(call_id="c1", no_runnable=pb.NoRunnable(per_source_reasons=[refusal])))
    f = pb.Failure(reason=pb.FAILURE_REASON_CIRCUIT_OPEN)
    f.retry_after.FromSeconds(3)
    with pytest.raises(polygate.CircuitOpenError) as info:
        step(gen, pb.OnNoRunnableResponse(failure=f))
    e = info.value
    assert (e.call_id, e.retry_after_s, e.per_source_reasons) == ("c1", 3.0, [polygate.SourceReason("a", "circuit_open", 3.0)])
    assert loop.give_up() is None, "a verdict needs no CancelCall"


@pytest.mark.parametrize(
    ("reason", "cls"),
    [
        (pb.FAILURE_REASON_RETRY_EXHAUSTED, polygate.RetryExhaustedError),
        (pb.FAILURE_REASON_NON_RETRYABLE, polygate.NonRetryableError),
        (pb.FAILURE_REASON_STALLED, polygate.StalledError),
    ],
)
def test_record_failure_is_the_verdict_with_the_last_result(reason: int, cls: type[polygate.CallFailedError]) -> None:
    loop: CallLoop[str] = CallLoop("chat")
    gen = loop.run()
    next(gen)
    step(gen, grant())
    last = polygate.Result(polygate.Outcome.TRANSIENT, http_status=503)
    step(gen, last)
    with pytest.raises(cls) as info:
        step(gen, record("failure", reason=reason))
    assert (info.value.attempts, info.value.last_result) == (1, last)
    assert loop.give_up() is None, "the permit was settled"


def test_give_up_ends_the_call_whether_it_holds_a_permit_or_not() -> None:
    """CancelCall, never a RecordOutcome of CANCELLED: the sidecar settles a
    permit the call holds as CANCELLED itself."""
    loop: CallLoop[str] = CallLoop("chat")
    assert loop.give_up() is None, "no call opened yet"
    gen = loop.run()
    next(gen)
    step(gen, grant())  # the attempt holds permit p1
    rpc = loop.give_up()
    assert rpc is not None and rpc.method == "CancelCall" and rpc.timeout == REPORT_TIMEOUT_S
    assert (rpc.request.scope, rpc.request.call_id) == ("chat", "c1")
    step(gen, polygate.Result(polygate.Outcome.RATE_LIMITED))
    step(gen, record("retry", backoff_ms=10))  # settled: now between attempts
    rpc = loop.give_up()
    assert rpc is not None and rpc.method == "CancelCall" and rpc.request.call_id == "c1"


def test_an_attempt_that_returns_no_result_is_a_type_error_that_ends_the_call() -> None:
    loop: CallLoop[str] = CallLoop("chat")
    gen = loop.run()
    next(gen)
    step(gen, grant())
    with pytest.raises(TypeError):
        step(gen, "not a Result")
    rpc = loop.give_up()
    assert rpc is not None and rpc.method == "CancelCall"


@pytest.mark.parametrize(
    "answer",
    [pb.RecordOutcomeResponse(), pb.OnNoRunnableResponse()],
    ids=["RecordOutcome without a next action", "OnNoRunnable without a decision"],
)
def test_an_answer_without_its_choice_is_an_error_that_ends_the_call(answer: Any) -> None:
    loop: CallLoop[str] = CallLoop("chat")
    gen = loop.run()
    next(gen)
    if isinstance(answer, pb.RecordOutcomeResponse):
        step(gen, grant())
        step(gen, ok())
    else:
        step(gen, pb.PickResponse(call_id="c1", no_runnable=pb.NoRunnable()))
    with pytest.raises(polygate.PolygateError, match="answered no"):
        step(gen, answer)
    rpc = loop.give_up()
    assert rpc is not None and rpc.method == "CancelCall"


def test_deadline_bounds_every_rpc_and_ends_the_call() -> None:
    clock = Clock()
    loop: CallLoop[str] = CallLoop("chat", deadline=10.0, clock=clock)
    gen = loop.run()
    s = next(gen)
    assert isinstance(s, Rpc) and s.timeout == 10.0 + RPC_GRACE_S
    assert s.request.deadline.ToMilliseconds() == 10_000
    step(gen, grant())
    clock.now += 9.5
    s = step(gen, ok())
    assert isinstance(s, Rpc) and s.timeout == REPORT_TIMEOUT_S, "a report always gets its bound"
    step(gen, record("retry", backoff_ms=1000))
    clock.now += 1.0
    with pytest.raises(polygate.DeadlineExceededError) as info:
        step(gen, None)
    assert info.value.attempts == 1
    rpc = loop.give_up()
    assert rpc is not None and rpc.method == "CancelCall", "the SDK's own deadline is no verdict of the sidecar: it is told"


@pytest.mark.parametrize("deadline", [0.0, -1.0, math.nan])
def test_no_time_left_fails_before_any_rpc(deadline: float) -> None:
    with pytest.raises(polygate.DeadlineExceededError):
        next(CallLoop("chat", deadline=deadline).run())


@pytest.mark.parametrize(
    ("hint", "want_ns"),
    [(1.5, 1_500_000_000), (0.0, 0), (-3.0, 0), (math.nan, 0), (math.inf, 86_400 * 10**9), (1e300, 86_400 * 10**9)],
)
def test_reported_hints_are_clamped(hint: float, want_ns: int) -> None:
    loop: CallLoop[str] = CallLoop("chat")
    gen = loop.run()
    next(gen)
    step(gen, grant())
    s = step(gen, polygate.Result(polygate.Outcome.RATE_LIMITED, retry_after_s=hint, actual_tokens=2**70))
    assert isinstance(s, Rpc)
    assert s.request.retry_after_hint.ToNanoseconds() == want_ns
    assert s.request.actual_tokens == 2**63 - 1


def test_call_is_typed_by_the_attempts_result(tmp_path: Path) -> None:
    """mypy --strict infers call's return type from the attempt's Result[T]."""
    src = tmp_path / "typed.py"
    src.write_text(
        """
from typing import assert_type
import httpx
import polygate

def attempt(g: polygate.Grant) -> polygate.Result[httpx.Response]:
    try:
        resp = httpx.get(g.attributes["base_url"])
    except httpx.TransportError as exc:
        return polygate.Result.from_exception(exc)
    return polygate.Result.from_response(resp)

def parsed(g: polygate.Grant) -> polygate.Result[dict[str, int]]:
    resp = httpx.get(g.attributes["base_url"])
    return polygate.Result.from_response(resp, value={"n": 1})

async def aparsed(g: polygate.Grant) -> polygate.Result[int]:
    return polygate.Result(polygate.Outcome.SUCCESS, value=1)

def main(c: polygate.Client) -> None:
    assert_type(c.call("chat", attempt), httpx.Response)
    assert_type(c.call("chat", parsed), dict[str, int])
    assert_type(c.call("chat", lambda g: polygate.Result(polygate.Outcome.SUCCESS, value="x")), str)

async def amain(c: polygate.AsyncClient) -> None:
    assert_type(await c.call("chat", aparsed), int)
    assert_type(await c.call("chat", attempt), httpx.Response)
"""
    )
    out, err, status = mypy_api.run(["--strict", "--no-incremental", "--cache-dir", str(tmp_path / "cache"), str(src)])
    assert status == 0, out + err


def test_priority_and_tenant_are_on_the_opening_pick() -> None:
    loop: CallLoop[str] = CallLoop("chat", priority=7, tenant="search")
    s = next(loop.run())
    assert isinstance(s, Rpc) and s.method == "Pick"
    assert (s.request.priority, s.request.tenant) == (7, "search")
