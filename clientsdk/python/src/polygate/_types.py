"""The values an application sees: grants, results, refusals."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, overload

from polygate._classify import classify_exception, classify_response
from polygate._outcome import Outcome

T_co = TypeVar("T_co", covariant=True)
R = TypeVar("R")
V = TypeVar("V")


class _Unset(enum.Enum):
    UNSET = enum.auto()


@dataclass(frozen=True)
class Grant:
    """The sidecar's permit to make one attempt on one source now."""

    call_id: str
    source: str
    """The granted source's name."""
    attributes: dict[str, str]
    """The source's configured attributes (base_url, model...); never secrets."""
    attempt: int
    """The attempt's number in the call, from 1."""
    probe: bool
    """The attempt is the HALF_OPEN probe of the source's breaker."""
    timeout_s: float
    """The source's configured timeout for one attempt: pass it to the HTTP client."""
    permit_id: str


@dataclass(frozen=True)
class Result(Generic[T_co]):
    """What an attempt reports. ``value`` is what ``call`` returns when the
    attempt succeeded (e.g. the HTTP response, or its parsed body):
    ``call(scope, fn)`` with ``fn`` returning ``Result[T]`` returns ``T``."""

    outcome: Outcome
    retry_after_s: float = 0.0
    """The upstream's retry hint (Retry-After and friends): a floor of the
    sidecar's backoff. Negative, NaN or infinite values are sent as 0; values
    over 24 h as 24 h."""
    http_status: int = 0
    detail: str = ""
    """A short note for the sidecar's logs (cut to 1024 bytes)."""
    actual_tokens: int | None = None
    """Tokens the attempt really used, settling its TPM charge; None keeps the estimate."""
    value: T_co = field(default=None, repr=False)  # type: ignore[assignment]
    """None unless the attempt set it; a failed attempt's may be its response."""

    @overload
    @classmethod
    def from_response(cls, response: R) -> Result[R]: ...

    @overload
    @classmethod
    def from_response(cls, response: Any, *, value: V) -> Result[V]: ...

    @classmethod
    def from_response(cls, response: Any, *, value: Any = _Unset.UNSET) -> Result[Any]:
        """Classifies an ``httpx`` or ``requests`` response (anything with
        ``status_code``, ``headers`` and ``content`` or ``text``); ``value``
        defaults to the response itself."""
        outcome, hint = classify_response(response)
        return Result(
            outcome,
            retry_after_s=hint,
            http_status=int(response.status_code),
            value=response if value is _Unset.UNSET else value,
        )

    @classmethod
    def from_exception(cls, exc: BaseException) -> Result[Any]:
        """A transport error (timeout, refused or reset connection) is
        TRANSIENT; a cancellation is CANCELLED."""
        return Result(classify_exception(exc), detail=f"{type(exc).__name__}: {exc}")


@dataclass(frozen=True)
class SourceReason:
    """One source's refusal of the call's last Pick."""

    source: str
    reason: str
    """cooldown, circuit_open, probe_in_flight, forced_open, adaptive_paced or rate_limited."""
    retry_after_s: float
    """Time until this source's earliest certain retry (0 when there is none)."""
