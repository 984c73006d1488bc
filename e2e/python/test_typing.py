"""mypy --strict accepts the documented setups of the installed openai: on
httpx2 for openai 3, on httpx for openai 2, sync and async; and refuses a
transport of the wrong kind (so the check can fail)."""

from __future__ import annotations

from pathlib import Path

import openai
from mypy import api as mypy_api

FLAVOUR = "httpx2" if int(openai.__version__.split(".")[0]) >= 3 else "httpx"

SETUP = """
import {lib}
import openai
import polygate
from polygate.{flavour} import AsyncPolygateTransport, PolygateTransport


def sync(pg: polygate.Client) -> openai.OpenAI:
    return openai.OpenAI(
        base_url="http://polygate/v1",
        api_key="k",
        http_client={lib}.Client(transport=PolygateTransport(pg, "chat", estimated_tokens=500)),
        max_retries=0,
    )


def asynchronous(pg: polygate.AsyncClient) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url="http://polygate/v1",
        api_key="k",
        http_client={lib}.AsyncClient(transport=AsyncPolygateTransport(pg, "chat")),
        max_retries=0,
    )


def reason(e: openai.APIStatusError) -> str:
    verdict = polygate.failure_of(e)
    return verdict.reason if verdict is not None else e.response.headers.get("polygate-failure-reason", "")
"""


def check(tmp_path: Path, source: str) -> tuple[str, int]:
    path = tmp_path / "setup.py"
    path.write_text(source)
    out, err, status = mypy_api.run(["--strict", "--no-incremental", "--cache-dir", str(tmp_path / "cache"), str(path)])
    return out + err, status


def test_mypy_strict_accepts_the_documented_setup(tmp_path: Path) -> None:
    out, status = check(tmp_path, SETUP.format(lib=FLAVOUR, flavour=FLAVOUR))
    assert status == 0, out


WRONG = """
import {lib}
import polygate
import polygate.httpx
from polygate.{flavour} import AsyncPolygateTransport


def async_transport_in_a_sync_client(pg: polygate.AsyncClient) -> {lib}.Client:
    return {lib}.Client(transport=AsyncPolygateTransport(pg, "chat"))


def httpx_transport_in_this_client(pg: polygate.Client) -> {lib}.Client:
    return {lib}.Client(transport=polygate.httpx.PolygateTransport(pg, "chat"))
"""


def test_mypy_strict_refuses_a_transport_of_the_wrong_kind(tmp_path: Path) -> None:
    """An async transport in a sync client, and (for httpx2) httpx's
    transport in an httpx2 client, which httpx2 fails at run time with an
    AssertionError: the check above can fail."""
    out, status = check(tmp_path, WRONG.format(lib=FLAVOUR, flavour=FLAVOUR))
    assert status != 0 and '"async_transport_in_a_sync_client"' not in out
    assert out.count('incompatible type "AsyncPolygateTransport"') == 1, out
    assert out.count('incompatible type "PolygateTransport"') == (1 if FLAVOUR == "httpx2" else 0), out
