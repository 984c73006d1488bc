"""What a governed HTTP client sees when its call ends on a verdict: the
headers that name polygate's verdict, and the response synthesized when no
upstream answer exists. The rules (shared with the Go SDK, written down in
docs/quickstart.md) are here once, free of any HTTP library."""

from __future__ import annotations

import json

from polygate._errors import CallFailedError

FAILURE_REASON = "polygate-failure-reason"
RETRY_AFTER = "polygate-retry-after"
CALL_ID = "polygate-call-id"
ERROR_TYPE = "polygate_error"


def millis(seconds: float) -> int:
    """A duration in whole milliseconds, rounded up (never early), never
    negative."""
    if not seconds > 0:  # NaN included
        return 0
    ns = round(min(seconds, 1e12) * 1e9)  # whole nanoseconds, as the sidecar sends them
    return -(-ns // 1_000_000)


def seconds_text(ms: int) -> str:
    """Milliseconds as seconds with exactly three decimals: 2 ms is 0.002."""
    return f"{ms // 1000}.{ms % 1000:03d}"


def status_for(reason: str) -> int:
    """The synthesized status of a verdict: 429 when the scope's or tenant's
    capacity said no (quota_exhausted, or a budget), 503 for all others."""
    return 429 if reason == "quota_exhausted" or "budget" in reason else 503


def verdict_headers(err: CallFailedError) -> list[tuple[str, str]]:
    """The headers that carry the verdict on the response the client gets."""
    headers = [(FAILURE_REASON, err.reason or "unknown"), (RETRY_AFTER, seconds_text(millis(err.retry_after_s)))]
    if err.call_id:
        headers.append((CALL_ID, err.call_id))
    return headers


def message(err: CallFailedError) -> str:
    """The synthesized error's message: the reason, the scope, when to retry
    (if there is a certain time), the call, each source's refusal."""
    ms = millis(err.retry_after_s)
    msg = f"polygate: {err.reason or 'unknown'} in scope {err.scope}"
    if ms > 0:
        msg += f", retry after {seconds_text(ms)}s"
    if err.call_id:
        msg += f" (call {err.call_id})"
    if err.per_source_reasons:
        parts = []
        for r in err.per_source_reasons:
            rms = millis(r.retry_after_s)
            parts.append(f"{r.source} {r.reason}" + (f" {seconds_text(rms)}s" if rms > 0 else ""))
        msg += ": " + "; ".join(parts)
    return msg


def synthesized(err: CallFailedError) -> tuple[int, list[tuple[str, str]], bytes]:
    """The status, headers and JSON body of the response that stands for a
    verdict with no upstream answer, in the OpenAI error shape, so that a
    provider SDK raises its usual status error with polygate's message."""
    ms = millis(err.retry_after_s)
    headers = [("content-type", "application/json"), *verdict_headers(err)]
    if ms > 0:
        headers.append(("retry-after", str(-(-ms // 1000))))
    body = {
        "error": {
            "message": message(err),
            "type": ERROR_TYPE,
            "code": err.reason or "unknown",
            "param": None,
            "polygate": {
                "reason": err.reason or "unknown",
                "retry_after_s": ms / 1000,
                "scope": err.scope,
                "call_id": err.call_id,
                "attempts": err.attempts,
                "per_source": [
                    {"source": r.source, "reason": r.reason, "retry_after_s": millis(r.retry_after_s) / 1000}
                    for r in err.per_source_reasons
                ],
            },
        }
    }
    return status_for(err.reason), headers, json.dumps(body, separators=(",", ":")).encode()
