// The call loop, the one place that decides what each answer of the sidecar
// makes the SDK do:
//
//   Pick → Grant → attempt → RecordOutcome → Done | Retry(backoff) | Failure
//        → NoRunnable → OnNoRunnable → Wait(sleep) | Failure
//        → Failure
//
// and how a call that ends without a verdict of the sidecar is reported: the
// caller's abort, the call's deadline passing while an RPC is unanswered, an
// attempt function that throws or an RPC that fails all send CancelCall
// (which settles a held permit as CANCELLED), bounded and detached from the
// caller's signal. clientsdk/conformance/ scripts every one of these paths.

import type { Client as RpcClient } from "@connectrpc/connect";
import { durationMs as protoDurationMs, type Duration } from "@bufbuild/protobuf/wkt";

import {
  AdmissionService,
  FailureReason as PbFailureReason,
  Outcome as PbOutcome,
  Reason as PbReason,
  type Failure as PbFailure,
  type Grant as PbGrant,
  type SourceReason as PbSourceReason,
} from "./gen/polygate/admission/v1/admission_pb.js";
import type { Outcome } from "./classify.js";
import { MAX_RETRY_HINT_MS } from "./classify.js";
import { rpcError } from "./connection.js";
import { CallFailedError, DeadlineExceededError, PolygateError, SidecarError, sidecarError, verdictError } from "./errors.js";
import type { CallTrace } from "./tracing.js";
import type { AttemptFn, AttemptResult, CallOptions, Grant, SourceReason } from "./types.js";

/** Bound of a CancelCall, and the least time a RecordOutcome gets. */
const REPORT_TIMEOUT_MS = 2000;
/** How much longer than the call's deadline an RPC may take: the sidecar ends its waits at the deadline itself. */
const RPC_GRACE_MS = 1000;

const MAX_DETAIL = 1024;
const MAX_INT32 = 2 ** 31 - 1;
const MAX_INT64 = 2n ** 63n - 1n;
/** The longest a Node.js timer waits: a longer delay would fire at once. */
const MAX_TIMER_MS = 2 ** 31 - 1;
/** The longest RPC timeout: gRPC writes it in at most 8 digits (of milliseconds here, 27 hours). */
const MAX_RPC_TIMEOUT_MS = 99_999_999;
/** The longest deadline a google.protobuf.Duration holds (10 000 years). */
const MAX_DEADLINE_MS = 315_576_000_000_000;

/** x truncated and saturated to [lo, hi]; 0 when it is not a number. */
function saturate(x: number, lo: number, hi: number): number {
  return Number.isNaN(x) ? 0 : Math.max(lo, Math.min(Math.trunc(x), hi));
}

/** What the loop needs of its client. */
export interface LoopEnv {
  rpc: RpcClient<typeof AdmissionService>;
  trace: CallTrace;
  /** Called with every RPC's error before the loop looks at it, and with undefined after every answer. */
  observe(err: SidecarError | undefined): void;
  /**
   * When the sidecar is unreachable and allowUnreachable: the grant of an
   * attempt to make without it, counted; undefined to fail.
   */
  ungoverned(scope: string): Grant | undefined;
  /** Whether the client lets calls through while the sidecar is unreachable. */
  allowUnreachable: boolean;
  /** Remembers a grant, for ungoverned attempts. */
  granted(scope: string, g: Grant): void;
  now(): number;
}

const OUTCOMES: Record<Outcome, PbOutcome> = {
  SUCCESS: PbOutcome.SUCCESS,
  TRANSIENT: PbOutcome.TRANSIENT,
  RATE_LIMITED: PbOutcome.RATE_LIMITED,
  SOURCE_DEAD: PbOutcome.SOURCE_DEAD,
  CLIENT_ERROR: PbOutcome.CLIENT_ERROR,
  CANCELLED: PbOutcome.CANCELLED,
};

/**
 * A failure reason as the API's documents spell it ("circuit_open"): the
 * generated enum's name, lowered; "" for UNSPECIFIED or a value the
 * generated code does not know.
 */
function failureName(r: PbFailureReason): string {
  return r === PbFailureReason.UNSPECIFIED ? "" : (PbFailureReason[r]?.toLowerCase() ?? "");
}

/** A Duration in milliseconds, 0 when unset. */
function ms(d: Duration | undefined): number {
  return d === undefined ? 0 : protoDurationMs(d);
}

/** A non-negative number of milliseconds as a Duration, exact to the nanosecond. */
function duration(msValue: number): { seconds: bigint; nanos: number } {
  const ns = Math.round(msValue * 1e6);
  return { seconds: BigInt(Math.floor(ns / 1e9)), nanos: ns % 1e9 };
}

function truncate(s: string, n: number): string {
  const bytes = new TextEncoder().encode(s);
  if (bytes.length <= n) {
    return s;
  }
  return new TextDecoder().decode(bytes.slice(0, n)).replace(/\uFFFD+$/, "");
}

function sourceReasons(rs: PbSourceReason[]): SourceReason[] {
  return rs.map((r) => ({ source: r.source, reason: PbReason[r.reason]?.toLowerCase() ?? String(r.reason), retryAfterMs: ms(r.retryAfter) }));
}

/** Sleeps ms, or rejects with the signal's reason when it aborts first. */
function sleep(msValue: number, signal: AbortSignal | undefined): Promise<void> {
  if (!(msValue > 0)) {
    return signal?.aborted ? Promise.reject(signal.reason) : Promise.resolve();
  }
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, Math.min(Math.ceil(msValue), MAX_TIMER_MS));
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** The caller's deadline for an attempt: "the source's timeout passed" as an abort reason. */
export class AttemptTimeoutError extends Error {
  override name = "TimeoutError";
}

/** Runs one call of scope (see Client.call). */
export async function runCall<T>(env: LoopEnv, scope: string, fn: AttemptFn<T>, opts: CallOptions & { priority: number; tenant: string }): Promise<T> {
  const { trace } = env;
  const signal = opts.signal;
  signal?.throwIfAborted();
  const end = opts.deadlineMs === undefined ? undefined : env.now() + opts.deadlineMs;
  let callId = "";
  let attempts = 0;
  let last: AttemptResult<T> | undefined;
  let verdict = false; // the call ended by the sidecar's Failure
  const facts = (): { scope: string; callId: string; attempts: number; lastResult: AttemptResult<T> | undefined } => ({
    scope,
    callId,
    attempts,
    lastResult: last,
  });
  const deadlineExceeded = (): DeadlineExceededError => new DeadlineExceededError("deadline_exceeded", facts());
  const failure = (f: PbFailure, refused: PbSourceReason[] = []): CallFailedError => {
    verdict = true;
    const reasons = f.perSourceReasons.length > 0 ? f.perSourceReasons : refused;
    return verdictError(failureName(f.reason), {
      ...facts(),
      retryAfterMs: ms(f.retryAfter),
      perSourceReasons: sourceReasons(reasons),
    });
  };
  // The RPC's timeout: what is left of the deadline plus a grace (the sidecar
  // knows the deadline and answers by it, with a verdict), and at least a
  // report's bound for a RecordOutcome, which must settle the permit.
  const timeoutMs = (report: boolean): number | undefined => {
    if (end === undefined) {
      return undefined;
    }
    const left = end - env.now();
    if (report) {
      return Math.min(Math.ceil(Math.max(left, REPORT_TIMEOUT_MS)), MAX_RPC_TIMEOUT_MS);
    }
    if (left <= 0) {
      throw deadlineExceeded();
    }
    return Math.min(Math.ceil(left + RPC_GRACE_MS), MAX_RPC_TIMEOUT_MS); // gRPC timeouts are whole units
  };
  const call = async <R>(method: string, send: (o: { timeoutMs?: number; signal?: AbortSignal; headers: Record<string, string> }) => Promise<R>, report = false): Promise<R> => {
    const t = timeoutMs(report);
    try {
      const answer = await send({ ...(t === undefined ? {} : { timeoutMs: t }), ...(signal === undefined ? {} : { signal }), headers: trace.headers() });
      env.observe(undefined);
      return answer;
    } catch (e) {
      signal?.throwIfAborted();
      const err = rpcError(method, e, { attempts, lastResult: last });
      env.observe(err);
      if (end !== undefined && (err.code === "DEADLINE_EXCEEDED" || env.now() >= end)) {
        throw deadlineExceeded();
      }
      throw err;
    }
  };

  // The call as the sidecar governs it.
  const governed = async (): Promise<T> => {
    if (opts.deadlineMs !== undefined && !(opts.deadlineMs > 0)) {
      throw deadlineExceeded();
    }
    let pick = await call("Pick", (o) =>
      env.rpc.pick(
        {
          scope,
          estimatedTokens: BigInt(saturate(opts.estimatedTokens ?? 0, 0, Number.MAX_SAFE_INTEGER)),
          priority: saturate(opts.priority, -MAX_INT32 - 1, MAX_INT32),
          tenant: opts.tenant,
          ...(opts.deadlineMs === undefined ? {} : { deadline: duration(Math.min(opts.deadlineMs, MAX_DEADLINE_MS)) }),
        },
        o,
      ),
    );
    callId = pick.callId;
    trace.callId(callId);
    for (;;) {
      const r = pick.result;
      if (r.case === "grant") {
        const g = toGrant(callId, r.value);
        env.granted(scope, g);
        attempts++;
        trace.granted(g);
        const result = await attempt(fn, g, signal, trace);
        last = result;
        if (signal?.aborted && result.outcome !== "SUCCESS") {
          throw signal.reason;
        }
        const req = recordRequest(scope, g, result);
        const rec =
          signal?.aborted === true // a success the caller no longer waits for: still reported, on a bound of its own
            ? await call("RecordOutcome", (o) => env.rpc.recordOutcome(req, { headers: o.headers, timeoutMs: REPORT_TIMEOUT_MS }), true)
            : await call("RecordOutcome", (o) => env.rpc.recordOutcome(req, o), true);
        const next = rec.next;
        if (next.case === "done") {
          trace.reported(result, "done");
          return result.value as T;
        }
        if (next.case === "failure") {
          trace.reported(result, "failure", failureName(next.value.reason));
          throw failure(next.value);
        }
        if (next.case !== "retry") {
          throw new PolygateError(`RecordOutcome of call ${callId} answered no next action`);
        }
        const backoff = ms(next.value.backoff);
        trace.reported(result, "retry", "", backoff);
        await sleep(backoff, signal);
        trace.startAttempt(attempts + 1);
      } else if (r.case === "noRunnable") {
        const d = await call("OnNoRunnable", (o) => env.rpc.onNoRunnable({ scope, callId }, o));
        if (d.decision.case === "failure") {
          throw failure(d.decision.value, r.value.perSourceReasons);
        }
        if (d.decision.case !== "wait") {
          throw new PolygateError(`OnNoRunnable of call ${callId} answered no decision`);
        }
        const s = ms(d.decision.value.sleep);
        trace.waited(s, sourceReasons(r.value.perSourceReasons));
        await sleep(s, signal);
      } else if (r.case === "failure") {
        throw failure(r.value);
      } else {
        throw new PolygateError(`Pick of call ${callId} answered no result`);
      }
      pick = await call("Pick", (o) => env.rpc.pick({ scope, callId }, o));
    }
  };

  // The call once the sidecar was found unreachable, when the client lets
  // calls through: an attempt already made stands (its value if it
  // succeeded, else err with it as lastResult, for a governed fetch to hand
  // its response over); with none made, one attempt goes to the source the
  // client knows, without a permit and reported to nobody.
  const ungoverned = async (err: SidecarError): Promise<T> => {
    if (last === undefined) {
      const g = env.ungoverned(scope);
      if (g === undefined) {
        throw err;
      }
      attempts++;
      trace.granted(g);
      last = await attempt(fn, g, signal, trace);
      trace.reported(last, "ungoverned");
    }
    if (last.outcome === "SUCCESS") {
      return last.value as T;
    }
    throw sidecarError(err.method, err.code, err.details, { reason: err.reason, metadata: err.metadata, unreachable: true, attempts, lastResult: last });
  };

  trace.start();
  trace.startAttempt(1);
  let err: unknown;
  try {
    try {
      return await governed();
    } catch (e) {
      if (!(e instanceof SidecarError && e.unreachable && env.allowUnreachable) || signal?.aborted) {
        throw e;
      }
      return await ungoverned(e);
    }
  } catch (e) {
    err = e;
    if (callId !== "" && !verdict) {
      // Without a verdict the sidecar does not know the call ended.
      try {
        await env.rpc.cancelCall({ scope, callId }, { timeoutMs: REPORT_TIMEOUT_MS, headers: trace.headers() });
      } catch {
        // the permit's lease frees it; the sidecar forgets the call after calls.idle_timeout
      }
    }
    throw e;
  } finally {
    trace.end(attempts, err, signal?.aborted === true && !(err instanceof CallFailedError));
  }
}

function toGrant(callId: string, g: PbGrant): Grant {
  return {
    callId,
    source: g.source,
    attributes: { ...g.attributes },
    attempt: g.attempt,
    probe: g.probe,
    timeoutMs: ms(g.timeout),
    permitId: g.permitId,
    ungoverned: false,
  };
}

/**
 * Runs the application's attempt with the grant's span active and a signal
 * that aborts with the caller's, or after the source's timeout until the
 * attempt returns. A throw of the attempt function propagates (the loop then
 * cancels the call); a result that is not one is an error.
 */
async function attempt<T>(fn: AttemptFn<T>, g: Grant, signal: AbortSignal | undefined, trace: CallTrace): Promise<AttemptResult<T>> {
  const timeout = new AbortController();
  const timer =
    g.timeoutMs > 0
      ? setTimeout(() => timeout.abort(new AttemptTimeoutError(`source ${g.source} timed out after ${g.timeoutMs} ms`)), Math.min(g.timeoutMs, MAX_TIMER_MS))
      : undefined;
  const attemptSignal = signal === undefined ? timeout.signal : AbortSignal.any([signal, timeout.signal]);
  try {
    const result = await trace.inAttempt(() => fn(g, attemptSignal));
    if (typeof result !== "object" || result === null || !(result.outcome in OUTCOMES)) {
      throw new TypeError(`the attempt on source ${g.source} returned ${String(result).slice(0, 200)}, not an AttemptResult`);
    }
    return result;
  } finally {
    clearTimeout(timer);
  }
}

function recordRequest<T>(scope: string, g: Grant, r: AttemptResult<T>) {
  const hint = r.retryAfterMs === undefined || Number.isNaN(r.retryAfterMs) || r.retryAfterMs <= 0 ? 0 : Math.min(r.retryAfterMs, MAX_RETRY_HINT_MS);
  const status = r.httpStatus ?? 0;
  const tokens = r.actualTokens;
  return {
    scope,
    callId: g.callId,
    permitId: g.permitId,
    outcome: OUTCOMES[r.outcome],
    detail: truncate(r.detail ?? "", MAX_DETAIL),
    ...(hint > 0 ? { retryAfterHint: duration(hint) } : {}),
    ...(status >= 100 && status <= 599 ? { httpStatus: Math.trunc(status) } : {}),
    ...(tokens !== undefined && Number.isFinite(tokens) && tokens >= 0
      ? { actualTokens: BigInt(Math.trunc(tokens)) > MAX_INT64 ? MAX_INT64 : BigInt(Math.trunc(tokens)) }
      : {}),
  };
}
