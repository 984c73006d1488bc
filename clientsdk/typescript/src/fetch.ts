// A governed fetch: a function with fetch's signature that runs one governed
// call of a scope per request.

import { CALL_ID, failed, withHeaders } from "./answer.js";
import { classify, totalTokens } from "./classify.js";
import type { Client } from "./client.js";
import { CallFailedError, UnavailableError } from "./errors.js";
import { AttemptTimeoutError } from "./loop.js";
import type { AttemptResult, Grant } from "./types.js";

/** fetch's signature. */
export type Fetch = (input: string | URL | Request, init?: RequestInit) => Promise<Response>;

/** Options of a governed fetch. */
export interface GovernedFetchOptions {
  /** Tokens charged to each attempt's source's TPM quota: a number, or a function of the request. */
  estimatedTokens?: number | ((request: Request) => number);
  /** Each call's budget in milliseconds (see CallOptions.deadlineMs). */
  deadlineMs?: number;
  /** Each call's priority and tenant (default: the client's). */
  priority?: number;
  tenant?: string;
  /**
   * The part of request URLs that the granted source's base URL replaces
   * (default: the origin, so a request's path and query are appended to the
   * source's base URL).
   */
  baseUrl?: string;
  /** The source attribute that holds its base URL (default "base_url"). */
  attribute?: string;
  /** Called on each attempt's request before it is sent, e.g. to set the granted source's API key. */
  prepare?: (request: Request, grant: Grant) => void | Promise<void>;
  /** The fetch that sends each attempt (default: the platform's). It must not retry on its own. */
  fetch?: Fetch;
  /** The largest request body buffered to replay it on another attempt (default 32 MiB). */
  maxRequestBody?: number;
}

const RETRY_HEADER = "x-stainless-retry-count";
const DEFAULT_MAX_REQUEST_BODY = 32 << 20;
/** How much of a non-2xx body is read to classify it; the caller still gets all of it. */
const MAX_ERROR_BODY = 64 << 10;
/** The largest JSON 2xx body read for its token usage; a larger one is passed through and keeps the estimate. */
const MAX_USAGE_BODY = 4 << 20;

const verdicts = new WeakMap<Response, CallFailedError>();

/** The polygate verdict a governed fetch's response stands for, or undefined. */
export function failureOf(response: Response): CallFailedError | undefined {
  return verdicts.get(response);
}

/**
 * A fetch that governs every request as one call of scope: for each attempt
 * the sidecar grants, the request goes to the granted source (its base URL
 * replaces `baseUrl` of the request's URL) with the platform fetch; the
 * response is classified with the shared table (its body read first unless
 * it is a 2xx that is not JSON, such as a stream, which is passed through
 * unread), `usage.total_tokens` of a 2xx JSON body is reported as the
 * attempt's tokens, and the call retries, fails over, waits or ends as the
 * sidecar answers.
 *
 * It resolves to the successful attempt's response (with `polygate-call-id`).
 * A call that ends on a verdict resolves to the last attempt's own response,
 * or, when no attempt got one, to a synthesized 503 (429 for quota and budget
 * reasons) in the OpenAI error shape; either way the verdict is in
 * `polygate-failure-reason` and `polygate-retry-after` and in failureOf.
 * Aborting the request's signal gives the call up (the sidecar is told) and
 * rejects with the signal's reason. When the sidecar cannot be reached it
 * rejects with an UnavailableError, or, with `onSidecarUnavailable: "allow"`,
 * resolves to the ungoverned attempt's response.
 *
 * Turn the provider SDK's own retries off (openai: `maxRetries: 0`): the
 * sidecar is the one retry layer.
 */
export function governedFetch(client: Client, scope: string, options: GovernedFetchOptions = {}): Fetch {
  const send: Fetch = options.fetch ?? ((input, init) => fetch(input, init));
  const attribute = options.attribute ?? "base_url";
  const base = options.baseUrl === undefined ? undefined : new URL(options.baseUrl).href.replace(/\/+$/, "");
  const maxBody = options.maxRequestBody ?? DEFAULT_MAX_REQUEST_BODY;
  if (!Number.isSafeInteger(maxBody) || maxBody < 0) {
    // NaN would buffer a body of any size and replay none of it.
    throw new RangeError(`maxRequestBody: ${maxBody} is not allowed: a whole number of bytes, 0 or more`);
  }
  let warned = false;

  return async (input, init) => {
    const request = new Request(input, init);
    warned ||= warnProviderRetry(scope, request);
    const tokens = typeof options.estimatedTokens === "function" ? options.estimatedTokens(request) : (options.estimatedTokens ?? 0);
    const body = await requestBody(request, maxBody);
    const rest = restOf(request.url, base);
    const extra = passThrough(init);
    let last: Response | undefined; // the latest attempt's response, cancelled when superseded
    let callId = "";

    const attempt = async (grant: Grant, signal: AbortSignal): Promise<AttemptResult<Response>> => {
      discard(last);
      last = undefined;
      callId = grant.callId;
      const target = grant.attributes[attribute] ?? "";
      if (target === "") {
        throw new TypeError(`scope ${scope}: source ${grant.source} has no ${JSON.stringify(attribute)} attribute to send the request to`);
      }
      const headers = new Headers(request.headers);
      headers.delete("host");
      headers.delete("content-length");
      const req = new Request(target.replace(/\/+$/, "") + rest, {
        method: request.method,
        headers,
        body,
        redirect: request.redirect,
        signal,
      });
      await options.prepare?.(req, grant);
      let response: Response;
      try {
        response = await send(req, { ...extra, signal });
      } catch (e) {
        return classifyError(e, signal);
      }
      last = response;
      return resultOf(response);
    };

    try {
      const response = await client.call(scope, attempt, {
        estimatedTokens: tokens,
        ...(options.deadlineMs === undefined ? {} : { deadlineMs: options.deadlineMs }),
        ...(options.priority === undefined ? {} : { priority: options.priority }),
        ...(options.tenant === undefined ? {} : { tenant: options.tenant }),
        signal: request.signal,
      });
      return callId === "" ? response : withHeaders(response, [[CALL_ID, callId]]);
    } catch (e) {
      if (e instanceof CallFailedError) {
        const r = failed(e);
        verdicts.set(r, e);
        return r;
      }
      const value = e instanceof UnavailableError ? e.lastResult?.value : undefined;
      if (client.onSidecarUnavailable === "allow" && e instanceof UnavailableError && e.unreachable && value instanceof Response) {
        return value; // the ungoverned attempt's, or the last attempt's, answer stands
      }
      discard(last);
      throw e;
    }
  };
}

/** Warns when the request is a provider SDK's retry; true when it warned. */
function warnProviderRetry(scope: string, request: Request): boolean {
  const count = (request.headers.get(RETRY_HEADER) ?? "0").trim();
  if (!/^\d+$/.test(count) || Number(count) === 0) {
    return false;
  }
  process.emitWarning(
    `a provider SDK retried a request governed by polygate (scope ${scope}, ${RETRY_HEADER}: ${count.slice(0, 20)}): ` +
      "every retry of the SDK starts a new governed call; turn the SDK's retries off (maxRetries: 0)",
    "ProviderRetryWarning",
  );
  return true;
}

/** fetch options other than those the governed request sets (an undici dispatcher, keepalive...). */
function passThrough(init: RequestInit | undefined): RequestInit {
  if (init === undefined) {
    return {};
  }
  const { method: _m, headers: _h, body: _b, signal: _s, redirect: _r, ...rest } = init as RequestInit & Record<string, unknown>;
  return rest;
}

/** The part of url after base (default: its origin). */
function restOf(url: string, base: string | undefined): string {
  if (base === undefined) {
    const u = new URL(url);
    return u.pathname + u.search;
  }
  if (url === base || url.startsWith(base + "/") || url.startsWith(base + "?")) {
    return url.slice(base.length);
  }
  throw new TypeError(`the request URL ${JSON.stringify(url.slice(0, 200))} is not under the governed fetch's baseUrl ${JSON.stringify(base)}`);
}

/** The request's body, read once to be replayed for each attempt. */
async function requestBody(request: Request, limit: number): Promise<Uint8Array<ArrayBuffer> | null> {
  if (request.body === null) {
    return null;
  }
  const { bytes, complete } = await readPrefix(request.body, limit);
  if (!complete) {
    throw new RangeError(`polygate: the request body is larger than maxRequestBody (${limit} bytes), which a governed fetch buffers to replay it`);
  }
  return bytes;
}

/** Up to limit bytes of a stream; complete says the stream ended within them. The stream is released either way. */
async function readPrefix(stream: ReadableStream<Uint8Array>, limit: number): Promise<{ bytes: Uint8Array<ArrayBuffer>; complete: boolean }> {
  const reader = stream.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  let complete = false;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) {
        complete = true;
        break;
      }
      chunks.push(value);
      size += value.length;
      if (size > limit) {
        break;
      }
    }
  } finally {
    if (!complete) {
      void reader.cancel().catch(() => {});
    }
    reader.releaseLock();
  }
  const bytes = new Uint8Array(Math.min(size, limit));
  let at = 0;
  for (const c of chunks) {
    const n = Math.min(c.length, bytes.length - at);
    bytes.set(c.subarray(0, n), at);
    at += n;
  }
  return { bytes, complete };
}

function isJSON(contentType: string | null): boolean {
  const mt = (contentType ?? "").split(";")[0]!.trim().toLowerCase();
  return mt === "application/json" || mt.endsWith("+json");
}

/**
 * An attempt's result from its response: a non-2xx body's first 64 KiB and
 * a JSON 2xx body (up to 4 MiB) are read from a copy, so that the caller
 * still reads the whole body; a 2xx that is not JSON is not read at all.
 */
async function resultOf(response: Response): Promise<AttemptResult<Response>> {
  const success = response.status >= 200 && response.status <= 299;
  let limit = MAX_ERROR_BODY;
  if (success) {
    const length = Number(response.headers.get("content-length") ?? "0");
    limit = isJSON(response.headers.get("content-type")) && !(length > MAX_USAGE_BODY) ? MAX_USAGE_BODY : 0;
  }
  let head: Uint8Array | undefined;
  let complete = false;
  if (limit > 0 && response.body !== null) {
    try {
      ({ bytes: head, complete } = await readPrefix(response.clone().body!, limit));
    } catch (e) {
      discard(response);
      return { ...classifyError(e), httpStatus: response.status };
    }
  }
  const { outcome, retryAfterMs } = classify(response.status, response.headers, head);
  return {
    outcome,
    retryAfterMs,
    httpStatus: response.status,
    actualTokens: success && complete ? totalTokens(head) : undefined,
    value: response,
  };
}

/**
 * The result of an attempt whose request threw, given the attempt's signal:
 * CANCELLED when the caller gave up, TRANSIENT for the source's timeout and
 * for a transport error (a refused or reset connection, a DNS failure).
 */
export function classifyError(e: unknown, signal?: AbortSignal): AttemptResult<never> {
  if (signal?.aborted) {
    const reason: unknown = signal.reason;
    if (reason instanceof AttemptTimeoutError) {
      return { outcome: "TRANSIENT", detail: reason.message };
    }
    return { outcome: "CANCELLED", detail: "the caller aborted the request" };
  }
  const cause = (e as { cause?: unknown }).cause;
  const detail = `${(e as Error).name ?? "Error"}: ${(e as Error).message ?? String(e)}` + (cause instanceof Error ? ` (${cause.message})` : "");
  return { outcome: "TRANSIENT", detail };
}

function discard(response: Response | undefined): void {
  if (response?.body != null && !response.bodyUsed) {
    void response.body.cancel().catch(() => {});
  }
}
