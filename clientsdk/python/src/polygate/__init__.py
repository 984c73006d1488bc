"""polygate: the thin Python client of the polygate governance sidecar.

The application keeps its own HTTP transport; ``Client.call`` (or
``AsyncClient.call``) runs the sidecar's admission loop around one attempt
function, and every retry, backoff, failover and waiting decision stays in
the sidecar. Verdicts are raised as CallFailedError subclasses, gRPC errors
as SidecarError subclasses, both under PolygateError. ``PolygateTransport``
(``polygate.httpx``, needs httpx; ``polygate.httpx2``, needs httpx2) governs
every request of an HTTP client instead, answering with the upstream's own
response or one that stands for the verdict (``failure_of`` reads it back).
"""

from typing import TYPE_CHECKING, Any

from polygate._classify import MAX_HINT_S, classify, classify_exception, classify_response, retry_hint, total_tokens
from polygate._client import TLS, AsyncClient, Client
from polygate._errors import (
    STATUS_ERRORS,
    AllSourcesExhaustedError,
    BudgetExhaustedError,
    CallCancelledError,
    CallFailedError,
    CircuitOpenError,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NonRetryableError,
    NotFoundError,
    PolygateError,
    QuotaExhaustedError,
    ResourceExhaustedError,
    RetryExhaustedError,
    ScopeRemovedError,
    SidecarError,
    SourceDeadError,
    StalledError,
    UnauthenticatedError,
    UnavailableError,
)
from polygate._outcome import Outcome
from polygate._transport import ProviderRetryWarning, failure_of
from polygate._types import Grant, Result, SourceReason
from polygate._unavailable import Fallback
from polygate._version import __version__

if TYPE_CHECKING:
    from polygate.httpx import AsyncPolygateTransport, PolygateTransport

_TRANSPORT = ("AsyncPolygateTransport", "PolygateTransport")


def __getattr__(name: str) -> Any:
    """The httpx transports, imported when first used: httpx is optional."""
    if name in _TRANSPORT:
        import polygate.httpx

        return getattr(polygate.httpx, name)
    raise AttributeError(f"module 'polygate' has no attribute {name!r}")


__all__ = [
    "AsyncPolygateTransport",
    "PolygateTransport",
    "ProviderRetryWarning",
    "TLS",
    "__version__",
    "STATUS_ERRORS",
    "AllSourcesExhaustedError",
    "AsyncClient",
    "BudgetExhaustedError",
    "CallCancelledError",
    "CallFailedError",
    "CircuitOpenError",
    "Client",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "Fallback",
    "Grant",
    "InternalError",
    "InvalidArgumentError",
    "NonRetryableError",
    "NotFoundError",
    "Outcome",
    "PolygateError",
    "QuotaExhaustedError",
    "ResourceExhaustedError",
    "Result",
    "RetryExhaustedError",
    "ScopeRemovedError",
    "SourceDeadError",
    "SidecarError",
    "SourceReason",
    "StalledError",
    "UnauthenticatedError",
    "UnavailableError",
    "classify",
    "classify_exception",
    "classify_response",
    "failure_of",
    "MAX_HINT_S",
    "retry_hint",
    "total_tokens",
]
