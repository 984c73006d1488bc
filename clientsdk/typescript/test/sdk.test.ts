// What the governed fetch and the client do beyond the conformance kit's
// exchanges: URLs, per-source preparation, timeouts, bounds, options read
// from the environment, errors, spans. Scripts run on the kit's fake sidecar.

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";

import * as otel from "@opentelemetry/api";
import { createGrpcTransport } from "@connectrpc/connect-node";

import { millis, secondsText, statusFor } from "../src/answer.js";
import { isLoopback } from "../src/connection.js";
import { AttemptTimeoutError } from "../src/loop.js";
import {
  CircuitOpenError,
  Client,
  classifyError,
  InvalidArgumentError,
  UnavailableError,
  governedFetch,
  type ClientOptions,
  type GovernedFetchOptions,
} from "../src/index.js";
import { Kit, type Endpoints } from "./kit.js";

let kit: Kit;

before(async () => {
  kit = await Kit.start();
});

after(async () => {
  await kit?.stop();
});

const REQUEST = { method: "POST", path: "/x", headers: {}, body: "" };

/** Serves a script on the fake: steps only; the application's side is the test's. */
async function script(...steps: unknown[]): Promise<Endpoints> {
  return kit.begin(JSON.stringify({ name: "sdk", calls: [{ request: REQUEST, app_sees: { status: 200 } }], script: steps }));
}

/** The fake's mismatches once every step came. */
async function mismatches(): Promise<string[]> {
  return (await kit.result()).mismatches;
}

function client(ep: Endpoints, options: ClientOptions = {}): Client {
  return new Client({ addr: ep.sidecar, token: "", tracerProvider: null, log: () => {}, ...options });
}

async function governed(ep: Endpoints, url: string, init: RequestInit = {}, options: GovernedFetchOptions = {}): Promise<Response> {
  const pg = client(ep);
  try {
    return await governedFetch(pg, "chat", options)(url, init);
  } finally {
    pg.close();
  }
}

const grant = (source: string, extra: Record<string, unknown> = {}) => ({ rpc: "Pick", request: { opens: true }, reply: { grant: { source, ...extra } } });
const success = { rpc: "RecordOutcome", request: { outcome: "SUCCESS", http_status: 200, actual_tokens: 8 }, reply: { done: {} } };

describe("the governed fetch", () => {
  it("replaces the request URL's baseUrl with the source's, keeping the query", async () => {
    const ep = await script(grant("a"), { upstream: "a", request: { method: "GET", path: "/models?limit=2" } }, success);
    const r = await governed(ep, "http://polygate.invalid/v1/models?limit=2", {}, { baseUrl: "http://polygate.invalid/v1/" });
    assert.equal(r.status, 200);
    assert.deepEqual(await mismatches(), []);
  });

  it("saturates the numbers it sends", async () => {
    const ep = await script(
      { rpc: "Pick", request: { opens: true, priority: 2147483647, deadline_ms_at_most: 315_576_000_000_000 }, reply: { grant: { source: "a" } } },
      { upstream: "a" },
      success,
    );
    const r = await governed(ep, "http://polygate.invalid/x", {}, { estimatedTokens: () => Number.NaN, priority: 1e12, deadlineMs: Number.POSITIVE_INFINITY });
    assert.equal(r.status, 200);
    assert.deepEqual(await mismatches(), []);
  });

  it("refuses a request outside its baseUrl before asking the sidecar", async () => {
    const ep = await script();
    await assert.rejects(governed(ep, "http://elsewhere.invalid/v1/models", {}, { baseUrl: "http://polygate.invalid/v1" }), /is not under the governed fetch's baseUrl/);
    assert.deepEqual(await mismatches(), []);
  });

  it("prepares each attempt for its source, replaying the body", async () => {
    const want = (source: string) => ({ method: "POST", path: "/chat", headers: { "x-key": `key-of-${source}` }, body: "hello" });
    const ep = await script(
      grant("a"),
      { upstream: "a", request: want("a"), reply: { status: 503 } },
      { rpc: "RecordOutcome", request: { outcome: "TRANSIENT", http_status: 503 }, reply: { retry: {} } },
      { rpc: "Pick", reply: { grant: { source: "b" } } },
      { upstream: "b", request: want("b") },
      success,
    );
    const r = await governed(ep, "http://polygate.invalid/chat", { method: "POST", body: "hello" }, {
      prepare: (req, g) => req.headers.set("x-key", `key-of-${g.source}`),
    });
    assert.equal(r.status, 200);
    assert.deepEqual(await mismatches(), []);
  });

  it("ends an attempt after the source's timeout as TRANSIENT", async () => {
    const ep = await script(
      grant("a", { timeout_ms: 50 }),
      { upstream: "a", reply: { hang: true } },
      { rpc: "RecordOutcome", request: { outcome: "TRANSIENT" }, reply: { retry: {} } },
      { rpc: "Pick", reply: { grant: { source: "b" } } },
      { upstream: "b" },
      success,
    );
    const r = await governed(ep, "http://polygate.invalid/chat");
    assert.equal(((await r.json()) as { choices: { message: { content: string } }[] }).choices[0]!.message.content, "ok from b");
    assert.deepEqual(await mismatches(), []);
  });

  it("rejects a source without a base_url and gives its permit back", async () => {
    const ep = await script(grant("a", { attributes: { base_url: "" } }), { rpc: "CancelCall" });
    await assert.rejects(governed(ep, "http://polygate.invalid/chat"), /source a has no "base_url" attribute/);
    assert.deepEqual(await mismatches(), []);
  });

  it("refuses a request body larger than it replays", async () => {
    const ep = await script();
    await assert.rejects(governed(ep, "http://polygate.invalid/chat", { method: "POST", body: "x".repeat(101) }, { maxRequestBody: 100 }), RangeError);
    assert.deepEqual(await mismatches(), []);
  });

  it("refuses a maxRequestBody that is not a size", () => {
    const pg = new Client({ addr: "127.0.0.1:1", token: "", tracerProvider: null });
    try {
      for (const bad of [Number.NaN, -1, 1.5, Number.POSITIVE_INFINITY]) {
        assert.throws(() => governedFetch(pg, "chat", { maxRequestBody: bad }), /maxRequestBody: .* is not allowed: a whole number of bytes/, String(bad));
      }
    } finally {
      pg.close();
    }
  });

  it("warns once when a provider SDK retries on its own", async () => {
    const warnings: string[] = [];
    const onWarning = (w: Error): void => {
      if (w.name === "ProviderRetryWarning") warnings.push(w.message);
    };
    process.on("warning", onWarning);
    const ep = await script(grant("a"), { upstream: "a" }, success, grant("a"), { upstream: "a" }, success);
    const pg = client(ep);
    try {
      const fetchGoverned = governedFetch(pg, "chat");
      for (const retry of ["1", "2"]) {
        await fetchGoverned("http://polygate.invalid/chat", { headers: { "x-stainless-retry-count": retry } });
      }
      assert.deepEqual(await mismatches(), []);
      await new Promise((r) => setImmediate(r)); // warnings are emitted on the next tick
    } finally {
      process.off("warning", onWarning);
      pg.close();
    }
    assert.equal(warnings.length, 1);
    assert.match(warnings[0]!, /maxRetries: 0/);
  });
});

describe("Client.call", () => {
  it("returns the successful attempt's value", async () => {
    const ep = await script(grant("a"), { rpc: "RecordOutcome", request: { outcome: "SUCCESS" }, reply: { done: {} } });
    const pg = client(ep);
    try {
      assert.equal(await pg.call("chat", (g) => ({ outcome: "SUCCESS", value: `done on ${g.source}` })), "done on a");
    } finally {
      pg.close();
    }
    assert.deepEqual(await mismatches(), []);
  });

  it("throws a verdict as its class, with the refusals", async () => {
    const refusal = [{ source: "a", reason: "circuit_open", retry_after_ms: 1500 }];
    const ep = await script(
      { rpc: "Pick", request: { opens: true }, reply: { no_runnable: { gate_rejections: 1, reasons: refusal } } },
      { rpc: "OnNoRunnable", reply: { failure: { reason: "circuit_open", retry_after_ms: 1500 } } },
    );
    const pg = client(ep);
    try {
      const err = await pg.call("chat", () => assert.fail("no attempt")).catch((e: unknown) => e);
      assert.ok(err instanceof CircuitOpenError, String(err));
      assert.equal(err.retryAfterMs, 1500);
      assert.equal(err.callId, "call-1");
      assert.deepEqual(err.perSourceReasons, [{ source: "a", reason: "circuit_open", retryAfterMs: 1500 }], "the NoRunnable's, when the failure has none");
    } finally {
      pg.close();
    }
    assert.deepEqual(await mismatches(), []);
  });

  it("throws a sidecar error with its ErrorInfo", async () => {
    const ep = await script({ rpc: "Pick", request: { opens: true }, reply: { error: { code: "INVALID_ARGUMENT", reason: "ERROR_REASON_INVALID_FIELD", message: "tenant: bad" } } });
    const pg = client(ep);
    try {
      const err = await pg.call("chat", () => assert.fail("no attempt")).catch((e: unknown) => e);
      assert.ok(err instanceof InvalidArgumentError, String(err));
      assert.equal(err.reason, "ERROR_REASON_INVALID_FIELD");
      assert.equal(err.details, "tenant: bad");
      assert.equal(err.unreachable, false);
    } finally {
      pg.close();
    }
  });

  it("logs an outage once and counts the attempts made without the sidecar", async () => {
    const ep = await script({ upstream: "a" }, { upstream: "a" });
    await kit.stopSidecar();
    const logs: string[] = [];
    const pg = client(ep, { onSidecarUnavailable: "allow", fallback: { chat: { source: "a", attributes: { base_url: `${ep.upstream}/a` } } }, log: (m) => logs.push(m) });
    try {
      const fetchGoverned = governedFetch(pg, "chat");
      for (let i = 0; i < 2; i++) {
        assert.equal((await fetchGoverned("http://polygate.invalid/x")).status, 200);
      }
      assert.equal(pg.ungovernedAttempts, 2);
      assert.equal(logs.length, 1, logs.join("\n"));
      assert.match(logs[0]!, /unreachable.*on_sidecar_unavailable=allow/);
    } finally {
      pg.close();
    }
    assert.deepEqual(await mismatches(), []);
  });

  it("fails without a sidecar when the client does not allow it", async () => {
    const ep = await script();
    await kit.stopSidecar();
    const pg = client(ep);
    try {
      const err = await pg.call("chat", () => assert.fail("no attempt")).catch((e: unknown) => e);
      assert.ok(err instanceof UnavailableError && err.unreachable, String(err));
    } finally {
      pg.close();
    }
  });
});

describe("the client's options", () => {
  const env = (vars: Record<string, string | undefined>, fn: () => void): void => {
    const saved = Object.fromEntries(Object.keys(vars).map((k) => [k, process.env[k]]));
    Object.assign(process.env, vars);
    for (const [k, v] of Object.entries(vars)) if (v === undefined) delete process.env[k];
    try {
      fn();
    } finally {
      for (const [k, v] of Object.entries(saved)) if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  };

  it("reads POLYGATE_ADDR, POLYGATE_TOKEN and POLYGATE_ON_SIDECAR_UNAVAILABLE", () => {
    env({ POLYGATE_ADDR: "127.0.0.1:1", POLYGATE_TOKEN: "t", POLYGATE_ON_SIDECAR_UNAVAILABLE: "allow" }, () => {
      const pg = new Client();
      assert.equal(pg.onSidecarUnavailable, "allow");
      pg.close();
    });
  });

  it("names what is wrong", () => {
    env({ POLYGATE_ADDR: undefined, POLYGATE_ON_SIDECAR_UNAVAILABLE: undefined }, () => {
      assert.throws(() => new Client(), /the addr option or \$POLYGATE_ADDR/);
      assert.throws(() => new Client({ addr: "nowhere" }), /addr: "nowhere" is not host:port/);
      assert.throws(() => new Client({ addr: "127.0.0.1:1", token: "two words" }), /token: only printable ASCII/);
      assert.throws(() => new Client({ addr: "127.0.0.1:1", onSidecarUnavailable: "open" as "allow" }), /onSidecarUnavailable: "open" is not allowed: fail or allow/);
      assert.throws(() => new Client({ addr: "127.0.0.1:1", tls: { certFile: "c.pem" } }), /give both or neither/);
      assert.throws(() => new Client({ addr: "127.0.0.1:1", tls: { caFile: "/nonexistent/ca.pem" } }), /tls.caFile "\/nonexistent\/ca.pem" cannot be read/);
      assert.throws(() => new Client({ addr: "127.0.0.1:1", tls: { caFile: "/dev/zero" } }), /tls.caFile "\/dev\/zero" is larger than 1048576 bytes/);
      assert.throws(() => new Client({ addr: "unix:///run/p.sock", tls: true }), /a unix socket .* is plaintext/);
    });
    env({ POLYGATE_ADDR: "nowhere" }, () => {
      assert.throws(() => new Client(), /\$POLYGATE_ADDR: "nowhere" is not host:port/);
    });
    env({ POLYGATE_TOKEN: "two words" }, () => {
      assert.throws(() => new Client({ addr: "127.0.0.1:1" }), /\$POLYGATE_TOKEN: only printable ASCII/);
    });
    env({ POLYGATE_ON_SIDECAR_UNAVAILABLE: "maybe" }, () => {
      assert.throws(() => new Client({ addr: "127.0.0.1:1" }), /\$POLYGATE_ON_SIDECAR_UNAVAILABLE: "maybe" is not allowed/);
    });
  });

  it("is plaintext only to loopback addresses by default", () => {
    for (const h of ["localhost", "127.0.0.1", "127.3.2.1", "::1"]) assert.ok(isLoopback(h), h);
    for (const h of ["10.0.0.1", "sidecar", "::2", "128.0.0.1"]) assert.ok(!isLoopback(h), h);
  });
});

describe("classifyError", () => {
  it("is TRANSIENT for a transport error and the source's timeout, CANCELLED for the caller's abort", () => {
    assert.equal(classifyError(new TypeError("fetch failed")).outcome, "TRANSIENT");
    const timedOut = new AbortController();
    timedOut.abort(new AttemptTimeoutError("source a timed out after 50 ms"));
    assert.deepEqual(classifyError(new Error("aborted"), timedOut.signal), { outcome: "TRANSIENT", detail: "source a timed out after 50 ms" });
    const aborted = new AbortController();
    aborted.abort();
    assert.equal(classifyError(aborted.signal.reason, aborted.signal).outcome, "CANCELLED");
  });
});

describe("the verdict's answer", () => {
  it("rounds retry_after up to the millisecond and writes it in seconds", () => {
    assert.equal(millis(1.000001), 2, "1 ms and 1 ns");
    assert.equal(millis(1.0000001), 1, "less than a nanosecond over 1 ms is 1 ms: the sidecar counts whole nanoseconds");
    assert.equal(millis(-5), 0);
    assert.equal(millis(Number.NaN), 0);
    assert.equal(secondsText(2), "0.002");
    assert.equal(secondsText(30_000), "30.000");
  });
  it("is a 429 for quota and budget reasons, a 503 otherwise", () => {
    assert.equal(statusFor("quota_exhausted"), 429);
    assert.equal(statusFor("budget_exhausted"), 429);
    assert.equal(statusFor("circuit_open"), 503);
  });
});

describe("spans", () => {
  class Recorded {
    attributes: otel.Attributes = {};
    events: string[] = [];
    ended = false;
    status: otel.SpanStatus = { code: otel.SpanStatusCode.UNSET };
    constructor(
      readonly name: string,
      readonly parent: otel.SpanContext | undefined,
      readonly ctx: otel.SpanContext,
    ) {}
  }
  let n = 0;
  const spans: Recorded[] = [];
  const provider: otel.TracerProvider = {
    getTracer: () => ({
      startSpan(name, options, context) {
        const ctx = { traceId: "0af7651916cd43dd8448eb211c80319c", spanId: (++n).toString(16).padStart(16, "0"), traceFlags: otel.TraceFlags.SAMPLED };
        const rec = new Recorded(name, context === undefined ? undefined : otel.trace.getSpanContext(context), ctx);
        Object.assign(rec.attributes, options?.attributes);
        spans.push(rec);
        const span: otel.Span = {
          spanContext: () => ctx,
          setAttribute: (k, v) => ((rec.attributes[k] = v), span),
          setAttributes: (a) => (Object.assign(rec.attributes, a), span),
          addEvent: (e) => (rec.events.push(e), span),
          addLink: () => span,
          addLinks: () => span,
          setStatus: (s) => ((rec.status = s), span),
          updateName: () => span,
          end: () => void (rec.ended = true),
          isRecording: () => true,
          recordException: () => {},
        };
        return span;
      },
      startActiveSpan: () => assert.fail("not used"),
    }),
  };

  it("makes a call span and an attempt span, and every RPC carries the trace context", async () => {
    const ep = await script(
      grant("a"),
      { upstream: "a", reply: { status: 503 } },
      { rpc: "RecordOutcome", request: { outcome: "TRANSIENT", http_status: 503 }, reply: { retry: {} } },
      { rpc: "Pick", reply: { grant: { source: "b" } } },
      { upstream: "b" },
      success,
    );
    const traceparents: string[] = [];
    const transport = createGrpcTransport({
      baseUrl: `http://${ep.sidecar}`,
      interceptors: [
        (next) => (req) => {
          traceparents.push(req.header.get("traceparent") ?? "");
          return next(req);
        },
      ],
    });
    const pg = new Client({ transport, tracerProvider: provider });
    assert.equal((await governedFetch(pg, "chat")("http://polygate.invalid/x")).status, 200);
    assert.deepEqual(await mismatches(), []);
    assert.deepEqual(
      spans.map((s) => s.name),
      ["polygate.call", "polygate.attempt", "polygate.attempt"],
    );
    const [call, first, second] = spans as [Recorded, Recorded, Recorded];
    assert.ok(spans.every((s) => s.ended));
    assert.equal(call.attributes["polygate.call_id"], "call-1");
    assert.equal(call.attributes["polygate.verdict"], "done");
    assert.equal(call.attributes["polygate.attempts"], 2);
    assert.deepEqual(first.parent, call.ctx);
    assert.equal(first.attributes["polygate.source"], "a");
    assert.equal(first.attributes["polygate.outcome"], "TRANSIENT");
    assert.equal(first.attributes["polygate.verdict"], "retry");
    assert.equal(first.status.code, otel.SpanStatusCode.ERROR);
    assert.equal(second.attributes["polygate.source"], "b");
    assert.equal(second.attributes["polygate.http_status"], 200);
    const tp = (s: Recorded): string => `00-${s.ctx.traceId}-${s.ctx.spanId}-01`;
    assert.deepEqual(traceparents, [tp(first), tp(first), tp(second), tp(second)], "each RPC in its attempt's span");
  });
});
