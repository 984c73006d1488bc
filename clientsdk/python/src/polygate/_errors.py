"""The SDK's exceptions: admission verdicts and sidecar (gRPC) errors, under
one base class."""

from __future__ import annotations

from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2

from polygate._types import Result, SourceReason


class PolygateError(Exception):
    """Base class of every exception the SDK raises."""


class CallFailedError(PolygateError):
    """The sidecar's verdict that ended a call.

    ``reason`` is the sidecar's failure reason (``circuit_open``, ``stalled``...);
    ``retry_after_s`` the time until the earliest certain moment a new call
    could do better (0 when there is none, e.g. the remaining cooldown);
    ``per_source_reasons`` each source's refusal when the call failed waiting
    for one; ``attempts`` and ``last_result`` what the call did.
    """

    reason = ""

    def __init__(
        self,
        *,
        scope: str,
        call_id: str,
        retry_after_s: float = 0.0,
        per_source_reasons: list[SourceReason] | None = None,
        attempts: int = 0,
        last_result: Result[Any] | None = None,
    ) -> None:
        self.scope = scope
        self.call_id = call_id
        self.retry_after_s = retry_after_s
        self.per_source_reasons = per_source_reasons or []
        self.attempts = attempts
        self.last_result = last_result
        super().__init__(self._message())

    def _message(self) -> str:
        msg = f"call {self.call_id} of scope {self.scope} failed: {self.reason}"
        if self.retry_after_s > 0:
            msg += f", retry after {self.retry_after_s:.3f}s"
        msg += f" ({self.attempts} attempts"
        if self.last_result is not None:
            msg += f", last {self.last_result.outcome.value}"
            if self.last_result.http_status:
                msg += f" {self.last_result.http_status}"
        msg += ")"
        if self.per_source_reasons:
            msg += ": " + "; ".join(
                f"{r.source} {r.reason}" + (f" {r.retry_after_s:.3f}s" if r.retry_after_s > 0 else "")
                for r in self.per_source_reasons
            )
        return msg


class AllSourcesExhaustedError(CallFailedError):
    """Every source refused the call: circuit_open, quota_exhausted or stalled."""


class CircuitOpenError(AllSourcesExhaustedError):
    """Every source's breaker refused the call and circuit_open is fail_fast."""

    reason = "circuit_open"


class SourceDeadError(AllSourcesExhaustedError):
    """Every source is OPEN because it is dead (auth or quota death) and source_dead is fail_fast."""

    reason = "source_dead"


class ScopeRemovedError(CallFailedError):
    """A reload removed the call's scope."""

    reason = "scope_removed"


class QuotaExhaustedError(AllSourcesExhaustedError):
    """A source's quota or pacer refused the call and quota_full is fail_fast."""

    reason = "quota_exhausted"


class StalledError(AllSourcesExhaustedError):
    """The call waited longer than the stall window while its scope made no progress."""

    reason = "stalled"


class BudgetExhaustedError(CallFailedError):
    """The call's tenant spent its token budget; ``retry_after_s`` is the time
    until the budget's window frees enough."""

    reason = "budget_exhausted"


class RetryExhaustedError(CallFailedError):
    """max_attempts real attempts failed (429s are not counted)."""

    reason = "retry_exhausted"


class NonRetryableError(CallFailedError):
    """The upstream refused the request itself (CLIENT_ERROR)."""

    reason = "non_retryable"


class DeadlineExceededError(CallFailedError):
    """The call's deadline passed, or the earliest certain retry is after it."""

    reason = "deadline_exceeded"


class CallCancelledError(CallFailedError):
    """The call reported CANCELLED."""

    reason = "cancelled"


VERDICTS: dict[str, type[CallFailedError]] = {
    cls.reason: cls
    for cls in (
        CircuitOpenError,
        SourceDeadError,
        ScopeRemovedError,
        QuotaExhaustedError,
        StalledError,
        BudgetExhaustedError,
        RetryExhaustedError,
        NonRetryableError,
        DeadlineExceededError,
        CallCancelledError,
    )
}


class SidecarError(PolygateError):
    """A gRPC error of the sidecar: misuse or infrastructure, never a verdict.

    ``code`` is the ``grpc.StatusCode``, ``details`` its message, ``reason``
    the google.rpc.ErrorInfo reason (an ErrorReason name such as
    ``ERROR_REASON_UNKNOWN_SCOPE``, "" if none), ``metadata`` its metadata
    (e.g. ``field`` for a bad field), ``method`` the RPC that failed.
    """

    def __init__(self, method: str, code: grpc.StatusCode, details: str, reason: str = "", metadata: dict[str, str] | None = None) -> None:
        self.method = method
        self.code = code
        self.details = details
        self.reason = reason
        self.metadata = metadata or {}
        super().__init__(f"{method}: {code.name}{' ' + reason if reason else ''}: {details}")


class InvalidArgumentError(SidecarError):
    """A request field is not allowed (metadata["field"] names it)."""


class NotFoundError(SidecarError):
    """Unknown scope, or unknown or expired call."""


class FailedPreconditionError(SidecarError):
    """A permit not of this call, a call that ended, Pick while holding a permit."""


class ResourceExhaustedError(SidecarError):
    """Too many live calls (``reason`` ERROR_REASON_TENANT_TOO_MANY_CALLS: of the
    tenant, named in ``metadata["tenant"]``)."""


class UnavailableError(SidecarError):
    """The sidecar, or its shared backend with a fail-closed scope, is unavailable."""


class UnauthenticatedError(SidecarError):
    """Missing or wrong bearer token."""


class InternalError(SidecarError):
    """The sidecar failed."""


STATUS_ERRORS: dict[grpc.StatusCode, type[SidecarError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.INTERNAL: InternalError,
}
"""The one table from gRPC status codes to the SDK's exceptions; other codes are SidecarError."""


def sidecar_error(method: str, err: Any) -> SidecarError:
    """The SDK's exception for a grpc.RpcError (sync or aio) of ``method``."""
    code = err.code()
    details = err.details() or ""
    reason, metadata = "", {}
    for key, value in err.trailing_metadata() or ():
        if key != "grpc-status-details-bin":
            continue
        st = status_pb2.Status.FromString(value)
        for any_ in st.details:
            if any_.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                any_.Unpack(info)
                reason, metadata = info.reason, dict(info.metadata)
    return STATUS_ERRORS.get(code, SidecarError)(method, code, details, reason, metadata)
