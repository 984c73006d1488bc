// Plain fetch through polygate, and the loop around an attempt of your own.
import { CallFailedError, Client, classify, classifyError, failureOf, governedFetch, type Grant } from "polygate-sdk";

const pg = new Client({ addr: "127.0.0.1:50051", tenant: "search", onSidecarUnavailable: "allow" });

const governed = governedFetch(pg, "chat", {
  prepare: (request, grant: Grant) => {
    request.headers.set("authorization", `Bearer ${process.env[`KEY_${grant.source.toUpperCase()}`] ?? ""}`);
  },
});
const response = await governed("http://polygate.invalid/chat/completions", {
  method: "POST",
  headers: { "content-type": "application/json" },
  body: JSON.stringify({ model: "gpt-4o-mini", messages: [{ role: "user", content: "Hello" }] }),
  signal: AbortSignal.timeout(120_000),
});
const verdict = failureOf(response);
if (verdict !== undefined) {
  console.error(`polygate: ${verdict.reason}, retry after ${verdict.retryAfterMs} ms`);
} else {
  console.log(await response.json());
}

// Full control: the loop runs around your attempt; you classify its result.
try {
  const answer = await pg.call(
    "chat",
    async (grant, signal) => {
      let r: Response;
      try {
        r = await fetch(`${grant.attributes.base_url}/chat/completions`, { method: "POST", body: "{}", signal });
      } catch (e) {
        return classifyError(e, signal); // TRANSIENT, or CANCELLED when the caller gave up
      }
      const body = await r.text();
      return { ...classify(r.status, r.headers, body), httpStatus: r.status, value: body };
    },
    { estimatedTokens: 500, deadlineMs: 60_000 },
  );
  console.log(answer);
} catch (err) {
  if (err instanceof CallFailedError) {
    console.error(err.reason, err.retryAfterMs, err.perSourceReasons);
  } else {
    throw err;
  }
} finally {
  pg.close();
}
