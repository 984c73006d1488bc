"""The shared classification vectors, and the duck-typed response helpers."""

from __future__ import annotations

import asyncio
import json
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests

import polygate
from polygate import Outcome, Result

VECTORS = Path(__file__).resolve().parents[3] / "testdata" / "classification.json"
DOC = json.loads(VECTORS.read_text())
NOW = parsedate_to_datetime(DOC["now"])


def test_vectors_exist() -> None:
    assert len(DOC["cases"]) > 50


@pytest.mark.parametrize("case", DOC["cases"], ids=[c["name"] for c in DOC["cases"]])
def test_shared_vectors(case: dict[str, Any]) -> None:
    outcome, hint = polygate.classify(case["status"], case["headers"], case["body"], now=NOW)
    assert (outcome.value, round(hint * 1000)) == (case["outcome"], case["retry_after_ms"])


def test_every_outcome_row_is_covered() -> None:
    seen = {c["outcome"] for c in DOC["cases"]}
    assert seen == {o.value for o in Outcome} - {"CANCELLED"}  # CANCELLED is the caller's, never a response's


def test_httpx_response() -> None:
    resp = httpx.Response(429, headers={"Retry-After": "3"}, content=b'{"error":{"code":"rate_limit_exceeded"}}')
    r = Result.from_response(resp)
    assert (r.outcome, r.retry_after_s, r.http_status, r.value) == (Outcome.RATE_LIMITED, 3.0, 429, resp)


def test_requests_response() -> None:
    resp = requests.Response()
    resp.status_code = 429
    resp.headers["x-ratelimit-reset-requests"] = "20ms"
    resp._content = b'{"error":{"type":"insufficient_quota"}}'
    r = Result.from_response(resp, value="mine")
    assert (r.outcome, r.retry_after_s, r.value) == (Outcome.SOURCE_DEAD, 0.02, "mine")


def test_any_object_with_status_headers_and_text() -> None:
    class Bare:
        status_code = 503
        headers = [("Retry-After", "2")]
        text = "{}"

    assert polygate.classify_response(Bare()) == (Outcome.TRANSIENT, 2.0)


@pytest.mark.parametrize(
    ("exc", "outcome"),
    [
        (httpx.ConnectError("refused"), Outcome.TRANSIENT),
        (httpx.ReadTimeout("slow"), Outcome.TRANSIENT),
        (requests.ConnectionError("reset"), Outcome.TRANSIENT),
        (requests.Timeout("slow"), Outcome.TRANSIENT),
        (TimeoutError(), Outcome.TRANSIENT),
        (asyncio.CancelledError(), Outcome.CANCELLED),
    ],
)
def test_transport_errors(exc: BaseException, outcome: Outcome) -> None:
    r = Result.from_exception(exc)
    assert r.outcome == outcome and r.detail
