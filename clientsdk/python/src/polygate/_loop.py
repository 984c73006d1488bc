"""The call loop as a sans-IO state machine, shared by Client and AsyncClient.

``CallLoop.run()`` is a generator: it yields the next thing to do (an RPC, an
attempt, a sleep) and is sent what it gave (the RPC's answer, the attempt's
Result, None after a sleep) or, for an RPC that failed, thrown the SDK's
exception for it. Every decision about the sidecar's answers lives here once,
what to do when it cannot be reached included; the clients only perform the
steps, sync or async, and, when a step or the loop raises, perform
``give_up``'s RPC (if any) before propagating: a call that ends without the
sidecar's verdict (the caller's cancellation, an exception of the attempt,
an RPC that failed, the call's deadline passing unanswered) is ended with
CancelCall, which settles a permit it holds as CANCELLED.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from polygate._errors import VERDICTS, CallFailedError, DeadlineExceededError, PolygateError, SidecarError, UnavailableError, sidecar_error
from polygate._gen.polygate.admission.v1 import admission_pb2 as pb
from polygate._tracing import CallTrace
from polygate._outcome import Outcome
from polygate._types import Grant, Result, SourceReason
from polygate._unavailable import SidecarWatch, is_unreachable

T = TypeVar("T")

REPORT_TIMEOUT_S = 2.0
"""Bound of a CancelCall, and the least time a RecordOutcome gets."""

RPC_GRACE_S = 1.0
"""How much longer than the call's deadline an RPC may take: the sidecar ends
its waits at the deadline itself."""

MAX_HINT_S = 86_400.0
_MAX_DETAIL = 1024
_MAX_INT64 = 2**63 - 1

_OUTCOMES = {
    Outcome.SUCCESS: pb.OUTCOME_SUCCESS,
    Outcome.TRANSIENT: pb.OUTCOME_TRANSIENT,
    Outcome.RATE_LIMITED: pb.OUTCOME_RATE_LIMITED,
    Outcome.SOURCE_DEAD: pb.OUTCOME_SOURCE_DEAD,
    Outcome.CLIENT_ERROR: pb.OUTCOME_CLIENT_ERROR,
    Outcome.CANCELLED: pb.OUTCOME_CANCELLED,
}

_FAILURES = {
    pb.FAILURE_REASON_CIRCUIT_OPEN: "circuit_open",
    pb.FAILURE_REASON_QUOTA_EXHAUSTED: "quota_exhausted",
    pb.FAILURE_REASON_STALLED: "stalled",
    pb.FAILURE_REASON_RETRY_EXHAUSTED: "retry_exhausted",
    pb.FAILURE_REASON_NON_RETRYABLE: "non_retryable",
    pb.FAILURE_REASON_DEADLINE_EXCEEDED: "deadline_exceeded",
    pb.FAILURE_REASON_CANCELLED: "cancelled",
    pb.FAILURE_REASON_RETRY_AFTER_TOO_LONG: "retry_after_too_long",
    pb.FAILURE_REASON_SOURCE_DEAD: "source_dead",
    pb.FAILURE_REASON_SCOPE_REMOVED: "scope_removed",
    pb.FAILURE_REASON_BUDGET_EXHAUSTED: "budget_exhausted",
}

_REFUSALS = {
    pb.REASON_COOLDOWN: "cooldown",
    pb.REASON_CIRCUIT_OPEN: "circuit_open",
    pb.REASON_PROBE_IN_FLIGHT: "probe_in_flight",
    pb.REASON_FORCED_OPEN: "forced_open",
    pb.REASON_ADAPTIVE_PACED: "adaptive_paced",
    pb.REASON_RATE_LIMITED: "rate_limited",
    pb.REASON_QUEUED: "queued",
    pb.REASON_TENANT_LIMIT: "tenant_limit",
    pb.REASON_TENANT_BUDGET: "tenant_budget",
}


@dataclass(frozen=True)
class Rpc:
    """Call ``method`` of the AdmissionService with ``request``; send back its answer."""

    method: str
    request: Any
    timeout: float | None


@dataclass(frozen=True)
class Attempt:
    """Run the application's attempt function; send back its Result."""

    grant: Grant


@dataclass(frozen=True)
class Sleep:
    """Sleep; send back None."""

    seconds: float


Step = Rpc | Attempt | Sleep


def _seconds(d: Any) -> float:
    return float(d.seconds) + float(d.nanos) / 1e9


def _truncate(s: str, n: int) -> str:
    return s.encode()[:n].decode(errors="ignore")


def _hint_ns(seconds: float) -> int:
    """An attempt's retry hint in nanoseconds: NaN and negatives are 0, the rest at most 24 h."""
    if math.isnan(seconds) or seconds <= 0:
        return 0
    return int(min(seconds, MAX_HINT_S) * 1e9)


class CallLoop(Generic[T]):
    """One call of ``scope``: its bookkeeping and the decisions about the
    sidecar's answers. ``clock`` is a monotonic clock in seconds; ``watch``
    the client's view of the sidecar's reachability (None: fail when it is
    unreachable, remember nothing)."""

    def __init__(
        self,
        scope: str,
        estimated_tokens: int = 0,
        deadline: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        priority: int = 0,
        tenant: str = "",
        tracer: Any = None,
        watch: SidecarWatch | None = None,
    ) -> None:
        self.scope = scope
        self.trace = CallTrace(tracer, scope)
        """The call's spans (no-ops without a tracer); the driver ends them."""
        self.call_id = ""
        self.attempts = 0
        self.last: Result[Any] | None = None
        self._tokens = estimated_tokens
        self._priority = max(-(2**31), min(priority, 2**31 - 1))
        self._tenant = tenant
        self._deadline = deadline
        self._clock = clock
        self._end = None if deadline is None else clock() + deadline
        self._watch = watch
        self._verdict = False
        """The sidecar ended the call with a Failure: nothing to tell it."""

    def run(self) -> Generator[Step, Any, T]:
        """The loop: Pick; a Grant runs the attempt and reports it (done,
        retry after a backoff, or fail); a NoRunnable asks OnNoRunnable (wait,
        or fail); then Pick again. Verdicts are raised as CallFailedError.
        Each attempt's span opens with the Pick that seeks its permit. When
        the sidecar cannot be reached and the client allows it, the call ends
        ungoverned (see _ungoverned)."""
        self.trace.start()
        self.trace.start_attempt(1)
        try:
            return (yield from self._governed())
        except UnavailableError as err:
            if self._watch is None or self._watch.mode != "allow" or not is_unreachable(err):
                raise
            return (yield from self._ungoverned(err))

    def _governed(self) -> Generator[Step, Any, T]:
        pick = yield from self._ask(self._rpc("Pick", self._open_request()))
        self.call_id = pick.call_id
        self.trace.call_id(self.call_id)
        while True:
            kind = pick.WhichOneof("result")
            if kind == "grant":
                grant = self._grant(pick.grant)
                self.trace.granted(grant)
                if self._watch is not None:
                    self._watch.began(self.scope, grant)
                result = yield Attempt(grant)
                req = self._record_request(grant, result)
                self.last = result
                rec = yield from self._ask(self._rpc("RecordOutcome", req, report=True))
                nxt = rec.WhichOneof("next")
                if nxt == "done":
                    self.trace.reported(result, "done")
                    value: T = result.value
                    return value
                if nxt == "failure":
                    self.trace.reported(result, "failure", _FAILURES.get(rec.failure.reason, ""))
                    raise self._failure(rec.failure)
                if nxt != "retry":
                    raise PolygateError(f"RecordOutcome of call {self.call_id} answered no next action")
                backoff = _seconds(rec.retry.backoff)
                self.trace.reported(result, "retry", backoff_s=backoff)
                yield Sleep(backoff)
                self.trace.start_attempt(self.attempts + 1)
            elif kind == "no_runnable":
                d = yield from self._ask(self._rpc("OnNoRunnable", pb.OnNoRunnableRequest(scope=self.scope, call_id=self.call_id)))
                decision = d.WhichOneof("decision")
                if decision == "failure":
                    raise self._failure(d.failure, pick.no_runnable.per_source_reasons)
                if decision != "wait":
                    raise PolygateError(f"OnNoRunnable of call {self.call_id} answered no decision")
                sleep = _seconds(d.wait.sleep)
                self.trace.waited(
                    sleep, [(r.source, _REFUSALS.get(r.reason, pb.Reason.Name(r.reason))) for r in pick.no_runnable.per_source_reasons]
                )
                yield Sleep(sleep)
            elif kind == "failure":
                raise self._failure(pick.failure)
            else:
                raise PolygateError(f"Pick of call {self.call_id} answered no result")
            pick = yield from self._ask(self._rpc("Pick", pb.PickRequest(scope=self.scope, call_id=self.call_id)))

    def _ask(self, rpc: Rpc) -> Generator[Step, Any, Any]:
        """Performs rpc; tells the watch whether the sidecar answered."""
        try:
            answer = yield rpc
        except SidecarError as err:
            if self._watch is not None and is_unreachable(err):
                self._watch.lost(err)
            raise
        if self._watch is not None:
            self._watch.answered()
        return answer

    def _ungoverned(self, err: UnavailableError) -> Generator[Step, Any, T]:
        """The call once the sidecar was found unreachable, under ``allow``:
        an attempt already made stands (its value returned if it succeeded,
        else err raised, for a transport to hand its response over); with no
        attempt made, one attempt runs directly on the scope's fallback
        source (the watch's), counted, and ends the call the same way. With
        no source to fall back on, err is raised."""
        if self.last is None:
            grant = self._watch.fallback(self.scope) if self._watch is not None else None
            if grant is None or self._watch is None:
                raise err
            self._watch.count()
            self.attempts += 1
            self.trace.granted(grant)
            result = yield Attempt(grant)
            if not isinstance(result, Result):
                raise TypeError(f"the attempt on source {grant.source} returned {result!r:.200}, not a polygate.Result")
            self.last = result
            self.trace.reported(result, "ungoverned")
        if self.last.outcome == Outcome.SUCCESS:
            value: T = self.last.value
            return value
        raise err

    def give_up(self) -> Rpc | None:
        """What to tell the sidecar when the call ends by an exception (out
        of a step or out of run): without the sidecar's
        verdict, CancelCall, which settles a permit the call holds as
        CANCELLED (free at once) and ends a call between attempts, so that
        it stops counting as live. The sidecar's verdict, or a call never
        opened, needs nothing; a deadline the SDK enforced itself (the
        sidecar left an RPC unanswered) is not the sidecar's verdict."""
        if self.call_id and not self._verdict:
            return Rpc("CancelCall", pb.CancelCallRequest(scope=self.scope, call_id=self.call_id), REPORT_TIMEOUT_S)
        return None

    def rpc_error(self, method: str, err: Any) -> PolygateError:
        """The SDK's exception for a grpc.RpcError of ``method``: past the
        call's deadline it is the deadline's verdict."""
        if self._end is not None and (err.code().name == "DEADLINE_EXCEEDED" or self._clock() >= self._end):
            return self._deadline_exceeded()
        return sidecar_error(method, err)

    def _rpc(self, method: str, req: Any, report: bool = False) -> Rpc:
        """The RPC with its timeout: what is left of the deadline plus a grace
        (the sidecar knows the deadline and answers by it, with a verdict, so
        the RPC's own deadline must not race it), and at least a report's
        bound for a RecordOutcome, which must settle the permit."""
        if self._end is None:
            return Rpc(method, req, None)
        left = self._end - self._clock()
        if report:
            return Rpc(method, req, max(left, REPORT_TIMEOUT_S))
        if left <= 0:
            raise self._deadline_exceeded()
        return Rpc(method, req, left + RPC_GRACE_S)

    def _open_request(self) -> pb.PickRequest:
        req = pb.PickRequest(
            scope=self.scope, estimated_tokens=min(self._tokens, _MAX_INT64), priority=self._priority, tenant=self._tenant
        )
        if self._deadline is not None:
            if not self._deadline > 0:  # NaN included
                raise self._deadline_exceeded()
            req.deadline.FromNanoseconds(int(min(self._deadline, 315_576_000_000) * 1e9))
        return req

    def _grant(self, g: pb.Grant) -> Grant:
        self.attempts += 1
        return Grant(
            call_id=self.call_id,
            source=g.source,
            attributes=dict(g.attributes),
            attempt=g.attempt,
            probe=g.probe,
            timeout_s=_seconds(g.timeout),
            permit_id=g.permit_id,
        )

    def _record_request(self, g: Grant, r: Any) -> pb.RecordOutcomeRequest:
        if not isinstance(r, Result):
            raise TypeError(f"the attempt on source {g.source} returned {r!r:.200}, not a polygate.Result")
        req = pb.RecordOutcomeRequest(
            scope=self.scope,
            call_id=self.call_id,
            permit_id=g.permit_id,
            outcome=_OUTCOMES[Outcome(r.outcome)],
            detail=_truncate(r.detail, _MAX_DETAIL),
        )
        hint = _hint_ns(r.retry_after_s)
        if hint > 0:
            req.retry_after_hint.FromNanoseconds(hint)
        if 100 <= r.http_status <= 599:
            req.http_status = r.http_status
        if r.actual_tokens is not None and r.actual_tokens >= 0:
            req.actual_tokens = min(r.actual_tokens, _MAX_INT64)
        return req

    def _failure(self, f: pb.Failure, refused: Sequence[pb.SourceReason] = ()) -> CallFailedError:
        self._verdict = True
        reasons = list(f.per_source_reasons) or list(refused)
        cls = VERDICTS.get(_FAILURES.get(f.reason, ""), CallFailedError)
        return cls(
            scope=self.scope,
            call_id=self.call_id,
            retry_after_s=_seconds(f.retry_after),
            per_source_reasons=[
                SourceReason(r.source, _REFUSALS.get(r.reason, pb.Reason.Name(r.reason)), _seconds(r.retry_after)) for r in reasons
            ],
            attempts=self.attempts,
            last_result=self.last,
        )

    def _deadline_exceeded(self) -> DeadlineExceededError:
        return DeadlineExceededError(scope=self.scope, call_id=self.call_id, attempts=self.attempts, last_result=self.last)
