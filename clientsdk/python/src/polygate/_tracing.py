"""OpenTelemetry spans of a call, when ``opentelemetry-api`` is installed
(``pip install 'polygate[otel]'``); without it every method does nothing.

A call is a ``polygate.call`` span under the caller's current span, and each
attempt a ``polygate.attempt`` span under it: the attempt's span begins with
the Pick that seeks its permit (so its waits are in it), covers the
application's attempt function (run with the span as the current one) and
ends with the sidecar's answer to its outcome. Every RPC to the sidecar
carries the W3C trace context of the span it belongs to, so the sidecar's own
spans join the trace.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from polygate._errors import CallFailedError
from polygate._types import Grant, Result
from polygate._version import __version__

try:
    from opentelemetry import trace as _otel
    from opentelemetry.baggage.propagation import W3CBaggagePropagator
    from opentelemetry.propagators.composite import CompositePropagator
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    # What the sidecar reads: W3C trace context and baggage.
    _PROPAGATOR: Any = CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])
except ImportError:  # the otel extra is not installed
    _otel = None  # type: ignore[assignment]
    _PROPAGATOR = None

TRACER_NAME = "polygate"


def tracer(tracer_provider: Any = None) -> Any:
    """The SDK's tracer from ``tracer_provider`` (None: the global one, which
    makes no spans unless the application sets a provider), or None when
    opentelemetry-api is not installed."""
    if _otel is None:
        return None
    return _otel.get_tracer(TRACER_NAME, __version__, tracer_provider=tracer_provider)


class CallTrace:
    """The spans of one call; every method is a no-op without a tracer."""

    def __init__(self, tracer: Any, scope: str) -> None:
        self._tracer = tracer
        self._scope = scope
        self._call: Any = None
        self._attempt: Any = None
        self._waits: list[str] = []

    def start(self) -> None:
        """Opens the call's span under the current context."""
        if self._tracer is None:
            return
        self._call = self._tracer.start_span("polygate.call", attributes={"polygate.scope": self._scope})

    def start_attempt(self, number: int) -> None:
        """Opens attempt ``number``'s span (ending the previous one)."""
        if self._call is None:
            return
        self.end_attempt()
        ctx = _otel.set_span_in_context(self._call)
        self._attempt = self._tracer.start_span(
            "polygate.attempt", context=ctx, attributes={"polygate.scope": self._scope, "polygate.attempt": number}
        )

    def granted(self, g: Grant) -> None:
        if self._recording(self._attempt):
            self._attempt.set_attributes({"polygate.source": g.source, "polygate.attempt": g.attempt, "polygate.probe": g.probe})

    def call_id(self, call_id: str) -> None:
        if self._recording(self._call):
            self._call.set_attribute("polygate.call_id", call_id)

    def waited(self, sleep_s: float, causes: Sequence[tuple[str, str]]) -> None:
        """One wait for capacity: how long, and each source's refusal."""
        if not self._recording(self._attempt):
            return
        cause = ",".join(f"{source}={reason}" for source, reason in causes)
        self._waits.append(cause)
        self._attempt.add_event("wait", {"polygate.wait.cause": cause, "polygate.wait.sleep_s": sleep_s})
        self._attempt.set_attributes({"polygate.waits": len(self._waits), "polygate.wait.cause": cause})

    def reported(self, result: Result[Any], verdict: str, reason: str = "", backoff_s: float | None = None) -> None:
        """The attempt's outcome and the sidecar's answer to it; ends the attempt's span."""
        if not self._recording(self._attempt):
            self.end_attempt()
            return
        attrs: dict[str, Any] = {"polygate.outcome": result.outcome.name, "polygate.verdict": verdict}
        if result.http_status:
            attrs["polygate.http_status"] = result.http_status
        if reason:
            attrs["polygate.reason"] = reason
        if backoff_s is not None:
            attrs["polygate.backoff_s"] = backoff_s
        self._attempt.set_attributes(attrs)
        if result.outcome.name != "SUCCESS":
            self._attempt.set_status(_otel.Status(_otel.StatusCode.ERROR, result.outcome.name))
        self.end_attempt()

    def end_attempt(self) -> None:
        if self._attempt is not None:
            self._attempt.end()
            self._attempt, self._waits = None, []

    def end(self, attempts: int, exc: BaseException | None) -> None:
        """Ends the spans with the call's result: done, or the exception."""
        if self._call is None:
            return
        attrs: dict[str, Any] = {"polygate.verdict": "done"}
        if isinstance(exc, CallFailedError):
            attrs = {"polygate.verdict": "failure", "polygate.reason": exc.reason}
        elif isinstance(exc, asyncio.CancelledError | KeyboardInterrupt):
            attrs = {"polygate.verdict": "cancelled"}
        elif exc is not None:
            attrs = {"polygate.verdict": "error", "polygate.error": type(exc).__name__}
        for span in (self._attempt, self._call):
            if not self._recording(span):
                continue
            span.set_attributes(attrs)
            if exc is not None:
                span.set_status(_otel.Status(_otel.StatusCode.ERROR, type(exc).__name__))
        self.end_attempt()
        if self._recording(self._call):
            self._call.set_attribute("polygate.attempts", attempts)
        self._call.end()
        self._call = None

    @staticmethod
    def _recording(span: Any) -> bool:
        """Whether span takes attributes: none are built for a span that is
        missing or not recorded (not sampled, or no provider set)."""
        return span is not None and span.is_recording()

    def _current(self) -> Any:
        return self._attempt if self._attempt is not None else self._call

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The trace context of the current span, as gRPC metadata."""
        span = self._current()
        if span is None:
            return ()
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=_otel.set_span_in_context(span))
        return tuple(carrier.items())

    @contextlib.contextmanager
    def attempt_context(self) -> Iterator[None]:
        """Makes the attempt's span the current one (for the attempt function)."""
        if self._attempt is None:
            yield
            return
        with _otel.use_span(self._attempt, end_on_exit=False, record_exception=False, set_status_on_exception=False):
            yield
