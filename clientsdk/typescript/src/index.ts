// polygate-sdk: the thin TypeScript client of the polygate governance
// sidecar. governedFetch governs every request of a fetch-based client
// (openai-node, the Vercel AI SDK); Client.call runs the admission loop around
// an attempt of the application's own.

export { Client, type ClientOptions, type Fallback, type OnSidecarUnavailable } from "./client.js";
export { classifyError, failureOf, governedFetch, type Fetch, type GovernedFetchOptions } from "./fetch.js";
export { classify, retryHintMs, totalTokens, MAX_RETRY_HINT_MS, type Classification, type Outcome } from "./classify.js";
export { CALL_ID, FAILURE_REASON, RETRY_AFTER } from "./answer.js";
export type { TLSOptions } from "./connection.js";
export type { AttemptFn, AttemptResult, CallOptions, Grant, SourceReason, TracerProviderLike } from "./types.js";
export {
  AllSourcesExhaustedError,
  BudgetExhaustedError,
  CallCancelledError,
  CallFailedError,
  CircuitOpenError,
  DeadlineExceededError,
  FailedPreconditionError,
  InternalError,
  InvalidArgumentError,
  NonRetryableError,
  NotFoundError,
  PolygateError,
  QuotaExhaustedError,
  ResourceExhaustedError,
  RetryAfterTooLongError,
  RetryExhaustedError,
  ScopeRemovedError,
  SidecarError,
  SourceDeadError,
  StalledError,
  UnauthenticatedError,
  UnavailableError,
  type FailureReason,
  type StatusCode,
} from "./errors.js";
export { VERSION } from "./version.js";
