"""Transports that govern every request of an ``httpx.Client`` (or
``httpx.AsyncClient``) with the sidecar, so that a provider SDK built on
httpx (``openai`` 2.x) is governed with one line::

    http = httpx.Client(transport=PolygateTransport(client, "chat"))
    llm = openai.OpenAI(base_url="http://polygate/v1", api_key=..., http_client=http, max_retries=0)

``polygate.httpx2`` is the same for httpx2 (``openai`` 3.x); both are one
implementation (``polygate._transport``), documented in the package README:
each request is one call of the scope, sent to each granted source in turn;
the client gets the upstream's own response, or one synthesized for
polygate's verdict when no upstream answered, never a connection error for a
verdict.
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

from polygate._client import AsyncClient, Client
from polygate._transport import VERDICT_EXTENSION, Flavour, Governor, ProviderRetryWarning, failure_of
from polygate._types import Grant

__all__ = ["VERDICT_EXTENSION", "AsyncPolygateTransport", "PolygateTransport", "ProviderRetryWarning", "failure_of"]

FLAVOUR: Flavour[httpx.Request, httpx.Response] = Flavour("httpx", httpx.Request, httpx.Response, httpx.RequestError, lambda s: str(httpx.URL(s)))


class PolygateTransport(httpx.BaseTransport):
    """Governs every request of an ``httpx.Client`` as one call of
    ``scope``.

    ``client``: the polygate Client (the caller closes it). ``inner``: the
    transport that sends the attempts (default ``httpx.HTTPTransport()``,
    closed with this one). ``estimated_tokens``: a number, or a function of
    the request, for the scope's TPM quota. ``deadline``: each call's budget
    in seconds. ``priority`` and ``tenant``: each call's rank among callers
    waiting for a source's capacity (default: the client's). ``base_url``:
    the part of request URLs replaced by the source's (default: scheme, host
    and port). ``attribute``: the source attribute that holds its base URL.
    ``prepare(request, grant)``: called on each attempt's request before it
    is sent, e.g. to set the granted source's API key."""

    def __init__(
        self,
        client: Client,
        scope: str,
        *,
        inner: httpx.BaseTransport | None = None,
        estimated_tokens: int | Callable[[httpx.Request], int] = 0,
        deadline: float | None = None,
        priority: int | None = None,
        tenant: str | None = None,
        base_url: str | None = None,
        attribute: str = "base_url",
        prepare: Callable[[httpx.Request, Grant], None] | None = None,
    ) -> None:
        self._client = client
        self._inner = inner if inner is not None else httpx.HTTPTransport()
        self._gov = Governor(FLAVOUR, scope, estimated_tokens, deadline, base_url, attribute, prepare, priority, tenant)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()
        return self._gov.handle(self._client, request, self._inner.handle_request, httpx.Response.read, httpx.Response.close)

    def close(self) -> None:
        self._inner.close()


class AsyncPolygateTransport(httpx.AsyncBaseTransport):
    """PolygateTransport for an ``httpx.AsyncClient``, with a polygate
    AsyncClient; ``inner`` defaults to ``httpx.AsyncHTTPTransport()``.
    Cancelling the request's task ends the call in the sidecar (CancelCall)."""

    def __init__(
        self,
        client: AsyncClient,
        scope: str,
        *,
        inner: httpx.AsyncBaseTransport | None = None,
        estimated_tokens: int | Callable[[httpx.Request], int] = 0,
        deadline: float | None = None,
        priority: int | None = None,
        tenant: str | None = None,
        base_url: str | None = None,
        attribute: str = "base_url",
        prepare: Callable[[httpx.Request, Grant], None] | None = None,
    ) -> None:
        self._client = client
        self._inner = inner if inner is not None else httpx.AsyncHTTPTransport()
        self._gov = Governor(FLAVOUR, scope, estimated_tokens, deadline, base_url, attribute, prepare, priority, tenant)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await request.aread()
        return await self._gov.ahandle(self._client, request, self._inner.handle_async_request, httpx.Response.aread, httpx.Response.aclose)

    async def aclose(self) -> None:
        await self._inner.aclose()
