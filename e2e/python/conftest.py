"""Harness of the Python end-to-end tests: the real sidecar binary and the
fake upstream of e2e/upstream, both built with `go build` once per test run
(or taken from POLYGATE_SIDECAR_BIN / POLYGATE_FAKEUPSTREAM_BIN), started on
free ports and stopped when each test ends."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from polygate._gen.polygate.admission.v1 import admission_pb2 as pb
from polygate._gen.polygate.admission.v1 import admission_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 60.0
"""Bound of every wait: conditions are awaited until it, never slept for."""


@dataclass
class Binaries:
    sidecar: str
    upstream: str


@pytest.fixture(scope="session")
def binaries(tmp_path_factory: pytest.TempPathFactory) -> Binaries:
    out = tmp_path_factory.mktemp("bin")
    paths = {}
    for env, pkg, name in (
        ("POLYGATE_SIDECAR_BIN", "./cmd/sidecar", "sidecar"),
        ("POLYGATE_FAKEUPSTREAM_BIN", "./e2e/cmd/fakeupstream", "fakeupstream"),
    ):
        if os.environ.get(env):
            paths[name] = os.environ[env]
            continue
        paths[name] = str(out / name)
        subprocess.run(["go", "build", "-o", paths[name], pkg], cwd=REPO, check=True)
    return Binaries(paths["sidecar"], paths["fakeupstream"])


def _start(args: list[str], prefix: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str, list[str]]:
    """Starts a process and reads stdout until its "<prefix> ADDR" line."""
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    logs: list[str] = []
    threading.Thread(target=lambda: logs.extend(proc.stderr or []), daemon=True).start()
    found: list[str] = []

    def read() -> None:
        for line in proc.stdout or []:
            if line.startswith(prefix) and not found:
                found.append(line[len(prefix) :].strip())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + TIMEOUT
    while not found:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{args[0]} did not announce its address:\n{''.join(logs)}")
        reader.join(0.01)
    return proc, found[0], logs


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Upstream:
    """The fake provider, driven through its /_control/ API."""

    def __init__(self, url: str) -> None:
        self.url = url

    def base_url(self, route: str) -> str:
        return f"{self.url}/{route}"

    def set(self, route: str, *steps: dict[str, Any]) -> None:
        body = json.dumps({"steps": list(steps)}).encode()
        req = urllib.request.Request(f"{self.url}/_control/{route}", data=body, method="PUT")
        with urllib.request.urlopen(req, timeout=TIMEOUT):
            pass

    def requests(self, route: str, wait_count: int = 0) -> list[dict[str, Any]]:
        """The route's log (at_ms, status), after waiting for wait_count requests."""
        url = f"{self.url}/_control/{route}?wait_count={wait_count}&timeout_ms={int(TIMEOUT * 1000)}"
        with urllib.request.urlopen(url, timeout=TIMEOUT + 5) as resp:
            return list(json.load(resp)["requests"] or [])

    def count(self, route: str) -> int:
        return len(self.requests(route))


@pytest.fixture
def upstream(binaries: Binaries) -> Iterator[Upstream]:
    proc, url, _ = _start([binaries.upstream, "--exit-on-stdin-eof"], "fakeupstream listening on ")
    yield Upstream(url)
    _stop(proc)


class Sidecar:
    """A running sidecar and a raw stub for reading its state."""

    def __init__(self, addr: str, logs: list[str], proc: subprocess.Popen[str] | None = None) -> None:
        self.addr = addr
        self.logs = logs
        self._proc = proc
        self._channel = grpc.insecure_channel(addr)
        self.raw = pb_grpc.AdmissionServiceStub(self._channel)

    def source(self, scope: str, name: str) -> Any:
        d = self.raw.DescribeScope(pb.DescribeScopeRequest(scope=scope), timeout=TIMEOUT)
        return next(s for s in d.scope.sources if s.name == name)

    def live_calls(self, scope: str) -> int:
        return int(self.raw.DescribeScope(pb.DescribeScopeRequest(scope=scope), timeout=TIMEOUT).scope.live_calls)

    def retry_after(self, scope: str, *sources: str) -> float:
        r = self.raw.RetryAfter(pb.RetryAfterRequest(scope=scope, sources=list(sources)), timeout=TIMEOUT)
        return r.retry_after.seconds + r.retry_after.nanos / 1e9

    def stop(self) -> None:
        """Stops the sidecar process (a sidecar that is down)."""
        if self._proc is not None:
            _stop(self._proc)

    def close(self) -> None:
        self._channel.close()


@pytest.fixture
def start_sidecar(binaries: Binaries, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Sidecar]]:
    started: list[tuple[subprocess.Popen[str], Sidecar]] = []

    def start(config: str, env: dict[str, str] | None = None) -> Sidecar:
        """Starts the sidecar with config, and env added to the environment."""
        path = tmp_path / f"polygate-{len(started)}.yaml"
        path.write_text(config)
        proc, addr, logs = _start(
            [binaries.sidecar, "--config", str(path), "--listen", "127.0.0.1:0"], "polygate listening on ", {**os.environ, **(env or {})}
        )
        sc = Sidecar(addr, logs, proc)
        started.append((proc, sc))
        return sc

    yield start
    for proc, sc in started:
        sc.close()
        _stop(proc)
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            print("sidecar logs:\n" + "".join(sc.logs))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep


def eventually(what: str, cond: Callable[[], bool]) -> None:
    """Polls state only the sidecar can report (a breaker's state) until cond
    holds or TIMEOUT passes."""
    deadline = time.monotonic() + TIMEOUT
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {TIMEOUT}s")
        time.sleep(0.005)


def assert_spacing(what: str, reqs: list[dict[str, Any]], min_s: float) -> None:
    """Consecutive requests are at least min_s apart, less the millisecond the
    breaker's clock counts in."""
    for a, b in zip(reqs, reqs[1:]):
        gap = (b["at_ms"] - a["at_ms"]) / 1000
        assert gap >= min_s - 0.001, f"{what}: requests {a} and {b} were {gap:.3f}s apart; want at least {min_s}s"
