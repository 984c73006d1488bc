"""Client and AsyncClient: thin drivers of the call loop (polygate._loop)
over the generated stubs, one blocking, one asyncio."""

from __future__ import annotations

import asyncio
import inspect
import ipaddress
import os
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc
import grpc.aio

from polygate._errors import PolygateError
from polygate._gen.polygate.admission.v1 import admission_pb2_grpc as pb_grpc
from polygate._loop import Attempt, CallLoop, Rpc, Step
from polygate._tracing import tracer
from polygate._types import Grant, Result
from polygate._unavailable import Fallback, OnSidecarUnavailable, SidecarWatch, mode_of

ENV_ADDR = "POLYGATE_ADDR"
"""The sidecar's address when a client is given no target (nor channel)."""
ENV_TOKEN = "POLYGATE_TOKEN"
"""The bearer token when a client is given none (token=None)."""

T = TypeVar("T")


@dataclass(frozen=True)
class TLS:
    """TLS to the sidecar: ``ca_file`` (PEM roots that verify the sidecar;
    None for the system's), ``cert_file`` and ``key_file`` (PEM client
    certificate and key, for mTLS; both or neither), ``server_name`` (the
    name the sidecar's certificate is checked against, when it is not the
    target's host)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        """The channel credentials, with the files read now."""
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError(f"TLS: cert_file ({self.cert_file!r}) and key_file ({self.key_file!r}) go together: give both or neither")

        def read(field: str, path: str | None) -> bytes | None:
            if path is None:
                return None
            try:
                return Path(path).read_bytes()
            except OSError as exc:
                raise ValueError(f"TLS: {field} {path!r} cannot be read: {exc.strerror}") from None

        return grpc.ssl_channel_credentials(
            root_certificates=read("ca_file", self.ca_file),
            private_key=read("key_file", self.key_file),
            certificate_chain=read("cert_file", self.cert_file),
        )


def is_local(target: str) -> bool:
    """Whether a gRPC target is a unix socket or a loopback address
    (``localhost``, 127.0.0.0/8, ``[::1]``), where plaintext is the default."""
    t = target.strip()
    if t.startswith(("unix:", "unix-abstract:")):
        return True
    for prefix in ("dns:///", "dns:", "ipv4:", "ipv6:", "passthrough:///"):
        if t.startswith(prefix):
            t = t[len(prefix) :]
            break
    if t.startswith("["):
        host = t[1 : t.find("]")] if "]" in t else t[1:]
    elif t.count(":") > 1:
        host = t  # a bare IPv6 address
    else:
        host = t.rsplit(":", 1)[0] if ":" in t else t
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _RpcFailed(Exception):
    """An RPC's failure, as the SDK's exception, on its way from a driver's
    step back into the call loop (which decides what it means)."""

    def __init__(self, error: PolygateError) -> None:
        self.error = error


def _target(target: str, channel: object, what: str) -> str:
    if channel is not None or target:
        return target
    target = os.environ.get(ENV_ADDR, "").strip()
    if not target:
        raise ValueError(f"{what} needs a target, a channel or ${ENV_ADDR}")
    return target


def _metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    where = "token"
    if token is None:
        token, where = os.environ.get(ENV_TOKEN, "").strip(), f"${ENV_TOKEN}"
    if not token:
        return ()
    if not all(0x21 <= ord(c) <= 0x7E for c in token):
        raise ValueError(f"{where}: only printable ASCII without spaces is allowed in a bearer token")
    return (("authorization", f"Bearer {token}"),)


def _channel_args(target: str, tls: TLS | bool | None, options: Sequence[tuple[str, Any]]) -> tuple[grpc.ChannelCredentials | None, list[tuple[str, Any]]]:
    """The credentials of a channel to target (None: plaintext) and its options."""
    opts = list(options)
    if tls is None:
        tls = not is_local(target)
    if tls is False:
        return None, opts
    cfg = TLS() if tls is True else tls
    if cfg.server_name:
        opts.append(("grpc.ssl_target_name_override", cfg.server_name))
    return cfg.credentials(), opts


class Client:
    """A blocking client of the polygate sidecar at ``target`` (``host:port``
    or ``unix:///path``), or over a ``channel`` the caller owns.

    ``token``: every RPC carries ``authorization: Bearer <token>``.
    ``tls``: None (the default) is plaintext to a unix socket or a loopback
    address and TLS with the system's roots to anything else; ``True`` is
    TLS with the system's roots; ``False`` plaintext; a ``TLS`` its files.
    ``tracer_provider``: the OpenTelemetry provider of the call and attempt
    spans (None: the global one); every RPC carries the current span's trace
    context. Without opentelemetry-api installed, no spans.
    With no target and no channel, the target is ``$POLYGATE_ADDR``; with
    ``token=None``, the token is ``$POLYGATE_TOKEN`` (if set and not empty).
    ``on_sidecar_unavailable``: what a call does when the sidecar cannot be
    reached: ``"fail"`` raises UnavailableError; ``"allow"`` makes the
    call's attempt directly, ungoverned, on the source the scope's calls
    last began on, or else on ``fallback[scope]`` (a Fallback), and counts it
    (``ungoverned_attempts``); None reads ``$POLYGATE_ON_SIDECAR_UNAVAILABLE``,
    else ``"fail"``.
    Safe to share between threads; close it (or use ``with``)."""

    def __init__(
        self,
        target: str = "",
        token: str | None = None,
        *,
        tls: TLS | bool | None = None,
        channel: grpc.Channel | None = None,
        options: Sequence[tuple[str, Any]] = (),
        priority: int = 0,
        tenant: str = "",
        tracer_provider: Any = None,
        on_sidecar_unavailable: OnSidecarUnavailable | None = None,
        fallback: Mapping[str, Fallback] | None = None,
    ) -> None:
        target = _target(target, channel, "Client")
        self._watch = SidecarWatch(mode_of(on_sidecar_unavailable), fallback or {})
        self._metadata = _metadata(token)
        self._tracer = tracer(tracer_provider)
        self._priority, self._tenant = priority, tenant
        self._own = channel is None
        if channel is None:
            creds, opts = _channel_args(target, tls, options)
            channel = grpc.insecure_channel(target, options=opts) if creds is None else grpc.secure_channel(target, creds, options=opts)
        self._channel = channel
        self._stub = pb_grpc.AdmissionServiceStub(self._channel)

    @property
    def on_sidecar_unavailable(self) -> OnSidecarUnavailable:
        """What a call does when the sidecar cannot be reached: fail or allow."""
        return self._watch.mode

    @property
    def ungoverned_attempts(self) -> int:
        """How many attempts ``allow`` made without the sidecar so far."""
        return self._watch.ungoverned_attempts

    def close(self) -> None:
        """Closes the channel the client opened."""
        if self._own:
            self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(
        self,
        scope: str,
        fn: Callable[[Grant], Result[T]],
        *,
        estimated_tokens: int = 0,
        deadline: float | None = None,
        priority: int | None = None,
        tenant: str | None = None,
    ) -> T:
        """Runs one call of ``scope``: asks the sidecar for a source, runs
        ``fn(grant)`` for the attempt, reports its Result and does what the
        sidecar answers (done, retry after a backoff, wait, or fail) until the
        call ends. Returns the ``value`` of the Result that succeeded; raises
        a CallFailedError subclass for a verdict, a SidecarError subclass for
        a gRPC error. ``deadline`` is the call's budget in seconds from now,
        capping every wait. ``priority`` (higher first) and ``tenant`` rank
        the call among callers waiting for a source's capacity; they default
        to the client's. An exception out of ``fn`` (KeyboardInterrupt
        included) or between attempts ends the call in the sidecar
        (CancelCall, which frees a held permit at once) and propagates. When
        the deadline passes while the sidecar leaves an RPC unanswered (for
        a grace of a second), the call ends the same way, with
        DeadlineExceededError."""
        loop: CallLoop[T] = CallLoop(
            scope,
            estimated_tokens,
            deadline,
            priority=self._priority if priority is None else priority,
            tenant=self._tenant if tenant is None else tenant,
            tracer=self._tracer,
            watch=self._watch,
        )
        steps = loop.run()
        answer: Any = None
        error: PolygateError | None = None
        try:
            while True:
                try:
                    step = steps.send(answer) if error is None else steps.throw(error)
                except StopIteration as stop:
                    loop.trace.end(loop.attempts, None)
                    value: T = stop.value
                    return value
                answer, error = None, None
                try:
                    answer = self._perform(loop, step, fn)
                except _RpcFailed as failed:
                    error = failed.error
        except BaseException as exc:
            self._give_up(loop)
            loop.trace.end(loop.attempts, exc)
            raise

    def _perform(self, loop: CallLoop[Any], step: Step, fn: Callable[[Grant], Any]) -> Any:
        if isinstance(step, Attempt):
            with loop.trace.attempt_context():
                return fn(step.grant)
        if isinstance(step, Rpc):
            try:
                return getattr(self._stub, step.method)(step.request, timeout=step.timeout, metadata=self._metadata + loop.trace.metadata())
            except grpc.RpcError as err:
                raise _RpcFailed(loop.rpc_error(step.method, err)) from None
        time.sleep(step.seconds)
        return None

    def _give_up(self, loop: CallLoop[Any]) -> None:
        rpc = loop.give_up()
        if rpc is None:
            return
        try:
            getattr(self._stub, rpc.method)(rpc.request, timeout=rpc.timeout, metadata=self._metadata + loop.trace.metadata())
        except grpc.RpcError:
            pass  # the permit's lease frees it; the sidecar forgets the call after calls.idle_timeout


class AsyncClient:
    """An asyncio client of the polygate sidecar (grpc.aio); see Client."""

    def __init__(
        self,
        target: str = "",
        token: str | None = None,
        *,
        tls: TLS | bool | None = None,
        channel: grpc.aio.Channel | None = None,
        options: Sequence[tuple[str, Any]] = (),
        priority: int = 0,
        tenant: str = "",
        tracer_provider: Any = None,
        on_sidecar_unavailable: OnSidecarUnavailable | None = None,
        fallback: Mapping[str, Fallback] | None = None,
    ) -> None:
        target = _target(target, channel, "AsyncClient")
        self._watch = SidecarWatch(mode_of(on_sidecar_unavailable), fallback or {})
        self._metadata = _metadata(token)
        self._tracer = tracer(tracer_provider)
        self._priority, self._tenant = priority, tenant
        self._own = channel is None
        if channel is None:
            creds, opts = _channel_args(target, tls, options)
            channel = grpc.aio.insecure_channel(target, options=opts) if creds is None else grpc.aio.secure_channel(target, creds, options=opts)
        self._channel = channel
        self._stub = pb_grpc.AdmissionServiceStub(self._channel)

    @property
    def on_sidecar_unavailable(self) -> OnSidecarUnavailable:
        """What a call does when the sidecar cannot be reached: fail or allow."""
        return self._watch.mode

    @property
    def ungoverned_attempts(self) -> int:
        """How many attempts ``allow`` made without the sidecar so far."""
        return self._watch.ungoverned_attempts

    async def close(self) -> None:
        """Closes the channel the client opened."""
        if self._own:
            await self._channel.close(None)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def call(
        self,
        scope: str,
        fn: Callable[[Grant], Awaitable[Result[T]] | Result[T]],
        *,
        estimated_tokens: int = 0,
        deadline: float | None = None,
        priority: int | None = None,
        tenant: str | None = None,
    ) -> T:
        """Client.call for asyncio; ``fn`` may be a coroutine function. When
        the task is cancelled, the call is ended in the sidecar (CancelCall,
        which frees a permit the call holds at once), then the cancellation
        propagates. The CancelCall runs on a task of its own, so that a
        second cancellation cannot cut it short."""
        loop: CallLoop[T] = CallLoop(
            scope,
            estimated_tokens,
            deadline,
            priority=self._priority if priority is None else priority,
            tenant=self._tenant if tenant is None else tenant,
            tracer=self._tracer,
            watch=self._watch,
        )
        steps = loop.run()
        answer: Any = None
        error: PolygateError | None = None
        try:
            while True:
                try:
                    step = steps.send(answer) if error is None else steps.throw(error)
                except StopIteration as stop:
                    loop.trace.end(loop.attempts, None)
                    value: T = stop.value
                    return value
                answer, error = None, None
                try:
                    answer = await self._perform(loop, step, fn)
                except _RpcFailed as failed:
                    error = failed.error
        except BaseException as exc:
            await self._give_up(loop)
            loop.trace.end(loop.attempts, exc)
            raise

    async def _perform(self, loop: CallLoop[Any], step: Step, fn: Callable[[Grant], Any]) -> Any:
        if isinstance(step, Attempt):
            with loop.trace.attempt_context():
                out = fn(step.grant)
                return await out if inspect.isawaitable(out) else out
        if isinstance(step, Rpc):
            try:
                return await getattr(self._stub, step.method)(step.request, timeout=step.timeout, metadata=self._metadata + loop.trace.metadata())
            except grpc.aio.AioRpcError as err:
                raise _RpcFailed(loop.rpc_error(step.method, err)) from None
        await asyncio.sleep(step.seconds)
        return None

    async def _give_up(self, loop: CallLoop[Any]) -> None:
        rpc = loop.give_up()
        if rpc is None:
            return
        metadata = self._metadata + loop.trace.metadata()

        async def report() -> None:
            try:
                await getattr(self._stub, rpc.method)(rpc.request, timeout=rpc.timeout, metadata=metadata)
            except grpc.aio.AioRpcError:
                pass  # the permit's lease frees it; the sidecar forgets the call after calls.idle_timeout

        try:
            await asyncio.shield(asyncio.ensure_future(report()))
        except asyncio.CancelledError:
            pass
