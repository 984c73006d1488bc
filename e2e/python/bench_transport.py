"""Per-request cost of PolygateTransport over plain httpx, against the fake
upstream (a benchmark, not a test: pytest does not collect it).

    go build -o /tmp/sidecar ./cmd/sidecar && go build -o /tmp/fakeupstream ./e2e/cmd/fakeupstream
    .venv/bin/python e2e/python/bench_transport.py /tmp/sidecar /tmp/fakeupstream 1000
"""

import statistics
import subprocess
import sys
import tempfile
import time

import httpx

import polygate
from polygate.transport import PolygateTransport

SIDECAR, UPSTREAM = sys.argv[1], sys.argv[2]
CONFIG = tempfile.mkstemp(suffix=".yaml")[1]


def start(args, prefix):
    p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    for line in p.stdout:
        if line.startswith(prefix): return p, line[len(prefix):].strip()
up, url = start([UPSTREAM, "--exit-on-stdin-eof"], "fakeupstream listening on ")
open(CONFIG,"w").write(f'scopes:\n  chat:\n    sources:\n      - {{name: a, timeout: 5s, attributes: {{base_url: "{url}/a"}}}}\n')
sc, addr = start([SIDECAR, "--config", CONFIG, "--listen", "127.0.0.1:0"], "polygate listening on ")
N = int(sys.argv[3]) if len(sys.argv) > 3 else 500
try:
    with httpx.Client() as plain, polygate.Client(addr) as pg, httpx.Client(transport=PolygateTransport(pg, "chat")) as gov:
        for name, do in (("plain httpx", lambda: plain.post(url + "/a/v1/chat/completions", json={"m": 1})), ("PolygateTransport", lambda: gov.post("http://polygate.invalid/v1/chat/completions", json={"m": 1}))):
            for _ in range(50): do()
            ts = []
            for _ in range(N):
                t = time.perf_counter(); r = do(); ts.append(time.perf_counter() - t); assert r.status_code == 200
            ts.sort()
            print(f"{name:18s} n={N} median={statistics.median(ts)*1e3:.3f} ms p99={ts[int(N*0.99)]*1e3:.3f} ms")
finally:
    sc.terminate(); up.terminate(); sc.wait(); up.wait()
