// The SDK's errors: admission verdicts and sidecar (gRPC) errors, under one
// base class.

import type { AttemptResult, SourceReason } from "./types.js";

/** Base class of every error the SDK throws. */
export class PolygateError extends Error {
  override name = "PolygateError";
}

/** Why the sidecar ended a call, as its API names it. */
export type FailureReason =
  | "circuit_open"
  | "quota_exhausted"
  | "stalled"
  | "retry_exhausted"
  | "non_retryable"
  | "deadline_exceeded"
  | "cancelled"
  | "retry_after_too_long"
  | "source_dead"
  | "scope_removed"
  | "budget_exhausted";

/** What a CallFailedError knows of the call. */
export interface CallFacts {
  scope: string;
  callId: string;
  /** Time until the earliest certain moment a new call could do better (0: none), in milliseconds. */
  retryAfterMs?: number;
  /** Each source's refusal, when the call failed waiting for one. */
  perSourceReasons?: SourceReason[];
  /** How many attempts the call made. */
  attempts?: number;
  /** The last attempt's result (its value may be the upstream's response). */
  lastResult?: AttemptResult<unknown> | undefined;
}

/**
 * The sidecar's verdict that ended a call. `reason` is the sidecar's failure
 * reason ("" for one this SDK does not know); the subclasses name them.
 */
export class CallFailedError extends PolygateError {
  override name = "CallFailedError";
  readonly reason: FailureReason | string;
  readonly scope: string;
  readonly callId: string;
  readonly retryAfterMs: number;
  readonly perSourceReasons: SourceReason[];
  readonly attempts: number;
  readonly lastResult: AttemptResult<unknown> | undefined;

  constructor(reason: FailureReason | string, facts: CallFacts) {
    super(message(reason, facts));
    this.reason = reason;
    this.scope = facts.scope;
    this.callId = facts.callId;
    this.retryAfterMs = facts.retryAfterMs ?? 0;
    this.perSourceReasons = facts.perSourceReasons ?? [];
    this.attempts = facts.attempts ?? 0;
    this.lastResult = facts.lastResult;
  }
}

function message(reason: string, f: CallFacts): string {
  let msg = `call ${f.callId} of scope ${f.scope} failed: ${reason}`;
  if ((f.retryAfterMs ?? 0) > 0) {
    msg += `, retry after ${((f.retryAfterMs ?? 0) / 1000).toFixed(3)}s`;
  }
  msg += ` (${f.attempts ?? 0} attempts`;
  if (f.lastResult !== undefined) {
    msg += `, last ${f.lastResult.outcome}`;
    if (f.lastResult.httpStatus) {
      msg += ` ${f.lastResult.httpStatus}`;
    }
  }
  msg += ")";
  const reasons = f.perSourceReasons ?? [];
  if (reasons.length > 0) {
    msg +=
      ": " +
      reasons.map((r) => `${r.source} ${r.reason}` + (r.retryAfterMs > 0 ? ` ${(r.retryAfterMs / 1000).toFixed(3)}s` : "")).join("; ");
  }
  return msg;
}

/** Every source refused the call: circuit_open, source_dead, quota_exhausted or stalled. */
export class AllSourcesExhaustedError extends CallFailedError {
  override name = "AllSourcesExhaustedError";
}
/** Every source's breaker refused the call and circuit_open is fail_fast. */
export class CircuitOpenError extends AllSourcesExhaustedError {
  override name = "CircuitOpenError";
}
/** Every source is OPEN because it is dead (auth or quota death) and source_dead is fail_fast. */
export class SourceDeadError extends AllSourcesExhaustedError {
  override name = "SourceDeadError";
}
/** A source's quota or pacer refused the call and quota_full is fail_fast. */
export class QuotaExhaustedError extends AllSourcesExhaustedError {
  override name = "QuotaExhaustedError";
}
/** The call waited longer than the stall window while its scope made no progress. */
export class StalledError extends AllSourcesExhaustedError {
  override name = "StalledError";
}
/** max_attempts real attempts failed (429s are not counted). */
export class RetryExhaustedError extends CallFailedError {
  override name = "RetryExhaustedError";
}
/** The upstream refused the request itself (CLIENT_ERROR). */
export class NonRetryableError extends CallFailedError {
  override name = "NonRetryableError";
}
/** The call's deadline passed, or the earliest certain retry is after it. */
export class DeadlineExceededError extends CallFailedError {
  override name = "DeadlineExceededError";
}
/** The call reported CANCELLED. */
export class CallCancelledError extends CallFailedError {
  override name = "CallCancelledError";
}
/** An upstream Retry-After was longer than the scope's backoff.max_retry_after. */
export class RetryAfterTooLongError extends CallFailedError {
  override name = "RetryAfterTooLongError";
}
/** A reload removed the call's scope. */
export class ScopeRemovedError extends CallFailedError {
  override name = "ScopeRemovedError";
}
/** The call's tenant spent its token budget; retryAfterMs is the time until the budget's window frees enough. */
export class BudgetExhaustedError extends CallFailedError {
  override name = "BudgetExhaustedError";
}

const VERDICTS: Record<FailureReason, new (reason: string, facts: CallFacts) => CallFailedError> = {
  circuit_open: CircuitOpenError,
  source_dead: SourceDeadError,
  quota_exhausted: QuotaExhaustedError,
  stalled: StalledError,
  retry_exhausted: RetryExhaustedError,
  non_retryable: NonRetryableError,
  deadline_exceeded: DeadlineExceededError,
  cancelled: CallCancelledError,
  retry_after_too_long: RetryAfterTooLongError,
  scope_removed: ScopeRemovedError,
  budget_exhausted: BudgetExhaustedError,
};

/** The error of a verdict: its subclass, or CallFailedError for a reason this SDK does not know. */
export function verdictError(reason: string, facts: CallFacts): CallFailedError {
  const cls = (VERDICTS as Record<string, (new (reason: string, facts: CallFacts) => CallFailedError) | undefined>)[reason];
  return cls === undefined ? new CallFailedError(reason, facts) : new cls(reason, facts);
}

/** A gRPC status code, as gRPC names it. */
export type StatusCode =
  | "CANCELLED"
  | "UNKNOWN"
  | "INVALID_ARGUMENT"
  | "DEADLINE_EXCEEDED"
  | "NOT_FOUND"
  | "ALREADY_EXISTS"
  | "PERMISSION_DENIED"
  | "RESOURCE_EXHAUSTED"
  | "FAILED_PRECONDITION"
  | "ABORTED"
  | "OUT_OF_RANGE"
  | "UNIMPLEMENTED"
  | "INTERNAL"
  | "UNAVAILABLE"
  | "DATA_LOSS"
  | "UNAUTHENTICATED";

/** What a SidecarError knows. */
export interface SidecarFacts {
  /** The google.rpc.ErrorInfo reason (an ErrorReason name such as ERROR_REASON_UNKNOWN_SCOPE), "" if none. */
  reason?: string;
  /** The ErrorInfo's metadata (e.g. `field` for a bad field). */
  metadata?: Record<string, string>;
  /** The sidecar could not be reached at all (no answer, as opposed to an answer of UNAVAILABLE). */
  unreachable?: boolean;
  /** The call's attempts so far, and the last one's result, when the error ended a call that had begun. */
  attempts?: number;
  lastResult?: AttemptResult<unknown> | undefined;
}

/**
 * A gRPC error of the sidecar: misuse or infrastructure, never a verdict.
 * `code` is the gRPC status code, `details` its message, `method` the RPC.
 */
export class SidecarError extends PolygateError {
  override name = "SidecarError";
  readonly method: string;
  readonly code: StatusCode;
  readonly details: string;
  readonly reason: string;
  readonly metadata: Record<string, string>;
  readonly unreachable: boolean;
  readonly attempts: number;
  readonly lastResult: AttemptResult<unknown> | undefined;

  constructor(method: string, code: StatusCode, details: string, facts: SidecarFacts = {}) {
    const reason = facts.reason ?? "";
    super(`${method}: ${code}${reason ? " " + reason : ""}: ${details}`);
    this.method = method;
    this.code = code;
    this.details = details;
    this.reason = reason;
    this.metadata = facts.metadata ?? {};
    this.unreachable = facts.unreachable ?? false;
    this.attempts = facts.attempts ?? 0;
    this.lastResult = facts.lastResult;
  }
}

/** A request field is not allowed (metadata.field names it). */
export class InvalidArgumentError extends SidecarError {
  override name = "InvalidArgumentError";
}
/** Unknown scope, or unknown or expired call. */
export class NotFoundError extends SidecarError {
  override name = "NotFoundError";
}
/** A permit not of this call, a call that ended, Pick while holding a permit. */
export class FailedPreconditionError extends SidecarError {
  override name = "FailedPreconditionError";
}
/** Too many live calls. */
export class ResourceExhaustedError extends SidecarError {
  override name = "ResourceExhaustedError";
}
/** The sidecar is unreachable (`unreachable`), or its shared backend is down and the scope fails closed. */
export class UnavailableError extends SidecarError {
  override name = "UnavailableError";
}
/** Missing or wrong bearer token. */
export class UnauthenticatedError extends SidecarError {
  override name = "UnauthenticatedError";
}
/** The sidecar failed. */
export class InternalError extends SidecarError {
  override name = "InternalError";
}

/** The one table from gRPC status codes to the SDK's errors; other codes are SidecarError. */
const STATUS_ERRORS: Partial<Record<StatusCode, new (method: string, code: StatusCode, details: string, facts?: SidecarFacts) => SidecarError>> = {
  INVALID_ARGUMENT: InvalidArgumentError,
  NOT_FOUND: NotFoundError,
  FAILED_PRECONDITION: FailedPreconditionError,
  RESOURCE_EXHAUSTED: ResourceExhaustedError,
  UNAVAILABLE: UnavailableError,
  UNAUTHENTICATED: UnauthenticatedError,
  INTERNAL: InternalError,
};

/** The SidecarError for a status code. */
export function sidecarError(method: string, code: StatusCode, details: string, facts: SidecarFacts = {}): SidecarError {
  const cls = STATUS_ERRORS[code] ?? SidecarError;
  return new cls(method, code, details, facts);
}
