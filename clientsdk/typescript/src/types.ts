// The values an application sees: grants, attempt results, refusals, options.

import type { Outcome } from "./classify.js";

/** The sidecar's permit to make one attempt on one source now. */
export interface Grant {
  callId: string;
  /** The granted source's name. */
  source: string;
  /** The source's configured attributes (base_url, model...); never secrets. */
  attributes: Record<string, string>;
  /** The attempt's number in the call, from 1. */
  attempt: number;
  /** The attempt is the HALF_OPEN probe of the source's breaker. */
  probe: boolean;
  /** The source's configured timeout for one attempt, in milliseconds (0: none). */
  timeoutMs: number;
  permitId: string;
  /**
   * The sidecar was unreachable and `onSidecarUnavailable: "allow"` let the
   * attempt through without a permit (to the source last granted, or the
   * configured fallback); nothing is reported for it.
   */
  ungoverned: boolean;
}

/** What an attempt reports; `value` is what `call` returns when it succeeded. */
export interface AttemptResult<T> {
  outcome: Outcome;
  /**
   * The upstream's retry hint (Retry-After and friends) in milliseconds: a
   * floor of the sidecar's backoff. Negative or NaN is sent as 0, more than
   * 24 h as 24 h.
   */
  retryAfterMs?: number;
  /** The upstream's HTTP status, for telemetry (0: none). */
  httpStatus?: number;
  /** A short note for the sidecar's logs (cut to 1024 bytes). */
  detail?: string;
  /** Tokens the attempt really used, settling its TPM charge; undefined keeps the estimate. */
  actualTokens?: number | undefined;
  /** What the attempt produced (e.g. the upstream's response). */
  value?: T;
}

/** The application's attempt: it gets the grant and a signal that aborts with the caller's or after the source's timeout. */
export type AttemptFn<T> = (grant: Grant, signal: AbortSignal) => Promise<AttemptResult<T>> | AttemptResult<T>;

/** One source's refusal of the call's last Pick. */
export interface SourceReason {
  source: string;
  /** cooldown, circuit_open, probe_in_flight, forced_open, adaptive_paced, rate_limited, queued, tenant_limit or tenant_budget. */
  reason: string;
  /** Time until this source's earliest certain retry, in milliseconds (0 when there is none). */
  retryAfterMs: number;
}

/** Options of one call. */
export interface CallOptions {
  /** Tokens charged to the TPM quota of each attempt's source, settled by actualTokens. */
  estimatedTokens?: number;
  /**
   * The call's budget in milliseconds from now: the sidecar never waits or
   * backs off past it and fails the call deadline_exceeded when the earliest
   * certain retry is after it.
   */
  deadlineMs?: number;
  /** Higher is served first while callers wait for a source's capacity (default: the client's). */
  priority?: number;
  /** Who the call is for: callers share a source's capacity by tenant weights (default: the client's). */
  tenant?: string;
  /**
   * Aborting it gives the call up: the attempt in flight is aborted, the
   * sidecar is told (CancelCall, which frees a held permit at once) and the
   * call rejects with the signal's reason.
   */
  signal?: AbortSignal | undefined;
}

/**
 * The part of an OpenTelemetry TracerProvider the SDK uses (declared here so
 * that the package's types need no @opentelemetry/api).
 */
export interface TracerProviderLike {
  getTracer(name: string, version?: string): unknown;
}
