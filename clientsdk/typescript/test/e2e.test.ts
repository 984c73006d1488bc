// openai-node and the Vercel AI SDK through the governed fetch, against the
// real sidecar binary and the fake upstream of e2e/upstream.

import assert from "node:assert/strict";
import { afterEach, beforeEach, describe, it } from "node:test";

import { createOpenAI } from "@ai-sdk/openai";
import { generateText } from "ai";
import OpenAI from "openai";

import { Client, UnavailableError, failureOf, governedFetch } from "../src/index.js";
import { Sidecar, Upstream, eventually } from "./harness.js";

const PLACEHOLDER = "http://polygate.invalid/v1";
const MESSAGES = [{ role: "user" as const, content: "Hello" }];

function config(up: Upstream): string {
  return `
scopes:
  chat:
    circuit_open: wait
    max_attempts: 3
    backoff: {base: 5ms, max: 10ms}
    breaker: {fail_threshold: 5, min_calls: 100, fail_rate: 1.0, window: 60s, cooldown: 30s, max_cooldown: 30s}
    sources:
      - {name: a, priority: 0, timeout: 30s, tpm: 100000, attributes: {base_url: "${up.baseUrl("a")}"}}
      - {name: b, priority: 1, timeout: 30s, tpm: 100000, attributes: {base_url: "${up.baseUrl("b")}"}}
  solo:
    circuit_open: wait
    max_attempts: 3
    backoff: {base: 5ms, max: 10ms}
    sources:
      - {name: only, timeout: 30s, attributes: {base_url: "${up.baseUrl("only")}"}}
`;
}

describe("openai-node through the governed fetch, against the real sidecar", () => {
  let up!: Upstream;
  let sc!: Sidecar;
  let pg!: Client;
  let started: { stop(): void | Promise<void> }[] = [];

  beforeEach(async () => {
    started = [];
    up = await Upstream.start();
    started.push(up);
    sc = await Sidecar.start(config(up));
    started.push(sc);
    pg = new Client({ addr: sc.addr, tracerProvider: null });
    started.push({ stop: () => pg.close() });
  });

  afterEach(async (t) => {
    if ((t as { passed?: boolean }).passed === false && started.includes(sc)) {
      console.log(`sidecar logs:\n${sc.logs()}`);
    }
    for (const s of started.reverse()) {
      await s.stop();
    }
  });

  const openai = (scope: string, options: { estimatedTokens?: number } = {}): OpenAI =>
    new OpenAI({
      baseURL: PLACEHOLDER,
      apiKey: "sk-test",
      fetch: governedFetch(pg, scope, { baseUrl: PLACEHOLDER, ...options }),
      maxRetries: 0,
    });

  it("succeeds, and the body's usage settles the TPM estimate", async () => {
    const completion = await openai("chat", { estimatedTokens: 500 }).chat.completions.create({ model: "gpt-x", messages: MESSAGES });
    assert.equal(completion.choices[0]?.message.content, "ok from a");
    assert.equal(completion.usage?.total_tokens, 8, "the caller still reads the body the SDK read");
    assert.equal((await sc.source("chat", "a")).tokensLastMinute, 8n, "usage.total_tokens settled the estimate of 500");
  });

  it("fails over inside one create after a 503 burst", async () => {
    await up.set("a", { status: 503 });
    const completion = await openai("chat").chat.completions.create({ model: "gpt-x", messages: MESSAGES });
    assert.equal(completion.choices[0]?.message.content, "ok from b");
    assert.deepEqual([(await up.requests("a")).length, (await up.requests("b")).length], [1, 1], "one attempt on each source, no retry by openai");
    assert.equal((await sc.source("chat", "a")).windowFailures, 1n);
  });

  it("retries a 429 with Retry-After: 2 no sooner than 2 s", async () => {
    await up.set("only", { status: 429, headers: { "Retry-After": "2" }, times: 1 }, { status: 200 });
    const completion = await openai("solo").chat.completions.create({ model: "gpt-x", messages: MESSAGES });
    assert.equal(completion.choices[0]?.message.content, "ok from only");
    const reqs = await up.requests("only");
    assert.deepEqual(
      reqs.map((r) => r.status),
      [429, 200],
    );
    // The breaker's clock counts whole milliseconds.
    assert.ok(reqs[1]!.at_ms - reqs[0]!.at_ms >= 2000 - 1, `the retry came ${reqs[1]!.at_ms - reqs[0]!.at_ms} ms after the 429`);
  });

  it("raises OpenAI.AuthenticationError with the provider's message for a 401", async () => {
    const body = '{"error":{"message":"Incorrect API key provided: sk-test.","type":"invalid_request_error","param":null,"code":"invalid_api_key"}}';
    await up.set("only", { status: 401, body });
    const err = await openai("solo")
      .chat.completions.create({ model: "gpt-x", messages: MESSAGES })
      .then(
        () => assert.fail("a dead key succeeded"),
        (e: unknown) => e,
      );
    assert.ok(err instanceof OpenAI.AuthenticationError, `got ${String(err)}`);
    assert.equal(err.status, 401);
    assert.match(err.message, /Incorrect API key provided: sk-test\./);
    assert.equal(err.code, "invalid_api_key");
    assert.equal(err.headers.get("polygate-failure-reason"), "source_dead");
    assert.ok(Number(err.headers.get("polygate-retry-after")) > 0, "the dead source's cooldown");
    assert.equal((await up.requests("only")).length, 1, "no retry of a dead key");
  });

  it("streams chunks as the upstream sends them", async () => {
    const chunk = (content: string): string =>
      JSON.stringify({ id: "c1", object: "chat.completion.chunk", created: 1, model: "gpt-x", choices: [{ index: 0, delta: { content }, finish_reason: null }] });
    // Each chunk after the first is sent only once the test released it,
    // which it does when it has read the one before: a body buffered by the
    // SDK would never show the first chunk, and the test would time out.
    await up.set("a", { stream: [chunk("Hel"), chunk("lo"), chunk("!")], gated: true });
    const stream = await openai("chat").chat.completions.create({ model: "gpt-x", messages: MESSAGES, stream: true });
    const got: string[] = [];
    for await (const c of stream) {
      got.push(c.choices[0]?.delta.content ?? "");
      await up.release("a");
    }
    assert.deepEqual(got, ["Hel", "lo", "!"]);
    assert.equal(await sc.metric("polygate_attempts_total", { scope: "chat", source: "a", outcome: "success" }), 1);
  });

  it("records an aborted request as cancelled", async () => {
    await up.set("a", { hang: true });
    const abort = new AbortController();
    const created = openai("chat").chat.completions.create({ model: "gpt-x", messages: MESSAGES }, { signal: abort.signal });
    await up.requests("a", 1); // the attempt is in flight
    abort.abort();
    await assert.rejects(created, OpenAI.APIUserAbortError);
    await eventually("the attempt recorded as cancelled", async () => (await sc.metric("polygate_attempts_total", { scope: "chat", source: "a", outcome: "cancelled" })) === 1);
    assert.equal((await sc.source("chat", "a")).inFlight, 0, "the permit is free");
    assert.equal(await sc.liveCalls("chat"), 0, "the call ended");
  });

  it("rejects with openai's connection error, caused by UnavailableError, when the sidecar is down", async () => {
    await sc.stop();
    const err = await openai("chat")
      .chat.completions.create({ model: "gpt-x", messages: MESSAGES })
      .then(
        () => assert.fail("a call without the sidecar succeeded"),
        (e: unknown) => e,
      );
    assert.ok(err instanceof OpenAI.APIConnectionError, `got ${String(err)}`);
    assert.ok(err.cause instanceof UnavailableError, `caused by ${String(err.cause)}`);
    assert.equal((await up.requests("a")).length, 0, "no attempt when the client fails");
  });

  it("hands over the last upstream answer, with the verdict, when retries are spent", async () => {
    await up.set("a", { status: 503 });
    await up.set("b", { status: 503 });
    const err = await openai("chat")
      .chat.completions.create({ model: "gpt-x", messages: MESSAGES })
      .then(
        () => assert.fail("every source failed, and the call succeeded"),
        (e: unknown) => e,
      );
    assert.ok(err instanceof OpenAI.InternalServerError, `got ${String(err)}`);
    assert.equal(err.headers.get("polygate-failure-reason"), "retry_exhausted", "the last upstream 503, with the verdict");
  });

  it("reaches a sidecar on a unix socket", async () => {
    const unix = await Sidecar.start(config(up), "unix://$DIR/polygate.sock");
    started.push(unix);
    assert.match(unix.addr, /^unix:\/\/\/.*polygate\.sock$/);
    const local = new Client({ addr: unix.addr, tracerProvider: null });
    started.push({ stop: () => local.close() });
    const r = await governedFetch(local, "chat")("http://polygate.invalid/chat/completions", { method: "POST", body: "{}" });
    assert.equal(r.status, 200);
    assert.ok(r.headers.get("polygate-call-id"), "a governed call");
  });

  it("serves the Vercel AI SDK", async () => {
    const provider = createOpenAI({ baseURL: PLACEHOLDER, apiKey: "sk-test", fetch: governedFetch(pg, "chat", { baseUrl: PLACEHOLDER }) });
    const { text } = await generateText({ model: provider.chat("gpt-x"), prompt: "Hello", maxRetries: 0 });
    assert.equal(text, "ok from a");
  });

  it("hands a plain fetch the upstream's response, with the verdict when there is one", async () => {
    await up.set("only", { status: 400, body: '{"error":{"message":"bad model"}}' });
    const governed = governedFetch(pg, "solo");
    const r = await governed("http://polygate.invalid/chat/completions", { method: "POST", body: "{}" });
    assert.equal(r.status, 400);
    assert.equal(((await r.json()) as { error: { message: string } }).error.message, "bad model");
    assert.equal(failureOf(r)?.reason, "non_retryable");
  });
});
