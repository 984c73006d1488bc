"""TLS, mTLS and the bearer token, against an in-process gRPC server that
plays the sidecar (certificates from trustme)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import trustme

import polygate
from polygate._client import _channel_args, is_local
from polygate._gen.polygate.admission.v1 import admission_pb2 as pb
from polygate._gen.polygate.admission.v1 import admission_pb2_grpc as pb_grpc


class Sidecar(pb_grpc.AdmissionServiceServicer):
    """Grants one source and answers Done; records the metadata it saw."""

    def __init__(self) -> None:
        self.tokens: list[str] = []

    def Pick(self, request: pb.PickRequest, context: Any) -> pb.PickResponse:
        self.tokens.append(dict(context.invocation_metadata()).get("authorization", ""))
        return pb.PickResponse(call_id="c1", grant=pb.Grant(source="only", permit_id="p1", attempt=1))

    def RecordOutcome(self, request: pb.RecordOutcomeRequest, context: Any) -> pb.RecordOutcomeResponse:
        return pb.RecordOutcomeResponse(done=pb.Done())


@dataclass
class Server:
    port: int
    servicer: Sidecar
    ca: Path
    client_cert: Path
    client_key: Path
    mtls: bool


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.fixture(params=[False, True], ids=["tls", "mtls"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Server]:
    ca = trustme.CA()
    cert = ca.issue_cert("localhost")
    client = ca.issue_cert("app@polygate.test")
    creds = grpc.ssl_server_credentials(
        [(cert.private_key_pem.bytes(), b"".join(b.bytes() for b in cert.cert_chain_pems))],
        root_certificates=ca.cert_pem.bytes() if request.param else None,
        require_client_auth=request.param,
    )
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = Sidecar()
    pb_grpc.add_AdmissionServiceServicer_to_server(servicer, srv)
    port = srv.add_secure_port("localhost:0", creds)
    srv.start()
    yield Server(
        port,
        servicer,
        write(tmp_path / "ca.pem", ca.cert_pem.bytes()),
        write(tmp_path / "client.pem", b"".join(b.bytes() for b in client.cert_chain_pems)),
        write(tmp_path / "client.key", client.private_key_pem.bytes()),
        request.param,
    )
    srv.stop(None)


def ok(g: polygate.Grant) -> polygate.Result[str]:
    return polygate.Result(polygate.Outcome.SUCCESS, value=g.source)


def test_tls_with_token(server: Server) -> None:
    tls = polygate.TLS(ca_file=str(server.ca), cert_file=str(server.client_cert), key_file=str(server.client_key))
    with polygate.Client(f"localhost:{server.port}", token="s3cret", tls=tls) as c:
        assert c.call("chat", ok, deadline=10) == "only"
    assert server.servicer.tokens == ["Bearer s3cret"]


async def test_async_tls_with_token(server: Server) -> None:
    tls = polygate.TLS(ca_file=str(server.ca), cert_file=str(server.client_cert), key_file=str(server.client_key))
    async with polygate.AsyncClient(f"localhost:{server.port}", token="s3cret", tls=tls) as c:
        assert await c.call("chat", ok, deadline=10) == "only"
    assert server.servicer.tokens == ["Bearer s3cret"]


def test_refused_without_the_right_credentials(server: Server, tmp_path: Path) -> None:
    attempts: list[polygate.TLS | bool] = [False, polygate.TLS(ca_file=str(write(tmp_path / "other.pem", trustme.CA().cert_pem.bytes())))]
    if server.mtls:
        attempts.append(polygate.TLS(ca_file=str(server.ca)))  # no client certificate
    for tls in attempts:
        with polygate.Client(f"localhost:{server.port}", tls=tls) as c:
            with pytest.raises(polygate.UnavailableError):
                c.call("chat", ok, deadline=5)
    assert server.servicer.tokens == []


@pytest.mark.parametrize(
    ("target", "local"),
    [
        ("127.0.0.1:50051", True),
        ("127.3.2.1:1", True),
        ("localhost:50051", True),
        ("LOCALHOST:1", True),
        ("[::1]:50051", True),
        ("ipv4:127.0.0.1:1", True),
        ("dns:///localhost:1", True),
        ("unix:///run/polygate.sock", True),
        ("unix:relative.sock", True),
        ("sidecar:50051", False),
        ("10.0.0.1:50051", False),
        ("[2001:db8::1]:1", False),
        ("dns:///polygate.internal:443", False),
        ("localhost.evil.test:1", False),
    ],
)
def test_plaintext_only_by_default_on_loopback_and_unix(target: str, local: bool) -> None:
    assert is_local(target) == local
    creds, _ = _channel_args(target, None, ())
    assert (creds is None) == local


def test_tls_options() -> None:
    creds, opts = _channel_args("sidecar:1", polygate.TLS(server_name="polygate.internal"), [("grpc.max_send_message_length", 1)])
    assert creds is not None and ("grpc.ssl_target_name_override", "polygate.internal") in opts
    assert _channel_args("sidecar:1", False, ())[0] is None
    assert _channel_args("127.0.0.1:1", True, ())[0] is not None
    with pytest.raises(ValueError, match="cert_file .* and key_file .* go together"):
        polygate.TLS(cert_file="c.pem").credentials()
    with pytest.raises(ValueError, match="ca_file '/nonexistent/ca.pem' cannot be read"):
        polygate.TLS(ca_file="/nonexistent/ca.pem").credentials()


@pytest.mark.parametrize("token", ["a b", "line\nbreak", "caf\u00e9"])
def test_token_must_fit_a_header(token: str) -> None:
    with pytest.raises(ValueError, match="token"):
        polygate.Client("127.0.0.1:1", token=token)
