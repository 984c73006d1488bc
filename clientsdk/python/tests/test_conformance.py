"""The conformance kit (clientsdk/conformance): every exchange against the
Python SDK, through the httpx and httpx2 transports, blocking and asyncio,
and proof that the run fails when one expectation changes."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from conformance_kit import TIMEOUT, Kit, Mode, gives_a_call_up

import polygate.httpx
import polygate.httpx2

REPO = Path(__file__).resolve().parents[3]
EXCHANGES = REPO / "clientsdk" / "conformance" / "exchanges"
FILES = sorted(p.name for p in EXCHANGES.glob("*.json"))

MODES = [Mode(lib, transports, is_async) for lib, transports in ((httpx2, polygate.httpx2), (httpx, polygate.httpx)) for is_async in (False, True)]


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kit]:
    """The kit's fake sidecar: $POLYGATE_FAKESIDECAR_BIN, or built with go build."""
    binary = os.environ.get("POLYGATE_FAKESIDECAR_BIN")
    if not binary:
        binary = str(tmp_path_factory.mktemp("bin") / "fakesidecar")
        subprocess.run(["go", "build", "-o", binary, "./clientsdk/conformance/fakesidecar"], cwd=REPO, check=True)
    proc = subprocess.Popen([binary, "--exit-on-stdin-eof"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    found: list[str] = []

    def read() -> None:
        prefix = "fakesidecar listening on "
        for line in proc.stdout or []:
            if line.startswith(prefix) and not found:
                found.append(line[len(prefix) :].strip())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + TIMEOUT
    while not found:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("fakesidecar did not announce its address")
        reader.join(0.01)
    yield Kit(found[0])
    proc.terminate()
    proc.wait(TIMEOUT)


def test_the_kit_has_its_exchanges() -> None:
    assert len(FILES) >= 15, FILES


@pytest.mark.parametrize("mode", MODES, ids=str)
@pytest.mark.parametrize("file", FILES)
def test_every_exchange(kit: Kit, file: str, mode: Mode) -> None:
    text = (EXCHANGES / file).read_text()
    if not mode.is_async and gives_a_call_up(text):
        pytest.skip("a blocking program gives a call up only with a signal; the asyncio runs give it up")
    assert kit.run(text, mode) == []


def mutated(file: str, edit: Callable[[dict[str, Any]], None]) -> str:
    """The exchange's JSON with one expectation changed by edit."""
    ex = json.loads((EXCHANGES / file).read_text())
    edit(ex)
    return json.dumps(ex)


def app_sees(ex: dict[str, Any]) -> dict[str, Any]:
    sees: dict[str, Any] = ex["calls"][0]["app_sees"]
    return sees


# Each case changes one expectation of an exchange; the run must report it.
# A step the SDK never sends is reported however long the fake waits for it:
# that mutation's run does not wait.
MUTATIONS: list[tuple[str, str, Callable[[dict[str, Any]], Any], str, float]] = [
    ("an RPC's field", "02-retry-backoff.json", lambda ex: ex["script"][2]["request"].update(outcome="RATE_LIMITED"), "outcome = TRANSIENT, want RATE_LIMITED", TIMEOUT),
    ("the opening Pick's options", "01-grant-success.json", lambda ex: ex["script"][0]["request"].update(estimated_tokens=501), "estimated_tokens = 500, want 501", TIMEOUT),
    ("the tokens reported", "01-grant-success.json", lambda ex: ex["script"][2]["request"].update(actual_tokens=9), "actual_tokens = 8, want 9", TIMEOUT),
    ("the retry hint", "07-rate-limited-retry-after.json", lambda ex: ex["script"][2]["request"].update(retry_after_hint_ms=2000), "retry_after_hint_ms = 1000, want 2000", TIMEOUT),
    ("the source attempted", "03-failover.json", lambda ex: ex["script"][4].update(upstream="c"), "got upstream b POST /chat/completions, want upstream c", TIMEOUT),
    ("a sleep's lower bound", "04-wait.json", lambda ex: ex["script"][2].update(after_ms=10_000), "want at least 10000 ms", TIMEOUT),
    (
        "the RPC that comes next",
        "13-cancel-attempt.json",
        lambda ex: ex["script"].__setitem__(2, {"rpc": "RecordOutcome", "request": {"outcome": "CANCELLED"}, "reply": {"done": {}}}),
        "got CancelCall, want RecordOutcome",
        TIMEOUT,
    ),
    ("what the application sees", "08-dead-key.json", lambda ex: app_sees(ex)["headers"].update({"polygate-failure-reason": "circuit_open"}), 'header polygate-failure-reason = "source_dead", want "circuit_open"', TIMEOUT),
    ("a synthesized status", "06-quota-exhausted.json", lambda ex: app_sees(ex).update(status=503), "status = 429, want 503", TIMEOUT),
    ("an error the application sees", "16-sidecar-down-fail.json", lambda ex: ex["calls"][0].update(app_sees={"error": "aborted"}), "want the aborted error", TIMEOUT),
    ("a step that never comes", "12-deadline-silent.json", lambda ex: ex["script"].append({"rpc": "Pick", "reply": {"hang": True}}), "step 3 (Pick): never came", 0),
]


@pytest.mark.parametrize("mode", MODES[:2], ids=str)
@pytest.mark.parametrize(("what", "file", "edit", "want", "wait"), MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_a_changed_expectation_fails_the_run(kit: Kit, mode: Mode, what: str, file: str, edit: Callable[[dict[str, Any]], None], want: str, wait: float) -> None:
    text = mutated(file, edit)
    if not mode.is_async and gives_a_call_up(text):
        pytest.skip("a blocking program gives a call up only with a signal; the asyncio run gives it up")
    problems = kit.run(text, mode, wait)
    assert any(want in p for p in problems), f"{what}: want a difference with {want!r}, got {problems}"
