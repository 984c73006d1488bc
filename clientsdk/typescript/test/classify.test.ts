// The shared classification vectors (testdata/classification.json), which
// the Go and Python SDKs run too, and the token usage of a body.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, it } from "node:test";

import { classify, totalTokens } from "../src/classify.js";
import { REPO } from "./repo.js";

interface Vectors {
  now: string;
  cases: { name: string; status: number; headers: Record<string, string>; body: string; outcome: string; retry_after_ms: number }[];
}

const vectors = JSON.parse(readFileSync(join(REPO, "testdata/classification.json"), "utf8")) as Vectors;

describe("the shared classification vectors", () => {
  it("has cases", () => {
    assert.ok(vectors.cases.length > 50);
  });
  const now = new Date(vectors.now);
  for (const c of vectors.cases) {
    it(c.name, () => {
      const got = classify(c.status, c.headers, c.body, now);
      assert.deepEqual(got, { outcome: c.outcome, retryAfterMs: c.retry_after_ms });
    });
  }
});

describe("classify", () => {
  it("reads a fetch Headers, case-insensitively", () => {
    assert.deepEqual(classify(429, new Headers({ "Retry-After": "3" }), ""), { outcome: "RATE_LIMITED", retryAfterMs: 3000 });
  });
  it("reads a body of bytes", () => {
    const body = new TextEncoder().encode('{"error":{"code":"insufficient_quota"}}');
    assert.equal(classify(429, {}, body).outcome, "SOURCE_DEAD");
  });
});

describe("totalTokens", () => {
  const cases: [string, number | undefined][] = [
    ['{"usage":{"total_tokens":8}}', 8],
    ['{"usage":{"total_tokens":8.0}}', 8],
    ['{"usage":{"total_tokens":8.5}}', undefined],
    ['{"usage":{"total_tokens":-1}}', undefined],
    ['{"usage":{"total_tokens":"8"}}', undefined],
    ['{"usage":{"total_tokens":true}}', undefined],
    ['{"usage":[]}', undefined],
    ["[1]", undefined],
    ["not json", undefined],
    ["", undefined],
  ];
  for (const [body, want] of cases) {
    it(body || "(empty)", () => assert.equal(totalTokens(body), want));
  }
});
