"""Client and AsyncClient: DESIGN's thin SDK loop over the generated stubs."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any

import grpc
import grpc.aio

from polygate._errors import VERDICTS, CallFailedError, DeadlineExceededError, PolygateError, sidecar_error
from polygate._gen.polygate.admission.v1 import admission_pb2 as pb
from polygate._gen.polygate.admission.v1 import admission_pb2_grpc as pb_grpc
from polygate._types import Grant, Outcome, Result, SourceReason

REPORT_TIMEOUT_S = 2.0
"""Bound of a CANCELLED report, and the least time a RecordOutcome gets."""

_MAX_DETAIL = 1024

_RPC_GRACE_S = 1.0
"""How much longer than the call's deadline an RPC may take: the sidecar ends
its waits at the deadline itself."""

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
}

_REFUSALS = {
    pb.REASON_COOLDOWN: "cooldown",
    pb.REASON_CIRCUIT_OPEN: "circuit_open",
    pb.REASON_PROBE_IN_FLIGHT: "probe_in_flight",
    pb.REASON_FORCED_OPEN: "forced_open",
    pb.REASON_ADAPTIVE_PACED: "adaptive_paced",
    pb.REASON_RATE_LIMITED: "rate_limited",
}


def _seconds(d: Any) -> float:
    return float(d.seconds) + float(d.nanos) / 1e9


def _truncate(s: str, n: int) -> str:
    return s.encode()[:n].decode(errors="ignore")


class _Call:
    """One call's bookkeeping, shared by both clients."""

    def __init__(self, scope: str, estimated_tokens: int, deadline: float | None) -> None:
        self.scope = scope
        self.call_id = ""
        self.attempts = 0
        self.last: Result | None = None
        self.tokens = estimated_tokens
        self.deadline = deadline
        self.end = None if deadline is None else time.monotonic() + deadline

    def open_request(self) -> pb.PickRequest:
        req = pb.PickRequest(scope=self.scope, estimated_tokens=self.tokens)
        if self.deadline is not None:
            if self.deadline <= 0:
                raise self.deadline_exceeded()
            req.deadline.FromNanoseconds(int(self.deadline * 1e9))
        return req

    def pick_request(self) -> pb.PickRequest:
        return pb.PickRequest(scope=self.scope, call_id=self.call_id)

    def timeout(self, report: bool = False) -> float | None:
        """The RPC timeout: what is left of the deadline plus a grace (the
        sidecar knows the deadline and answers by it, with a verdict, so the
        RPC's own deadline must not race it), and at least a report's bound
        for a RecordOutcome, which must settle the permit."""
        if self.end is None:
            return None
        left = self.end - time.monotonic()
        if report:
            return max(left, REPORT_TIMEOUT_S)
        if left <= 0:
            raise self.deadline_exceeded()
        return left + _RPC_GRACE_S

    def grant(self, g: pb.Grant) -> Grant:
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

    def record_request(self, g: Grant, r: Result) -> pb.RecordOutcomeRequest:
        if not isinstance(r, Result):
            raise TypeError(f"the attempt on source {g.source} returned {r!r}, not a polygate.Result")
        req = pb.RecordOutcomeRequest(
            scope=self.scope,
            call_id=self.call_id,
            permit_id=g.permit_id,
            outcome=_OUTCOMES[Outcome(r.outcome)],
            detail=_truncate(r.detail, _MAX_DETAIL),
        )
        if r.retry_after_s > 0:
            req.retry_after_hint.FromNanoseconds(int(r.retry_after_s * 1e9))
        if 100 <= r.http_status <= 599:
            req.http_status = r.http_status
        if r.actual_tokens is not None and r.actual_tokens >= 0:
            req.actual_tokens = r.actual_tokens
        return req

    def cancel_call_request(self) -> pb.CancelCallRequest:
        return pb.CancelCallRequest(scope=self.scope, call_id=self.call_id)

    def cancel_request(self, permit_id: str) -> pb.RecordOutcomeRequest:
        return pb.RecordOutcomeRequest(scope=self.scope, call_id=self.call_id, permit_id=permit_id, outcome=pb.OUTCOME_CANCELLED)

    def failure(self, f: pb.Failure, refused: Sequence[pb.SourceReason] = ()) -> CallFailedError:
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

    def deadline_exceeded(self) -> DeadlineExceededError:
        return DeadlineExceededError(scope=self.scope, call_id=self.call_id, attempts=self.attempts, last_result=self.last)

    def rpc_error(self, method: str, err: Any) -> PolygateError:
        if self.end is not None and (err.code() == grpc.StatusCode.DEADLINE_EXCEEDED or time.monotonic() >= self.end):
            return self.deadline_exceeded()
        return sidecar_error(method, err)


class Client:
    """A blocking client of the polygate sidecar at ``target`` (``host:port``
    or ``unix:///path``), or over a ``channel`` the caller owns. With
    ``token``, every RPC carries ``authorization: Bearer <token>``.
    Safe to share between threads."""

    def __init__(
        self,
        target: str = "",
        token: str | None = None,
        *,
        channel: grpc.Channel | None = None,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        if channel is None and not target:
            raise ValueError("Client needs a target or a channel")
        self._own = channel is None
        self._channel = channel if channel is not None else grpc.insecure_channel(target, options=options)
        self._stub = pb_grpc.AdmissionServiceStub(self._channel)
        self._metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()

    def close(self) -> None:
        """Closes the channel the client opened."""
        if self._own:
            self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(
        self,
        scope: str,
        fn: Callable[[Grant], Result],
        *,
        estimated_tokens: int = 0,
        deadline: float | None = None,
    ) -> Any:
        """Runs one call of ``scope``: asks the sidecar for a source, runs
        ``fn(grant)`` for the attempt, reports its Result and does what the
        sidecar answers (done, retry after a backoff, wait, or fail) until the
        call ends. Returns the ``value`` of the Result that succeeded; raises
        a CallFailedError subclass for a verdict, a SidecarError subclass for
        a gRPC error. ``deadline`` is the call's budget in seconds from now,
        capping every wait. An exception out of ``fn`` (KeyboardInterrupt
        included) reports CANCELLED, freeing the permit, and propagates."""
        call = _Call(scope, estimated_tokens, deadline)
        pick = self._rpc(call, "Pick", self._stub.Pick, call.open_request())
        call.call_id = pick.call_id
        while True:
            kind = pick.WhichOneof("result")
            if kind == "grant":
                grant = call.grant(pick.grant)
                try:
                    result = fn(grant)
                    call.last = result
                    req = call.record_request(grant, result)
                except BaseException:
                    self._cancel(call, grant.permit_id)
                    raise
                try:
                    rec = self._rpc(call, "RecordOutcome", self._stub.RecordOutcome, req, report=True)
                except BaseException:
                    self._cancel(call, grant.permit_id)  # idempotent per permit
                    raise
                nxt = rec.WhichOneof("next")
                if nxt == "done":
                    return result.value
                if nxt == "failure":
                    raise call.failure(rec.failure)
                with self._between_attempts(call):
                    time.sleep(_seconds(rec.retry.backoff))
            elif kind == "no_runnable":
                with self._between_attempts(call):
                    d = self._rpc(call, "OnNoRunnable", self._stub.OnNoRunnable, pb.OnNoRunnableRequest(scope=scope, call_id=call.call_id))
                if d.WhichOneof("decision") == "failure":
                    raise call.failure(d.failure, pick.no_runnable.per_source_reasons)
                with self._between_attempts(call):
                    time.sleep(_seconds(d.wait.sleep))
            elif kind == "failure":
                raise call.failure(pick.failure)
            else:
                raise PolygateError(f"Pick of call {call.call_id} answered no result")
            with self._between_attempts(call):
                pick = self._rpc(call, "Pick", self._stub.Pick, call.pick_request())

    @contextlib.contextmanager
    def _between_attempts(self, call: _Call) -> Iterator[None]:
        """When the call is given up without a verdict while no permit is held
        (KeyboardInterrupt, a signal's exception, a sidecar error), ends it in
        the sidecar (CancelCall) so that it stops counting as live there, and
        propagates."""
        try:
            yield
        except CallFailedError:
            raise
        except BaseException:
            try:
                self._stub.CancelCall(call.cancel_call_request(), timeout=REPORT_TIMEOUT_S, metadata=self._metadata)
            except grpc.RpcError:
                pass  # the sidecar forgets it after calls.idle_timeout
            raise

    def _rpc(self, call: _Call, method: str, stub: Any, req: Any, report: bool = False) -> Any:
        try:
            return stub(req, timeout=call.timeout(report), metadata=self._metadata)
        except grpc.RpcError as err:
            raise call.rpc_error(method, err) from None

    def _cancel(self, call: _Call, permit_id: str) -> None:
        try:
            self._stub.RecordOutcome(call.cancel_request(permit_id), timeout=REPORT_TIMEOUT_S, metadata=self._metadata)
        except grpc.RpcError:
            pass  # the permit's lease frees it


class AsyncClient:
    """An asyncio client of the polygate sidecar (grpc.aio); see Client."""

    def __init__(
        self,
        target: str = "",
        token: str | None = None,
        *,
        channel: grpc.aio.Channel | None = None,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        if channel is None and not target:
            raise ValueError("AsyncClient needs a target or a channel")
        self._own = channel is None
        self._channel = channel if channel is not None else grpc.aio.insecure_channel(target, options=options)
        self._stub = pb_grpc.AdmissionServiceStub(self._channel)
        self._metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),) if token else ()

    async def close(self) -> None:
        """Closes the channel the client opened."""
        if self._own:
            await self._channel.close(None)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def call(
        self,
        scope: str,
        fn: Callable[[Grant], Awaitable[Result] | Result],
        *,
        estimated_tokens: int = 0,
        deadline: float | None = None,
    ) -> Any:
        """Client.call for asyncio; ``fn`` may be a coroutine function. When
        the task is cancelled while an attempt holds a permit, CANCELLED is
        reported (so the permit's slot is free at once) and the cancellation
        propagates; cancelled while waiting or sleeping, it propagates at once."""
        call = _Call(scope, estimated_tokens, deadline)
        pick = await self._rpc(call, "Pick", self._stub.Pick, call.open_request())
        call.call_id = pick.call_id
        while True:
            kind = pick.WhichOneof("result")
            if kind == "grant":
                grant = call.grant(pick.grant)
                try:
                    out = fn(grant)
                    result = await out if inspect.isawaitable(out) else out
                    call.last = result
                    req = call.record_request(grant, result)
                    rec = await self._rpc(call, "RecordOutcome", self._stub.RecordOutcome, req, report=True)
                except BaseException:
                    await self._cancel(call, grant.permit_id)
                    raise
                nxt = rec.WhichOneof("next")
                if nxt == "done":
                    return result.value
                if nxt == "failure":
                    raise call.failure(rec.failure)
                async with self._between_attempts(call):
                    await asyncio.sleep(_seconds(rec.retry.backoff))
            elif kind == "no_runnable":
                async with self._between_attempts(call):
                    d = await self._rpc(call, "OnNoRunnable", self._stub.OnNoRunnable, pb.OnNoRunnableRequest(scope=scope, call_id=call.call_id))
                if d.WhichOneof("decision") == "failure":
                    raise call.failure(d.failure, pick.no_runnable.per_source_reasons)
                async with self._between_attempts(call):
                    await asyncio.sleep(_seconds(d.wait.sleep))
            elif kind == "failure":
                raise call.failure(pick.failure)
            else:
                raise PolygateError(f"Pick of call {call.call_id} answered no result")
            async with self._between_attempts(call):
                pick = await self._rpc(call, "Pick", self._stub.Pick, call.pick_request())

    @contextlib.asynccontextmanager
    async def _between_attempts(self, call: _Call) -> AsyncIterator[None]:
        """When the task is cancelled, or the call is given up without a
        verdict, while no permit is held, ends the call in the sidecar
        (CancelCall, on a task of its own) and propagates."""
        try:
            yield
        except CallFailedError:
            raise
        except BaseException:

            async def end() -> None:
                try:
                    await self._stub.CancelCall(call.cancel_call_request(), timeout=REPORT_TIMEOUT_S, metadata=self._metadata)
                except grpc.aio.AioRpcError:
                    pass  # the sidecar forgets it after calls.idle_timeout

            try:
                await asyncio.shield(asyncio.ensure_future(end()))
            except asyncio.CancelledError:
                pass
            raise

    async def _rpc(self, call: _Call, method: str, stub: Any, req: Any, report: bool = False) -> Any:
        try:
            return await stub(req, timeout=call.timeout(report), metadata=self._metadata)
        except grpc.aio.AioRpcError as err:
            raise call.rpc_error(method, err) from None

    async def _cancel(self, call: _Call, permit_id: str) -> None:
        """Reports CANCELLED on a task of its own, so that a second
        cancellation of the caller cannot cut the report short."""

        async def report() -> None:
            try:
                await self._stub.RecordOutcome(call.cancel_request(permit_id), timeout=REPORT_TIMEOUT_S, metadata=self._metadata)
            except grpc.aio.AioRpcError:
                pass  # the permit's lease frees it

        task = asyncio.ensure_future(report())
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            pass
