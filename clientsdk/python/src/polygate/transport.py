"""The httpx transports under their first name: ``polygate.httpx``. New code
imports ``polygate.httpx`` or ``polygate.httpx2`` for the HTTP library it
uses."""

from __future__ import annotations

from polygate.httpx import VERDICT_EXTENSION, AsyncPolygateTransport, PolygateTransport, ProviderRetryWarning, failure_of

__all__ = ["VERDICT_EXTENSION", "AsyncPolygateTransport", "PolygateTransport", "ProviderRetryWarning", "failure_of"]
