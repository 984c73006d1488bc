// The conformance kit (clientsdk/conformance): every exchange against the
// TypeScript SDK, and proof that the run fails when one expectation changes.

import assert from "node:assert/strict";
import { readFileSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, it } from "node:test";

import { Kit } from "./kit.js";
import { REPO } from "./repo.js";

const DIR = join(REPO, "clientsdk/conformance/exchanges");
const files = readdirSync(DIR)
  .filter((f) => f.endsWith(".json"))
  .sort();
const exchanges = new Map(files.map((f) => [f, readFileSync(join(DIR, f), "utf8")]));

let kit: Kit;

before(async () => {
  kit = await Kit.start();
});

after(async () => {
  await kit?.stop();
});

describe("every exchange of the conformance kit", () => {
  it("has exchanges", () => assert.ok(files.length >= 15, `${files.length} exchanges`));
  for (const [file, text] of exchanges) {
    it(file, async () => {
      assert.deepEqual(await kit.run(text), []);
    });
  }
});

/** An exchange's JSON with one expectation changed by edit. */
function mutated(file: string, edit: (ex: Record<string, any>) => void): string {
  const ex = JSON.parse(exchanges.get(file)!) as Record<string, any>;
  edit(ex);
  return JSON.stringify(ex);
}

describe("a changed expectation fails the run", () => {
  // A step the SDK never sends is reported however long the fake waits for
  // it: that mutation's run does not wait.
  const cases: [string, string, (ex: Record<string, any>) => void, RegExp, number?][] = [
    ["an RPC's field", "02-retry-backoff.json", (ex) => (ex.script[2].request.outcome = "RATE_LIMITED"), /outcome = TRANSIENT, want RATE_LIMITED/],
    ["the opening Pick's options", "01-grant-success.json", (ex) => (ex.script[0].request.estimated_tokens = 501), /estimated_tokens = 500, want 501/],
    ["the tokens reported", "01-grant-success.json", (ex) => (ex.script[2].request.actual_tokens = 9), /actual_tokens = 8, want 9/],
    ["the retry hint", "07-rate-limited-retry-after.json", (ex) => (ex.script[2].request.retry_after_hint_ms = 2000), /retry_after_hint_ms = 1000, want 2000/],
    ["the source attempted", "03-failover.json", (ex) => (ex.script[4].upstream = "c"), /got upstream b POST \/chat\/completions, want upstream c/],
    ["a sleep's lower bound", "04-wait.json", (ex) => (ex.script[2].after_ms = 10_000), /want at least 10000 ms/],
    ["the RPC that comes next", "13-cancel-attempt.json", (ex) => (ex.script[2] = { rpc: "RecordOutcome", request: { outcome: "CANCELLED" }, reply: { done: {} } }), /got CancelCall, want RecordOutcome/],
    ["what the application sees", "08-dead-key.json", (ex) => (ex.calls[0].app_sees.headers["polygate-failure-reason"] = "circuit_open"), /header polygate-failure-reason = "source_dead", want "circuit_open"/],
    ["a synthesized status", "06-quota-exhausted.json", (ex) => (ex.calls[0].app_sees.status = 503), /status = 429, want 503/],
    ["an error the application sees", "16-sidecar-down-fail.json", (ex) => (ex.calls[0].app_sees = { error: "aborted" }), /want the aborted error/],
    ["a step that never comes", "12-deadline-silent.json", (ex) => ex.script.push({ rpc: "Pick", reply: { hang: true } }), /step 3 \(Pick\): never came/, 0],
  ];
  for (const [what, file, edit, want, wait] of cases) {
    it(`${what} (${file})`, async () => {
      const problems = await kit.run(mutated(file, edit), wait);
      assert.ok(
        problems.some((p) => want.test(p)),
        `want a difference matching ${want}, got ${JSON.stringify(problems)}`,
      );
    });
  }
});
