"""What a client does when the sidecar cannot be reached: ``fail`` (raise
UnavailableError) or ``allow`` (make the call's attempt directly on a source
the client knows, ungoverned), and the memory that ``allow`` needs: the
source each scope's calls last began on, whether an outage is on (logged once
per outage) and how many attempts went ungoverned."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from polygate._errors import SidecarError, UnavailableError
from polygate._types import Grant

OnSidecarUnavailable = Literal["fail", "allow"]
MODES: tuple[OnSidecarUnavailable, ...] = ("fail", "allow")
ENV_MODE = "POLYGATE_ON_SIDECAR_UNAVAILABLE"

log = logging.getLogger("polygate")


@dataclass(frozen=True)
class Fallback:
    """The source an ``allow`` client calls directly for a scope while the
    sidecar is unreachable and no call of the scope was granted a source yet:
    its name (``Grant.source``, e.g. for ``prepare`` to pick its API key), its
    attributes (``base_url``...) and its timeout."""

    source: str
    attributes: Mapping[str, str] = field(default_factory=dict)
    timeout_s: float = 0.0


def mode_of(given: str | None) -> OnSidecarUnavailable:
    """The mode given, else $POLYGATE_ON_SIDECAR_UNAVAILABLE, else fail."""
    where = "on_sidecar_unavailable"
    if given is None:
        given, where = os.environ.get(ENV_MODE, "") or "fail", f"${ENV_MODE}"
    for m in MODES:
        if given == m:
            return m
    raise ValueError(f"{where}: {given[:50]!r} is not allowed: fail or allow")


def is_unreachable(err: BaseException) -> bool:
    """Whether a sidecar error means the sidecar could not be reached: gRPC
    UNAVAILABLE without the sidecar's own ErrorInfo. (The sidecar's own
    UNAVAILABLE, a shared backend down under a fail-closed scope, carries
    ERROR_REASON_BACKEND_UNAVAILABLE: that is the operator's decision, never
    bypassed.)"""
    return isinstance(err, UnavailableError) and not err.reason


class SidecarWatch:
    """One client's view of the sidecar's reachability; thread-safe."""

    def __init__(self, mode: OnSidecarUnavailable, fallbacks: Mapping[str, Fallback]) -> None:
        self.mode = mode
        self._fallbacks = dict(fallbacks)
        self._first: dict[str, Grant] = {}
        self._lock = threading.Lock()
        self._down = False
        self._ungoverned = 0

    @property
    def ungoverned_attempts(self) -> int:
        with self._lock:
            return self._ungoverned

    def began(self, scope: str, grant: Grant) -> None:
        """A call of scope was granted its first attempt on grant's source."""
        if grant.attempt <= 1:
            with self._lock:
                self._first[scope] = grant

    def answered(self) -> None:
        """The sidecar answered an RPC: an outage, if one was on, is over."""
        if not self._down:
            return
        with self._lock:
            was, self._down = self._down, False
            n = self._ungoverned
        if was:
            log.warning("polygate: the sidecar answers again; calls are governed again (%d ungoverned attempts so far)", n)

    def lost(self, err: SidecarError) -> None:
        """An RPC found the sidecar unreachable; the first of an outage logs."""
        with self._lock:
            was, self._down = self._down, True
        if not was and self.mode == "allow":
            log.warning(
                "polygate: the sidecar is unreachable (%s); on_sidecar_unavailable=allow: attempts go directly to the source "
                "each scope's calls last began on, ungoverned, until it answers again",
                err.details[:200],
            )

    def fallback(self, scope: str) -> Grant | None:
        """The direct attempt's grant for scope: the source its calls last
        began on, else the configured fallback, else None. Its call_id and
        permit_id are empty: no sidecar governs it."""
        with self._lock:
            g = self._first.get(scope)
            f = self._fallbacks.get(scope)
        if g is not None:
            return Grant("", g.source, dict(g.attributes), 1, False, g.timeout_s, "")
        if f is not None:
            return Grant("", f.source, dict(f.attributes), 1, False, f.timeout_s, "")
        return None

    def count(self) -> None:
        with self._lock:
            self._ungoverned += 1
