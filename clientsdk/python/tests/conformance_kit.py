"""The Python runner of the conformance kit (clientsdk/conformance): it plays
the application's side of each exchange with a polygate Client (or
AsyncClient) and an httpx or httpx2 client governed by the SDK's transport,
against the kit's fake sidecar (its ``fakesidecar`` program, driven over its
control API), and returns every difference, the fake's and its own."""

from __future__ import annotations

import asyncio
import json
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import polygate

TIMEOUT = 60.0
"""Bound of every wait: the fake's events and the steps that have not come."""

PLACEHOLDER = "http://polygate.invalid"
"""The origin the application's requests are written against."""


@dataclass(frozen=True)
class Mode:
    """How the application runs: its HTTP library (httpx or httpx2, each
    with its polygate transports) and whether it is asyncio."""

    lib: ModuleType
    transports: ModuleType
    is_async: bool

    def __str__(self) -> str:
        return f"{self.lib.__name__}-{'async' if self.is_async else 'sync'}"


class Kit:
    """The fake sidecar's control API."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _send(self, path: str, data: bytes | None = None, timeout: float = TIMEOUT) -> bytes:
        req = urllib.request.Request(self.url + path, data=data, method="GET" if data is None else "POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout + 5) as resp:
                body: bytes = resp.read()
                return body
        except urllib.error.HTTPError as err:
            raise RuntimeError(f"fakesidecar {path}: {err.code} {err.read().decode(errors='replace')}") from None

    def begin(self, text: str) -> dict[str, Any]:
        """Serves an exchange (its JSON text); where its sidecar and upstream listen."""
        endpoints: dict[str, Any] = json.loads(self._send("/exchange", text.encode()))
        return endpoints

    def stop_sidecar(self) -> None:
        self._send("/sidecar/stop", b"")

    def events(self, count: int) -> None:
        """Waits until the exchange has seen count events."""
        self._send(f"/events?count={count}&timeout_ms={int(TIMEOUT * 1000)}")

    def result(self, wait: float) -> dict[str, Any]:
        """What the fake saw, once every step came (or after wait seconds)."""
        report: dict[str, Any] = json.loads(self._send(f"/result?timeout_ms={int(wait * 1000)}", timeout=wait))
        return report

    def run(self, text: str, mode: Mode, result_wait: float = TIMEOUT) -> list[str]:
        """Runs one exchange; every difference found, none when the SDK conformed."""
        ex = json.loads(text)
        ep = self.begin(text)
        with tempfile.TemporaryDirectory() as tmp:
            if mode.is_async:
                problems = asyncio.run(self._arun(ex, ep, mode, Path(tmp)))
            else:
                problems = self._run(ex, ep, mode, Path(tmp))
        report = self.result(result_wait)
        problems += report["mismatches"]
        if problems:
            problems.append(f"(events: {json.dumps(report['events'])})")
        return problems

    def _run(self, ex: dict[str, Any], ep: dict[str, Any], mode: Mode, tmp: Path) -> list[str]:
        problems = []
        scope = ex.get("scope", "chat")
        with polygate.Client(ep["sidecar"], **client_options(ex, ep, scope, tmp)) as client:
            for i, call in enumerate(ex["calls"]):
                if call.get("sidecar_down"):
                    self.stop_sidecar()
                transport = mode.transports.PolygateTransport(client, scope, **call_options(call))
                with mode.lib.Client(transport=transport, timeout=TIMEOUT) as http:
                    problems += [f"calls[{i}]: {p}" for p in self._call(http, call)]
        return problems

    async def _arun(self, ex: dict[str, Any], ep: dict[str, Any], mode: Mode, tmp: Path) -> list[str]:
        problems = []
        scope = ex.get("scope", "chat")
        async with polygate.AsyncClient(ep["sidecar"], **client_options(ex, ep, scope, tmp)) as client:
            for i, call in enumerate(ex["calls"]):
                if call.get("sidecar_down"):
                    await asyncio.to_thread(self.stop_sidecar)
                transport = mode.transports.AsyncPolygateTransport(client, scope, **call_options(call))
                async with mode.lib.AsyncClient(transport=transport, timeout=TIMEOUT) as http:
                    problems += [f"calls[{i}]: {p}" for p in await self._acall(http, call)]
        return problems

    def _call(self, http: Any, call: dict[str, Any]) -> list[str]:
        """One call of a blocking application."""
        if call.get("abort_after"):
            raise ValueError("a blocking application cannot give a call up: run the exchange with asyncio (see gives_a_call_up)")
        response: Any = None
        error: BaseException | None = None
        try:
            response = http.request(**request_of(call))
            response.read()
        except Exception as exc:
            error = exc
        return seen(call["app_sees"], response, error, False)

    async def _acall(self, http: Any, call: dict[str, Any]) -> list[str]:
        """One call of an asyncio application; its abort cancels the call's task."""
        n = call.get("abort_after", 0)

        async def send() -> Any:
            response = await http.request(**request_of(call))
            await response.aread()
            return response

        task = asyncio.create_task(send())
        failed: list[BaseException] = []
        if n:
            try:
                await asyncio.to_thread(self.events, n)
            except Exception as exc:
                failed.append(exc)
            task.cancel()
        response: Any = None
        error: BaseException | None = None
        try:
            response = await task
        except (Exception, asyncio.CancelledError) as exc:
            error = exc
        if failed:
            return [f"the abort's events never came: {failed[0]}"]
        return seen(call["app_sees"], response, error, isinstance(error, asyncio.CancelledError))


def gives_a_call_up(text: str) -> bool:
    """Whether the application gives a call of the exchange up (abort_after).
    A blocking Python program can do that only with a signal (Ctrl-C), whose
    exception is raised wherever the main thread is: inside grpcio's or
    httpcore's locks it can leave them held (grpc/grpc#20026), so such an
    exchange runs with asyncio only, whose cancellation both support."""
    return any(call.get("abort_after") for call in json.loads(text)["calls"])


def client_options(ex: dict[str, Any], ep: dict[str, Any], scope: str, tmp: Path) -> dict[str, Any]:
    """The exchange's client options, as an application gives them: nothing
    is left to the environment."""
    spec = ex.get("client", {})
    opts: dict[str, Any] = {
        "token": spec.get("token", ""),
        "tls": False,
        "priority": spec.get("priority", 0),
        "tenant": spec.get("tenant", ""),
        "on_sidecar_unavailable": spec.get("on_sidecar_unavailable", "fail"),
    }
    if "fallback" in spec:
        source = spec["fallback"]["source"]
        opts["fallback"] = {scope: polygate.Fallback(source, {"base_url": f"{ep['upstream']}/{source}"})}
    if ep.get("tls"):
        files = {}
        for key, name in (("ca", "ca_file"), ("client_cert", "cert_file"), ("client_key", "key_file")):
            if ep["tls"].get(key):
                (tmp / key).write_text(ep["tls"][key])
                files[name] = str(tmp / key)
        opts["tls"] = polygate.TLS(**files)
    return opts


def call_options(call: dict[str, Any]) -> dict[str, Any]:
    """The call's options, as the transport's."""
    o = call.get("options", {})
    out: dict[str, Any] = {"estimated_tokens": o.get("estimated_tokens", 0)}
    if "deadline_ms" in o:
        out["deadline"] = o["deadline_ms"] / 1000
    for key in ("priority", "tenant"):
        if key in o:
            out[key] = o[key]
    return out


def request_of(call: dict[str, Any]) -> dict[str, Any]:
    r = call["request"]
    return {"method": r["method"], "url": PLACEHOLDER + r["path"], "headers": r.get("headers", {}), "content": r.get("body")}


def seen(want: dict[str, Any], response: Any, error: BaseException | None, aborted: bool) -> list[str]:
    """The differences between what the application got (a response, or an
    error: its own abort when aborted) and app_sees."""
    if "error" in want:
        if response is not None:
            return [f"the application got a {response.status_code} response, want the {want['error']} error"]
        ok = aborted if want["error"] == "aborted" else isinstance(error, polygate.UnavailableError)
        return [] if ok else [f"the application got {error!r}, want the {want['error']} error"]
    if response is None:
        return [f"the application got {error!r}, want a {want['status']} response"]
    out = []
    if response.status_code != want["status"]:
        out.append(f"status = {response.status_code}, want {want['status']}")
    for key, value in want.get("headers", {}).items():
        got = response.headers.get(key)
        if got != value:
            out.append(f"header {key} = {json.dumps(got)}, want {json.dumps(value)}")
    text = response.content.decode(errors="replace")
    if "body" in want and text != want["body"]:
        out.append(f"body = {json.dumps(text[:500])}, want {json.dumps(want['body'])}")
    if "body_json" in want:
        try:
            doc = json.loads(text)
        except ValueError:
            return [*out, f"body is not JSON: {json.dumps(text[:500])}"]
        for path, value in want["body_json"].items():
            got = at(doc, path)
            if not same(got, value):
                out.append(f"body {path} = {json.dumps(got)}, want {json.dumps(value)}")
    return out


def at(doc: Any, path: str) -> Any:
    """The value at a dotted path of a JSON document (array elements by index), None when there is none."""
    for key in path.split("."):
        if isinstance(doc, dict):
            doc = doc.get(key)
        elif isinstance(doc, list) and key.isdigit() and int(key) < len(doc):
            doc = doc[int(key)]
        else:
            return None
    return doc


def same(a: Any, b: Any) -> bool:
    """Whether two JSON values are equal: numbers by value (30 is 30.0), never a boolean as a number."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)
