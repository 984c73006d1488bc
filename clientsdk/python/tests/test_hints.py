"""Retry hints saturate: never negative, never overflowing, at most 24 hours;
anything that is not a number or a duration is no hint at all."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import polygate
from polygate import MAX_HINT_S, Outcome

NOW = datetime(2026, 10, 21, 7, 28, tzinfo=timezone.utc)
DAY = 86_400.0
BUSY = settings(deadline=None, database=None)
"""No per-example deadline on a busy machine, and no example database left in the tree."""


def hint(headers: dict[str, str], body: str = "") -> float:
    outcome, h = polygate.classify(429, headers, body, now=NOW)
    assert outcome == Outcome.RATE_LIMITED
    return h


@pytest.mark.parametrize(
    ("headers", "body", "want"),
    [
        # Retry-After: seconds, decimals, HTTP dates.
        ({"Retry-After": "3"}, "", 3.0),
        ({"Retry-After": "1.5"}, "", 1.5),
        ({"Retry-After": "Wed, 21 Oct 2026 07:28:30 GMT"}, "", 30.0),
        ({"Retry-After": "Wed, 21 Oct 2026 07:00:00 GMT"}, "", 0.0),  # past: retry now
        ({"Retry-After": "Fri, 31 Dec 9999 23:59:59 GMT"}, "", DAY),
        ({"Retry-After": "4611686018"}, "", DAY),
        ({"Retry-After": "9223372036854775807"}, "", DAY),
        ({"Retry-After": "9" * 5000}, "", DAY),  # beyond Python's int() digit limit
        ({"Retry-After": "0000000000000000000000000000000000000002"}, "", 2.0),
        ({"Retry-After": "86400.000000001"}, "", DAY),
        ({"Retry-After": "86399.5"}, "", 86399.5),
        # Not a number: no hint, the reset headers are used instead.
        ({"Retry-After": "-5"}, "", 0.0),
        ({"Retry-After": "-5", "x-ratelimit-reset-requests": "2s"}, "", 2.0),
        ({"Retry-After": "NaN"}, "", 0.0),
        ({"Retry-After": "inf"}, "", 0.0),
        ({"Retry-After": "Infinity"}, "", 0.0),
        ({"Retry-After": "1e3"}, "", 0.0),
        ({"Retry-After": "+3"}, "", 0.0),
        ({"Retry-After": "0x10"}, "", 0.0),
        ({"Retry-After": "Fri, 31 Dec 10000 23:59:59 GMT"}, "", 0.0),
        # retry-after-ms, used instead of Retry-After when usable.
        ({"retry-after-ms": "250"}, "", 0.25),
        ({"retry-after-ms": "250", "Retry-After": "1"}, "", 0.25),
        ({"retry-after-ms": "2500", "Retry-After": "1"}, "", 2.5),
        ({"retry-after-ms": "soon", "Retry-After": "1"}, "", 1.0),
        ({"retry-after-ms": "0.5"}, "", 0.0005),
        ({"retry-after-ms": "-1"}, "", 0.0),
        ({"retry-after-ms": "nan"}, "", 0.0),
        ({"retry-after-ms": "99999999999999999999999"}, "", DAY),
        ({"retry-after-ms": "100", "x-ratelimit-reset-requests": "5s"}, "", 0.1),  # a usable header wins over resets
        # x-ratelimit-reset-<dim> of exhausted dimensions.
        ({"x-ratelimit-reset-requests": "1s", "x-ratelimit-reset-tokens": "6m0s"}, "", 360.0),
        ({"x-ratelimit-reset-tokens": "6m0s", "x-ratelimit-remaining-tokens": "10"}, "", 0.0),
        ({"x-ratelimit-reset-tokens": "20ms", "x-ratelimit-remaining-tokens": "0"}, "", 0.02),
        ({"x-ratelimit-reset-tokens-day": "2h"}, "", 0.0),  # OpenAI's two dimensions only
        ({"x-ratelimit-reset-requests": "1281023h1281023h1281023h1281023h"}, "", DAY),
        ({"x-ratelimit-reset-requests": "2562047h47m16.854775807s"}, "", DAY),
        ({"x-ratelimit-reset-requests": "99999999999999999999999999h"}, "", DAY),
        ({"x-ratelimit-reset-requests": "-1s"}, "", 0.0),
        ({"x-ratelimit-reset-requests": "1s-1s"}, "", 0.0),
        ({"x-ratelimit-reset-requests": "NaNs"}, "", 0.0),
        ({"x-ratelimit-reset-requests": "1.2.3s"}, "", 0.0),
        ({"x-ratelimit-reset-requests": "1d"}, "", 0.0),
        # retryDelay anywhere in a JSON body.
        ({}, '{"error":{"details":[{"retryDelay":"7.66s"}]}}', 7.66),
        ({}, '{"error":{"details":[{"retryDelay":"1281023h1281023h1281023h1281023h"}]}}', DAY),
        ({}, '{"error":{"details":[{"retryDelay":"-3s"}]}}', 0.0),
        ({}, '{"retryDelay": 5}', 0.0),
        ({"Retry-After": "2"}, '{"retryDelay":"4s"}', 4.0),
        ({}, "[" * 100_000, 0.0),  # nesting too deep for the parser: not JSON
        ({}, '{"retryDelay":"1s","pad":"' + "x" * (2 << 20) + '"}', 0.0),  # too long to parse
    ],
    ids=repr,
)
def test_hint_edges(headers: dict[str, str], body: str, want: float) -> None:
    assert hint(headers, body) == pytest.approx(want, abs=1e-9)


def test_cap_is_a_day() -> None:
    assert MAX_HINT_S == DAY


@BUSY
@given(st.text(max_size=64))
def test_any_header_value_is_a_bounded_hint(value: str) -> None:
    for name in ("Retry-After", "retry-after-ms", "x-ratelimit-reset-requests"):
        assert 0.0 <= hint({name: value}) <= DAY


@BUSY
@given(st.integers(min_value=-(10**40), max_value=10**40), st.sampled_from(["", ".5", "s", "ms", "h", "m0s"]))
def test_any_number_saturates(n: int, suffix: str) -> None:
    h = hint({"x-ratelimit-reset-requests": f"{n}{suffix}", "Retry-After": f"{n}"})
    assert 0.0 <= h <= DAY
    if n < 0:
        assert h == 0.0


@BUSY
@given(st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(9999, 12, 31, 23, 59, 59)))
def test_any_http_date_saturates(when: datetime) -> None:
    h = hint({"Retry-After": when.strftime("%a, %d %b %Y %H:%M:%S GMT")})
    want = min(max((when.replace(tzinfo=timezone.utc) - NOW).total_seconds(), 0.0), DAY)
    assert h == pytest.approx(want, abs=1e-6)


@pytest.mark.parametrize(
    ("body", "want"),
    [
        ('{"usage":{"total_tokens":8}}', 8),
        ('{"usage":{"total_tokens":8.0}}', 8),
        ('{"usage":{"total_tokens":8.5}}', None),
        ('{"usage":{"total_tokens":-1}}', None),
        ('{"usage":{"total_tokens":true}}', None),
        ('{"usage":{"total_tokens":"8"}}', None),
        ('{"usage":{"total_tokens":9223372036854775808}}', None),
        ('{"usage":{"total_tokens":1e400}}', None),
        ('{"usage":null}', None),
        ("[]", None),
        ("not json", None),
        ("", None),
    ],
)
def test_total_tokens(body: str, want: int | None) -> None:
    assert polygate.total_tokens(body.encode()) == want
