"""The one implementation behind the transports of every HTTP library flavour
(``polygate.httpx``, ``polygate.httpx2``): each request is one call of the
scope; each granted attempt is the request pointed at the source; the call's
end is a response for the client: the upstream's own, or one that stands for
polygate's verdict.

It touches requests and responses only through the small interface below
(``Request``, ``Response``, ``Flavour``), which httpx and httpx2 both
provide, never their internals."""

from __future__ import annotations

import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from polygate._answers import CALL_ID, synthesized, verdict_headers
from polygate._classify import classify, total_tokens
from polygate._client import AsyncClient, Client
from polygate._errors import CallFailedError, UnavailableError
from polygate._outcome import Outcome
from polygate._types import Grant, Result
from polygate._unavailable import is_unreachable

VERDICT_EXTENSION = "polygate_verdict"
"""The key, in a response's extensions, of the CallFailedError it stands for."""
_RETRY_HEADER = "x-stainless-retry-count"


class ProviderRetryWarning(UserWarning):
    """A provider SDK retried a request that the sidecar already governs:
    two retry layers. Turn the SDK's retries off (``max_retries=0``)."""


class Request(Protocol):
    """What the transports use of a request."""

    method: str
    url: Any  # str() of it is the URL; .raw_path its path and query, bytes
    headers: Any  # case-insensitive: get, copy, del, set
    extensions: dict[str, Any]

    @property
    def content(self) -> bytes: ...


class Response(Protocol):
    """What the transports use of a response."""

    status_code: int
    headers: Any  # case-insensitive: get, set, multi_items
    extensions: dict[str, Any]

    @property
    def content(self) -> bytes: ...


Req = TypeVar("Req", bound=Request)
Resp = TypeVar("Resp", bound=Response)


@dataclass(frozen=True)
class Flavour(Generic[Req, Resp]):
    """An HTTP library's pieces: its Request(method, url, headers=, content=,
    extensions=) and Response(status, headers=, content=, extensions=,
    request=) constructors, the base of its errors of sending a request, and its URL
    normalisation (``str(URL(s))``)."""

    name: str
    request: Callable[..., Req]
    response: Callable[..., Resp]
    request_error: type[Exception]
    url: Callable[[str], str]


def failure_of(obj: Any) -> CallFailedError | None:
    """The polygate verdict a response stands for, or None: ``obj`` is a
    response a governed client returned, or an exception holding one as
    ``response`` (``openai.APIStatusError``)."""
    response = getattr(obj, "response", obj)
    ext = getattr(response, "extensions", None)
    found = ext.get(VERDICT_EXTENSION) if isinstance(ext, dict) else None
    return found if isinstance(found, CallFailedError) else None


class _Call(Generic[Resp]):
    """One request's call, as the transport sees it: its id and last attempt."""

    def __init__(self) -> None:
        self.call_id = ""
        self.last: Result[Resp] | None = None


class Governor(Generic[Req, Resp]):
    """What a sync and an async transport share: the request for a grant,
    the attempt's Result, the response for the call's end, the check for
    provider retries."""

    def __init__(
        self,
        flavour: Flavour[Req, Resp],
        scope: str,
        estimated_tokens: int | Callable[[Req], int],
        deadline: float | None,
        base_url: str | None,
        attribute: str,
        prepare: Callable[[Req, Grant], None] | None,
        priority: int | None = None,
        tenant: str | None = None,
    ) -> None:
        self.flavour = flavour
        self.scope = scope
        self._estimate = estimated_tokens
        self.deadline = deadline
        self._base_url = None if base_url is None else flavour.url(base_url).rstrip("/")
        self._attribute = attribute
        self._prepare = prepare
        self._priority = priority
        self._tenant = tenant
        self._warned = False

    def check(self, request: Req) -> int:
        """Warns once when the request is a provider SDK's retry; returns the
        request's estimated tokens."""
        count = request.headers.get(_RETRY_HEADER, "0").strip()
        if not self._warned and count.isdigit() and int(count) > 0:
            self._warned = True
            warnings.warn(
                ProviderRetryWarning(
                    f"a provider SDK retried a request governed by polygate (scope {self.scope}, {_RETRY_HEADER}: {count[:20]}): "
                    "every retry of the SDK starts a new governed call; turn the SDK's retries off (max_retries=0)"
                ),
                stacklevel=5,
            )
        return self._estimate(request) if callable(self._estimate) else self._estimate

    def request(self, request: Req, grant: Grant) -> Req:
        """The request for the granted source, its body already read."""
        target = grant.attributes.get(self._attribute, "")
        if not target:
            raise ValueError(f"scope {self.scope}: source {grant.source} has no {self._attribute!r} attribute to send the request to")
        url = str(request.url)
        if self._base_url is None:
            rest = request.url.raw_path.decode("ascii")
        elif url == self._base_url or url.startswith(self._base_url + "/") or url.startswith(self._base_url + "?"):
            rest = url[len(self._base_url) :]
        else:
            raise ValueError(f"the request URL {url[:200]!r} is not under the transport's base_url {self._base_url!r}")
        headers = request.headers.copy()
        del headers["host"]  # set for the source's URL
        extensions = dict(request.extensions)
        if grant.timeout_s > 0:
            timeout = dict(extensions.get("timeout") or {})
            for key in ("connect", "read", "write", "pool"):
                t = timeout.get(key)
                timeout[key] = grant.timeout_s if t is None else min(t, grant.timeout_s)
            extensions["timeout"] = timeout
        out = self.flavour.request(
            request.method,
            target.rstrip("/") + rest,
            headers=headers,
            content=request.content or None,
            extensions=extensions,
        )
        if self._prepare is not None:
            self._prepare(out, grant)
        return out

    @staticmethod
    def must_read(response: Resp) -> bool:
        """A response's body is read to classify it, unless it is a 2xx that
        is not JSON (a stream, a file), which is passed through unread."""
        if not 200 <= response.status_code <= 299:
            return True
        return "json" in response.headers.get("content-type", "").lower()

    @staticmethod
    def result(response: Resp, read: bool) -> Result[Resp]:
        body = response.content if read else b""
        outcome, hint = classify(response.status_code, response.headers.multi_items(), body)
        tokens = total_tokens(body) if outcome == Outcome.SUCCESS and read else None
        return Result(outcome, retry_after_s=hint, http_status=response.status_code, actual_tokens=tokens, value=response)

    @staticmethod
    def done(response: Resp, call: _Call[Resp]) -> Resp:
        """The successful attempt's response, with the call's id."""
        if call.call_id:
            response.headers[CALL_ID] = call.call_id
        return response

    def failed(self, request: Req, err: CallFailedError) -> Resp:
        """The response for a verdict: the last attempt's own response when
        there is one (the client raises its usual error with the provider's
        words), else one synthesized for the verdict; either way with the
        verdict's headers and the verdict in its extensions."""
        last = err.last_result.value if err.last_result is not None else None
        if last is not None and hasattr(last, "status_code") and hasattr(last, "extensions"):
            response: Resp = last
            for k, v in verdict_headers(err):
                response.headers[k] = v
        else:
            status, headers, body = synthesized(err)
            response = self.flavour.response(status, headers=headers, content=body, request=request)
        response.extensions = {**response.extensions, VERDICT_EXTENSION: err}
        return response

    @staticmethod
    def unreachable(client: Client | AsyncClient, err: UnavailableError, call: _Call[Resp]) -> Resp:
        """The answer when the call ended because the sidecar could not be
        reached: under ``allow``, the response of the attempt made (the
        upstream's own status, passed through); else err, raised."""
        if client.on_sidecar_unavailable == "allow" and is_unreachable(err) and call.last is not None and call.last.value is not None:
            return call.last.value
        raise err

    def handle(self, client: Client, request: Req, send: Callable[[Req], Resp], read: Callable[[Resp], object], close: Callable[[Resp], object]) -> Resp:
        """Governs one request of a sync client; send, read and close are the
        inner transport's and the response's."""
        tokens = self.check(request)
        call: _Call[Resp] = _Call()

        def attempt(grant: Grant) -> Result[Resp]:
            call.call_id = grant.call_id
            req = self.request(request, grant)
            try:
                response = send(req)
            except self.flavour.request_error as exc:
                return Result.from_exception(exc)
            must = self.must_read(response)
            if must:
                try:
                    read(response)
                except self.flavour.request_error as exc:
                    close(response)
                    return Result.from_exception(exc)
            call.last = self.result(response, must)
            return call.last

        try:
            return self.done(client.call(self.scope, attempt, estimated_tokens=tokens, deadline=self.deadline, priority=self._priority, tenant=self._tenant), call)
        except CallFailedError as err:
            return self.failed(request, err)
        except UnavailableError as err:
            return self.unreachable(client, err, call)

    async def ahandle(
        self,
        client: AsyncClient,
        request: Req,
        send: Callable[[Req], Awaitable[Resp]],
        read: Callable[[Resp], Awaitable[object]],
        close: Callable[[Resp], Awaitable[object]],
    ) -> Resp:
        """handle for an async client."""
        tokens = self.check(request)
        call: _Call[Resp] = _Call()

        async def attempt(grant: Grant) -> Result[Resp]:
            call.call_id = grant.call_id
            req = self.request(request, grant)
            try:
                response = await send(req)
            except self.flavour.request_error as exc:
                return Result.from_exception(exc)
            must = self.must_read(response)
            if must:
                try:
                    await read(response)
                except self.flavour.request_error as exc:
                    await close(response)
                    return Result.from_exception(exc)
            call.last = self.result(response, must)
            return call.last

        try:
            return self.done(await client.call(self.scope, attempt, estimated_tokens=tokens, deadline=self.deadline, priority=self._priority, tenant=self._tenant), call)
        except CallFailedError as err:
            return self.failed(request, err)
        except UnavailableError as err:
            return self.unreachable(client, err, call)
