"""httpx transports that govern every request of an ``httpx.Client`` (or
``httpx.AsyncClient``) with the sidecar, so that a provider SDK built on
httpx is governed with one line::

    http = httpx.Client(transport=PolygateTransport(client, "chat"))
    llm = openai.OpenAI(base_url="http://polygate/v1", api_key=..., http_client=http, max_retries=0)

Each request is one call of the scope. For each attempt the sidecar grants,
the request is sent to the granted source: the part of the request's URL
that ``base_url`` covers (by default its scheme, host and port) is replaced
by the source's ``base_url`` attribute, so with a source whose ``base_url``
is ``https://api.openai.com`` the request ``http://polygate/v1/chat/completions``
goes to ``https://api.openai.com/v1/chat/completions``. The response is
classified like ``polygate.classify`` (its body read first unless it is a
2xx that is not JSON, e.g. a stream), OpenAI-style ``usage.total_tokens``
of a 2xx JSON body is reported as the attempt's tokens, and the transport
does what the sidecar answers: return the response, retry (on the same or
another source) after the backoff, wait, or fail.

When the call fails with the verdict ``non_retryable`` (the upstream refused
the request itself, e.g. a 400), the last attempt's response is returned, for
the caller to read as it would without polygate, with the verdict in
``response.extensions["polygate_verdict"]``. Every other verdict
(``retry_exhausted``, ``circuit_open``, ``stalled``, ``deadline_exceeded``...)
is raised: a ``polygate.CallFailedError`` subclass, with the last attempt in
``last_result``. (The Go SDK's Transport answers the same way.)

There must be one retry layer, the sidecar's: turn the provider SDK's own
retries off (``max_retries=0`` in ``openai``). A request that says it is an
SDK's retry (the ``x-stainless-retry-count`` header of the openai and
anthropic SDKs above 0) makes the transport warn once with
``ProviderRetryWarning``; make it an error with
``warnings.simplefilter("error", polygate.transport.ProviderRetryWarning)``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import httpx

from polygate._classify import classify, total_tokens
from polygate._client import AsyncClient, Client
from polygate._errors import CallFailedError, NonRetryableError
from polygate._types import Grant, Outcome, Result

__all__ = ["AsyncPolygateTransport", "PolygateTransport", "ProviderRetryWarning"]

VERDICT_EXTENSION = "polygate_verdict"
_RETRY_HEADER = "x-stainless-retry-count"


class ProviderRetryWarning(UserWarning):
    """A provider SDK retried a request that the sidecar already governs:
    two retry layers. Turn the SDK's retries off (``max_retries=0``)."""


class _Governor:
    """What both transports share: the request for a grant, the attempt's
    Result, the answer to a verdict, the check for provider retries."""

    def __init__(
        self,
        scope: str,
        estimated_tokens: int | Callable[[httpx.Request], int],
        deadline: float | None,
        base_url: str | None,
        attribute: str,
        prepare: Callable[[httpx.Request, Grant], None] | None,
    ) -> None:
        self.scope = scope
        self._estimate = estimated_tokens
        self.deadline = deadline
        self._base_url = None if base_url is None else str(httpx.URL(base_url)).rstrip("/")
        self._attribute = attribute
        self._prepare = prepare
        self._warned = False

    def check(self, request: httpx.Request) -> int:
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
                stacklevel=4,
            )
        return self._estimate(request) if callable(self._estimate) else self._estimate

    def request(self, request: httpx.Request, grant: Grant) -> httpx.Request:
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
        out = httpx.Request(
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
    def must_read(response: httpx.Response) -> bool:
        """A response's body is read to classify it, unless it is a 2xx that
        is not JSON (a stream, a file), which is passed through unread."""
        if not 200 <= response.status_code <= 299:
            return True
        return "json" in response.headers.get("content-type", "").lower()

    @staticmethod
    def result(response: httpx.Response, read: bool) -> Result[httpx.Response]:
        body = response.content if read else b""
        outcome, hint = classify(response.status_code, response.headers.multi_items(), body)
        tokens = total_tokens(body) if outcome == Outcome.SUCCESS and read else None
        return Result(outcome, retry_after_s=hint, http_status=response.status_code, actual_tokens=tokens, value=response)

    @staticmethod
    def verdict(err: CallFailedError) -> httpx.Response:
        """The answer to a verdict: for non_retryable, the last attempt's
        response (a 400 is the caller's to read); any other verdict raised."""
        last = err.last_result
        if not isinstance(err, NonRetryableError) or last is None or not isinstance(last.value, httpx.Response):
            raise err
        response = last.value
        response.extensions = {**response.extensions, VERDICT_EXTENSION: err}
        return response


class PolygateTransport(httpx.BaseTransport):
    """Governs every request of an ``httpx.Client`` as one call of
    ``scope`` (see the module's documentation).

    ``client``: the polygate Client (the caller closes it). ``inner``: the
    transport that sends the attempts (default ``httpx.HTTPTransport()``,
    closed with this one). ``estimated_tokens``: a number, or a function of
    the request, for the scope's TPM quota. ``deadline``: each call's budget
    in seconds. ``base_url``: the part of request URLs replaced by the
    source's (default: scheme, host and port). ``attribute``: the source
    attribute that holds its base URL. ``prepare(request, grant)``: called
    on each attempt's request before it is sent, e.g. to set the granted
    source's API key."""

    def __init__(
        self,
        client: Client,
        scope: str,
        *,
        inner: httpx.BaseTransport | None = None,
        estimated_tokens: int | Callable[[httpx.Request], int] = 0,
        deadline: float | None = None,
        base_url: str | None = None,
        attribute: str = "base_url",
        prepare: Callable[[httpx.Request, Grant], None] | None = None,
    ) -> None:
        self._client = client
        self._inner = inner if inner is not None else httpx.HTTPTransport()
        self._gov = _Governor(scope, estimated_tokens, deadline, base_url, attribute, prepare)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        tokens = self._gov.check(request)
        request.read()

        def attempt(grant: Grant) -> Result[httpx.Response]:
            req = self._gov.request(request, grant)
            try:
                response = self._inner.handle_request(req)
            except httpx.RequestError as exc:
                return Result.from_exception(exc)
            read = self._gov.must_read(response)
            if read:
                try:
                    response.read()
                except httpx.RequestError as exc:
                    response.close()
                    return Result.from_exception(exc)
            return self._gov.result(response, read)

        try:
            return self._client.call(self._gov.scope, attempt, estimated_tokens=tokens, deadline=self._gov.deadline)
        except CallFailedError as err:
            return self._gov.verdict(err)

    def close(self) -> None:
        self._inner.close()


class AsyncPolygateTransport(httpx.AsyncBaseTransport):
    """PolygateTransport for an ``httpx.AsyncClient``, with a polygate
    AsyncClient; ``inner`` defaults to ``httpx.AsyncHTTPTransport()``.
    Cancelling the request's task reports the attempt CANCELLED."""

    def __init__(
        self,
        client: AsyncClient,
        scope: str,
        *,
        inner: httpx.AsyncBaseTransport | None = None,
        estimated_tokens: int | Callable[[httpx.Request], int] = 0,
        deadline: float | None = None,
        base_url: str | None = None,
        attribute: str = "base_url",
        prepare: Callable[[httpx.Request, Grant], None] | None = None,
    ) -> None:
        self._client = client
        self._inner = inner if inner is not None else httpx.AsyncHTTPTransport()
        self._gov = _Governor(scope, estimated_tokens, deadline, base_url, attribute, prepare)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        tokens = self._gov.check(request)
        await request.aread()

        async def attempt(grant: Grant) -> Result[httpx.Response]:
            req = self._gov.request(request, grant)
            try:
                response = await self._inner.handle_async_request(req)
            except httpx.RequestError as exc:
                return Result.from_exception(exc)
            read = self._gov.must_read(response)
            if read:
                try:
                    await response.aread()
                except httpx.RequestError as exc:
                    await response.aclose()
                    return Result.from_exception(exc)
            return self._gov.result(response, read)

        try:
            return await self._client.call(self._gov.scope, attempt, estimated_tokens=tokens, deadline=self._gov.deadline)
        except CallFailedError as err:
            return self._gov.verdict(err)

    async def aclose(self) -> None:
        await self._inner.aclose()

