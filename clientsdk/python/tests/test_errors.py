"""The one table from grpc.StatusCode to the SDK's exceptions."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

import polygate
from polygate._errors import sidecar_error


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str, info: error_details_pb2.ErrorInfo | None) -> None:
        self._code, self._details, self._md = code, details, ()
        if info is not None:
            detail = any_pb2.Any()
            detail.Pack(info)
            st = status_pb2.Status(code=code.value[0], message=details, details=[detail])
            self._md = (("grpc-status-details-bin", st.SerializeToString()),)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[tuple[str, bytes], ...]:
        return self._md


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (grpc.StatusCode.INVALID_ARGUMENT, polygate.InvalidArgumentError),
        (grpc.StatusCode.NOT_FOUND, polygate.NotFoundError),
        (grpc.StatusCode.FAILED_PRECONDITION, polygate.FailedPreconditionError),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, polygate.ResourceExhaustedError),
        (grpc.StatusCode.UNAVAILABLE, polygate.UnavailableError),
        (grpc.StatusCode.UNAUTHENTICATED, polygate.UnauthenticatedError),
        (grpc.StatusCode.INTERNAL, polygate.InternalError),
        (grpc.StatusCode.UNIMPLEMENTED, polygate.SidecarError),
    ],
)
def test_status_table_keeps_code_details_and_reason(code: grpc.StatusCode, cls: type[polygate.SidecarError]) -> None:
    info = error_details_pb2.ErrorInfo(reason="ERROR_REASON_INVALID_FIELD", domain="polygate.dev", metadata={"field": "scope"})
    err = sidecar_error("Pick", FakeRpcError(code, "scope: is empty", info))
    assert type(err) is cls
    assert isinstance(err, polygate.PolygateError)
    assert (err.method, err.code, err.details, err.reason, err.metadata) == ("Pick", code, "scope: is empty", "ERROR_REASON_INVALID_FIELD", {"field": "scope"})


def test_status_without_details() -> None:
    err = sidecar_error("Pick", FakeRpcError(grpc.StatusCode.UNAVAILABLE, "connection refused", None))
    assert isinstance(err, polygate.UnavailableError) and err.reason == "" and err.metadata == {}


def test_verdict_hierarchy() -> None:
    for cls in (polygate.CircuitOpenError, polygate.QuotaExhaustedError, polygate.StalledError):
        assert issubclass(cls, polygate.AllSourcesExhaustedError)
    for cls in (polygate.RetryExhaustedError, polygate.NonRetryableError, polygate.DeadlineExceededError):
        assert issubclass(cls, polygate.CallFailedError) and not issubclass(cls, polygate.AllSourcesExhaustedError)
    assert issubclass(polygate.CallFailedError, polygate.PolygateError)
    assert issubclass(polygate.SidecarError, polygate.PolygateError)
    e = polygate.CircuitOpenError(
        scope="chat",
        call_id="c-1",
        retry_after_s=1.5,
        per_source_reasons=[polygate.SourceReason("primary", "circuit_open", 1.5)],
    )
    assert (e.reason, e.retry_after_s, e.per_source_reasons[0].source) == ("circuit_open", 1.5, "primary")
    assert "circuit_open" in str(e) and "primary" in str(e)
