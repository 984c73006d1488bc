"""The outcome table for HTTP results, shared with the Go SDK through
testdata/classification.json."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import Any

from polygate._outcome import Outcome

MAX_HINT_S = 86_400.0
"""The ceiling of every retry hint the classifier returns: 24 hours. A hint
beyond it (an HTTP date in year 9999, a huge number) saturates to it; the
sidecar caps again with the scope's own limits."""

_MAX_HINT_NS = 86_400 * 1_000_000_000
_MAX_DIGITS = 18
"""Digits beyond which a number saturates without being converted."""
_MAX_BODY = 1 << 20
"""Bodies longer than this are not parsed for insufficient_quota or retryDelay."""
_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "m": 60_000_000_000, "h": 3_600_000_000_000}
_NUMBER = re.compile(r"([0-9]*)(?:(\.)([0-9]*))?")
_PART = re.compile(r"([0-9.]*)(ns|us|µs|ms|s|m|h)")
_HTTP_DATES = ("%a, %d %b %Y %H:%M:%S GMT", "%A, %d-%b-%y %H:%M:%S GMT", "%a %b %d %H:%M:%S %Y")


def classify(
    status: int,
    headers: Mapping[str, str] | Iterable[tuple[str, str]] | None,
    body: bytes | str | None,
    *,
    now: datetime | None = None,
) -> tuple[Outcome, float]:
    """Maps an upstream HTTP result to its outcome and the largest retry hint
    it gave, in seconds (0 if none, at most MAX_HINT_S).

    2xx SUCCESS (hints ignored); 5xx and 408 TRANSIENT; 429 RATE_LIMITED, or
    SOURCE_DEAD when a JSON body says insufficient_quota; 401 and 403
    SOURCE_DEAD; other 4xx, 1xx and 3xx CLIENT_ERROR; a status outside
    100..599 TRANSIENT.

    Hints: ``retry-after-ms`` (milliseconds); without a usable one,
    ``Retry-After`` (seconds or an HTTP date measured from ``now``); without
    a usable one of those, OpenAI's ``x-ratelimit-reset-requests`` and
    ``-tokens`` of each exhausted dimension (``x-ratelimit-remaining-<dim>``
    absent or not above 0). A ``retryDelay`` anywhere in a JSON body counts
    too, and the largest wins. Numbers saturate: a hint is
    never negative and never above 24 hours; a value that is not a number or
    a duration (negative, NaN, inf, garbage) is not a hint.
    """
    if 200 <= status <= 299:
        return Outcome.SUCCESS, 0.0
    raw = body.encode(errors="replace") if isinstance(body, str) else (body or b"")
    if status < 100 or status > 599 or status >= 500 or status == 408:
        outcome = Outcome.TRANSIENT
    elif status == 429:
        outcome = Outcome.SOURCE_DEAD if _insufficient_quota(raw) else Outcome.RATE_LIMITED
    elif status in (401, 403):
        outcome = Outcome.SOURCE_DEAD
    else:
        outcome = Outcome.CLIENT_ERROR
    return outcome, retry_hint(headers, raw, now=now)


def retry_hint(
    headers: Mapping[str, str] | Iterable[tuple[str, str]] | None,
    body: bytes | str | None = None,
    *,
    now: datetime | None = None,
) -> float:
    """The largest retry hint of a response's headers and JSON body, in
    seconds, saturated to [0, MAX_HINT_S]; see classify."""
    raw = body.encode(errors="replace") if isinstance(body, str) else (body or b"")
    h = _lower(headers)
    hint = _number(h.get("retry-after-ms", "").strip(), _NS["ms"])
    if hint is None:
        hint = _retry_after_header(h.get("retry-after", ""), now or datetime.now(timezone.utc))
    if hint is None:
        hint = max(_reset_hint(h, "requests"), _reset_hint(h, "tokens"))
    return min(max(hint, _body_retry_delay(raw)), _MAX_HINT_NS) / 1e9


def classify_response(response: Any) -> tuple[Outcome, float]:
    """classify() for an ``httpx`` or ``requests`` response, duck-typed on
    ``status_code``, ``headers`` and ``content`` (or ``text``)."""
    body: bytes | str | None
    try:
        body = response.content
    except Exception:  # no content attribute, or a streamed body not read
        body = getattr(response, "text", None)
    return classify(int(response.status_code), response.headers, body)


def classify_exception(exc: BaseException) -> Outcome:
    """A transport error is TRANSIENT; a cancellation is CANCELLED."""
    if isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt)):
        return Outcome.CANCELLED
    return Outcome.TRANSIENT


def _lower(headers: Mapping[str, str] | Iterable[tuple[str, str]] | None) -> dict[str, str]:
    if headers is None:
        return {}
    items = headers.items() if isinstance(headers, Mapping) else headers
    out: dict[str, str] = {}
    for k, v in items:
        out.setdefault(str(k).lower(), str(v))
    return out


def _number(s: str, unit_ns: int) -> int | None:
    """Digits with an optional fraction, as a count of unit in nanoseconds,
    exactly, saturated to the 24 h ceiling; None when s is not such a number
    (a sign, an exponent, NaN, inf)."""
    m = _NUMBER.fullmatch(s)
    if m is None or (not m.group(1) and not m.group(3)):
        return None
    whole, frac = m.group(1).lstrip("0"), m.group(3) or ""
    if len(whole) > _MAX_DIGITS:
        return _MAX_HINT_NS
    ns = int(whole or "0") * unit_ns
    scale = unit_ns
    for c in frac:
        scale //= 10
        if scale == 0:
            break
        ns += int(c) * scale
    return min(ns, _MAX_HINT_NS)


def _duration(s: str) -> int | None:
    """OpenAI's and Google's durations ("1s", "6m0s", "20ms", "7.66s"); a
    bare number is seconds. Nanoseconds saturated to the 24 h ceiling, or
    None."""
    s = s.strip()
    if not s:
        return None
    bare = _number(s, _NS["s"])
    if bare is not None:
        return bare
    total, pos = 0, 0
    while pos < len(s):
        m = _PART.match(s, pos)
        if m is None:
            return None
        n = _number(m.group(1), _NS[m.group(2)])
        if n is None:
            return None
        total = min(total + n, _MAX_HINT_NS)
        pos = m.end()
    return total


def _retry_after_header(v: str, now: datetime) -> int | None:
    v = v.strip()
    if not v:
        return None
    n = _number(v, _NS["s"])
    if n is not None:
        return n
    for fmt in _HTTP_DATES:
        try:
            when = datetime.strptime(v, fmt).replace(tzinfo=timezone.utc)
        except ValueError:
            continue
        delta = when - now
        ns = (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1_000
        return min(max(0, ns), _MAX_HINT_NS)
    return None


def _reset_hint(h: dict[str, str], dim: str) -> int:
    """OpenAI's x-ratelimit-reset-<dim>, counted only when the dimension is
    exhausted (x-ratelimit-remaining-<dim> absent or not above 0)."""
    remaining = h.get(f"x-ratelimit-remaining-{dim}", "").strip()
    if remaining:
        try:
            if float(remaining) > 0:
                return 0
        except ValueError:
            pass
    return _duration(h.get(f"x-ratelimit-reset-{dim}", "")) or 0


def _json(raw: bytes) -> Any:
    """The body as JSON, or None when it is empty, too long or not JSON
    (nesting too deep for the parser included)."""
    if not raw or len(raw) > _MAX_BODY:
        return None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def _insufficient_quota(raw: bytes) -> bool:
    doc = _json(raw)
    if not isinstance(doc, dict):
        return False
    err = doc.get("error")
    places = [doc.get("code"), doc.get("type")]
    if isinstance(err, dict):
        places += [err.get("code"), err.get("type")]
    return "insufficient_quota" in [p for p in places if isinstance(p, str)]


def _body_retry_delay(raw: bytes) -> int:
    def walk(v: Any, depth: int) -> int:
        if depth > 32:
            return 0
        most = 0
        if isinstance(v, dict):
            for k, x in v.items():
                if k == "retryDelay" and isinstance(x, str):
                    most = max(most, _duration(x) or 0)
                else:
                    most = max(most, walk(x, depth + 1))
        elif isinstance(v, list):
            for x in v:
                most = max(most, walk(x, depth + 1))
        return most

    return walk(_json(raw), 0)


def total_tokens(body: bytes) -> int | None:
    """OpenAI-style ``usage.total_tokens`` of a JSON body: a non-negative
    integer (a JSON float with no fraction counts), or None."""
    doc = _json(body)
    usage = doc.get("usage") if isinstance(doc, dict) else None
    n = usage.get("total_tokens") if isinstance(usage, dict) else None
    if isinstance(n, bool) or not isinstance(n, (int, float)) or n != n or n < 0 or n >= 2**63:
        return None
    if isinstance(n, float) and not n.is_integer():
        return None
    return int(n)
