"""A sidecar that cannot be reached: the call loop's decisions under ``fail``
and ``allow`` (step by step, no sidecar), and the client's defaults from the
environment."""

from __future__ import annotations

import logging
from collections.abc import Generator
from typing import Any

import grpc
import pytest

import polygate
from polygate._client import _metadata
from polygate._gen.polygate.admission.v1 import admission_pb2 as pb
from polygate._loop import Attempt, CallLoop, Rpc, Step
from polygate._unavailable import SidecarWatch, mode_of

DOWN = polygate.UnavailableError("Pick", grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")
BACKEND = polygate.UnavailableError("Pick", grpc.StatusCode.UNAVAILABLE, "redis", "ERROR_REASON_BACKEND_UNAVAILABLE")


def grant(source: str = "a", attempt: int = 1) -> pb.PickResponse:
    g = pb.Grant(source=source, permit_id="p1", attempt=attempt, attributes={"base_url": f"http://{source}"})
    g.timeout.FromMilliseconds(5000)
    return pb.PickResponse(call_id="c1", grant=g)


def done() -> pb.RecordOutcomeResponse:
    return pb.RecordOutcomeResponse(done=pb.Done())


def ok(value: Any = "answer") -> polygate.Result[Any]:
    return polygate.Result(polygate.Outcome.SUCCESS, value=value)


def finish(gen: Generator[Step, Any, Any], answer: Any = None, throw: BaseException | None = None) -> Any:
    with pytest.raises(StopIteration) as stop:
        gen.throw(throw) if throw is not None else gen.send(answer)
    return stop.value.value


def governed_call(watch: SidecarWatch, source: str = "a") -> None:
    """One call that the sidecar grants on source and that succeeds."""
    gen = CallLoop[str]("chat", watch=watch).run()
    next(gen)
    gen.send(grant(source))
    gen.send(ok())
    assert finish(gen, done()) == "answer"


def test_fail_raises_the_unavailable_error() -> None:
    watch = SidecarWatch("fail", {})
    governed_call(watch)
    gen = CallLoop[str]("chat", watch=watch).run()
    assert isinstance(next(gen), Rpc)
    with pytest.raises(polygate.UnavailableError) as info:
        gen.throw(DOWN)
    assert info.value is DOWN and watch.ungoverned_attempts == 0


def test_allow_attempts_on_the_source_the_last_call_began_on(caplog: pytest.LogCaptureFixture) -> None:
    watch = SidecarWatch("allow", {"chat": polygate.Fallback("configured", {"base_url": "http://configured"})})
    governed_call(watch, "b")
    caplog.set_level(logging.WARNING, "polygate")
    for n in (1, 2):
        loop = CallLoop[str]("chat", watch=watch)
        gen = loop.run()
        next(gen)
        s = gen.throw(DOWN)
        assert isinstance(s, Attempt)
        assert (s.grant.source, s.grant.attributes, s.grant.call_id, s.grant.permit_id, s.grant.timeout_s) == ("b", {"base_url": "http://b"}, "", "", 5.0)
        assert finish(gen, ok(f"direct {n}")) == f"direct {n}"
        assert loop.give_up() is None, "nothing to tell a sidecar that is not there"
    assert watch.ungoverned_attempts == 2
    assert len([r for r in caplog.records if "unreachable" in r.getMessage()]) == 1, "logged once per outage"
    governed_call(watch, "a")
    assert any("answers again" in r.getMessage() and "2 ungoverned" in r.getMessage() for r in caplog.records)


def test_allow_falls_back_to_the_configured_source_then_raises_a_failed_attempts_error() -> None:
    watch = SidecarWatch("allow", {"chat": polygate.Fallback("configured", {"base_url": "http://configured"}, 7.0)})
    gen = CallLoop[str]("chat", watch=watch).run()
    next(gen)
    s = gen.throw(DOWN)
    assert isinstance(s, Attempt) and (s.grant.source, s.grant.timeout_s) == ("configured", 7.0)
    with pytest.raises(polygate.UnavailableError):
        gen.send(polygate.Result(polygate.Outcome.TRANSIENT, http_status=503))
    assert watch.ungoverned_attempts == 1


def test_allow_without_a_source_to_fall_back_on_raises() -> None:
    gen = CallLoop[str]("chat", watch=SidecarWatch("allow", {})).run()
    next(gen)
    with pytest.raises(polygate.UnavailableError):
        gen.throw(DOWN)


def test_allow_never_bypasses_the_sidecars_own_unavailable() -> None:
    watch = SidecarWatch("allow", {"chat": polygate.Fallback("f", {"base_url": "http://f"})})
    gen = CallLoop[str]("chat", watch=watch).run()
    next(gen)
    with pytest.raises(polygate.UnavailableError) as info:
        gen.throw(BACKEND)
    assert info.value is BACKEND and watch.ungoverned_attempts == 0


def test_allow_keeps_an_attempt_made_before_the_sidecar_went_away() -> None:
    watch = SidecarWatch("allow", {"chat": polygate.Fallback("f", {"base_url": "http://f"})})
    for result, returns in ((ok("made"), True), (polygate.Result(polygate.Outcome.SOURCE_DEAD, http_status=401, value="401"), False)):
        gen = CallLoop[str]("chat", watch=watch).run()
        next(gen)
        gen.send(grant())
        assert isinstance(gen.send(result), Rpc)  # RecordOutcome, which fails
        if returns:
            assert finish(gen, throw=DOWN) == "made", "the upstream did the work"
        else:
            with pytest.raises(polygate.UnavailableError):
                gen.throw(DOWN)
    assert watch.ungoverned_attempts == 0, "no attempt was made without the sidecar"


def test_mode_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POLYGATE_ON_SIDECAR_UNAVAILABLE", raising=False)
    assert mode_of(None) == "fail"
    monkeypatch.setenv("POLYGATE_ON_SIDECAR_UNAVAILABLE", "allow")
    assert mode_of(None) == "allow" and mode_of("fail") == "fail"
    monkeypatch.setenv("POLYGATE_ON_SIDECAR_UNAVAILABLE", "open")
    with pytest.raises(ValueError, match=r"\$POLYGATE_ON_SIDECAR_UNAVAILABLE: 'open' is not allowed: fail or allow"):
        mode_of(None)
    with pytest.raises(ValueError, match="on_sidecar_unavailable: 'deny' is not allowed"):
        polygate.Client("127.0.0.1:1", on_sidecar_unavailable="deny")  # type: ignore[arg-type]


def test_address_and_token_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POLYGATE_ADDR", raising=False)
    monkeypatch.delenv("POLYGATE_TOKEN", raising=False)
    with pytest.raises(ValueError, match=r"needs a target, a channel or \$POLYGATE_ADDR"):
        polygate.Client()
    assert _metadata(None) == ()
    monkeypatch.setenv("POLYGATE_ADDR", "127.0.0.1:1")
    monkeypatch.setenv("POLYGATE_TOKEN", "t0k")
    polygate.Client().close()
    assert _metadata(None) == (("authorization", "Bearer t0k"),)
    assert _metadata("given") == (("authorization", "Bearer given"),), "a token given wins"
    assert _metadata("") == (), "an empty token given means none"
    monkeypatch.setenv("POLYGATE_TOKEN", "two words")
    with pytest.raises(ValueError, match=r"\$POLYGATE_TOKEN: only printable ASCII"):
        _metadata(None)
