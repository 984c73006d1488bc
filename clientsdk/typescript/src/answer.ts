// What a governed fetch answers when its call ends on a verdict: the headers
// that name polygate's verdict, and the response synthesized when no upstream
// answer exists. The rules are the Python and Go SDKs' (docs/quickstart.md);
// they live here once.

import type { CallFailedError } from "./errors.js";

export const FAILURE_REASON = "polygate-failure-reason";
export const RETRY_AFTER = "polygate-retry-after";
export const CALL_ID = "polygate-call-id";
const ERROR_TYPE = "polygate_error";

/** A duration in whole milliseconds, rounded up (never early), never negative. */
export function millis(msValue: number): number {
  if (!(msValue > 0)) {
    return 0;
  }
  const ns = Math.round(Math.min(msValue, 1e15) * 1e6); // whole nanoseconds, as the sidecar sends them
  return Math.ceil(ns / 1e6);
}

/** Milliseconds as seconds with exactly three decimals: 2 ms is "0.002". */
export function secondsText(ms: number): string {
  return `${Math.floor(ms / 1000)}.${String(ms % 1000).padStart(3, "0")}`;
}

/** The synthesized status of a verdict: 429 when the scope's or tenant's capacity said no (quota_exhausted, or a budget), 503 for all others. */
export function statusFor(reason: string): number {
  return reason === "quota_exhausted" || reason.includes("budget") ? 429 : 503;
}

/** The headers that carry the verdict on the response the client gets. */
function verdictHeaders(err: CallFailedError): [string, string][] {
  const headers: [string, string][] = [
    [FAILURE_REASON, err.reason || "unknown"],
    [RETRY_AFTER, secondsText(millis(err.retryAfterMs))],
  ];
  if (err.callId) {
    headers.push([CALL_ID, err.callId]);
  }
  return headers;
}

/** The synthesized error's message: the reason, the scope, when to retry, the call, each source's refusal. */
export function message(err: CallFailedError): string {
  const ms = millis(err.retryAfterMs);
  let msg = `polygate: ${err.reason || "unknown"} in scope ${err.scope}`;
  if (ms > 0) {
    msg += `, retry after ${secondsText(ms)}s`;
  }
  if (err.callId) {
    msg += ` (call ${err.callId})`;
  }
  if (err.perSourceReasons.length > 0) {
    msg +=
      ": " +
      err.perSourceReasons
        .map((r) => {
          const rms = millis(r.retryAfterMs);
          return `${r.source} ${r.reason}` + (rms > 0 ? ` ${secondsText(rms)}s` : "");
        })
        .join("; ");
  }
  return msg;
}

/**
 * The response that stands for a verdict with no upstream answer, in the
 * OpenAI error shape, so that a provider SDK raises its usual status error
 * with polygate's message.
 */
function synthesized(err: CallFailedError): Response {
  const ms = millis(err.retryAfterMs);
  const headers = new Headers([["content-type", "application/json"], ...verdictHeaders(err)]);
  if (ms > 0) {
    headers.set("retry-after", String(Math.ceil(ms / 1000)));
  }
  const reason = err.reason || "unknown";
  const body = {
    error: {
      message: message(err),
      type: ERROR_TYPE,
      code: reason,
      param: null,
      polygate: {
        reason,
        retry_after_s: ms / 1000,
        scope: err.scope,
        call_id: err.callId,
        attempts: err.attempts,
        per_source: err.perSourceReasons.map((r) => ({ source: r.source, reason: r.reason, retry_after_s: millis(r.retryAfterMs) / 1000 })),
      },
    },
  };
  return new Response(JSON.stringify(body), { status: statusFor(reason), headers });
}

/**
 * The upstream's own response with extra headers. A fetched Response's
 * headers cannot change, so this is a new Response over the same body
 * (never read here) keeping the original's url.
 */
export function withHeaders(response: Response, extra: [string, string][]): Response {
  const headers = new Headers(response.headers);
  for (const [k, v] of extra) {
    headers.set(k, v);
  }
  const out = new Response(response.body, { status: response.status, statusText: response.statusText, headers });
  Object.defineProperty(out, "url", { value: response.url });
  return out;
}

/** The response for a verdict: the last attempt's own when there is one, else one synthesized; either way with the verdict's headers. */
export function failed(err: CallFailedError): Response {
  const last = err.lastResult?.value;
  if (last instanceof Response) {
    return withHeaders(last, verdictHeaders(err));
  }
  return synthesized(err);
}
