// OpenTelemetry spans of a call, when @opentelemetry/api is installed; without
// it every method does nothing.
//
// A call is a `polygate.call` span under the caller's active span, and each
// attempt a `polygate.attempt` span under it: the attempt's span begins with
// the Pick that seeks its permit (so its waits are in it), is the active span
// while the application's attempt runs, and ends with the sidecar's answer to
// its outcome. Every RPC to the sidecar carries the W3C trace context of the
// span it belongs to, so the sidecar's own spans join the trace.

import type * as otel from "@opentelemetry/api";

import type { AttemptResult, Grant, SourceReason, TracerProviderLike } from "./types.js";
import { CallFailedError } from "./errors.js";
import { VERSION } from "./version.js";

type Api = typeof otel;

let api: Promise<Api | undefined> | undefined;

/** @opentelemetry/api, once imported; undefined when it is not installed. */
function loadOtel(): Promise<Api | undefined> {
  // A CommonJS package: its exports are named, or under default.
  api ??= import("@opentelemetry/api").then(
    (m) => ((m as Partial<Api>).trace !== undefined ? (m as Api) : (m as unknown as { default: Api }).default),
    () => undefined,
  );
  return api;
}

/** The SDK's tracer: from provider, or the global one (no spans unless the application set a provider). */
export async function tracer(provider: TracerProviderLike | null | undefined): Promise<Tracing | undefined> {
  if (provider === null) {
    return undefined;
  }
  const o = await loadOtel();
  if (o === undefined) {
    return undefined;
  }
  const t = provider === undefined ? o.trace.getTracer("polygate", VERSION) : (provider.getTracer("polygate", VERSION) as otel.Tracer);
  return { api: o, tracer: t };
}

/** A tracer and the API it came with. */
export interface Tracing {
  api: Api;
  tracer: otel.Tracer;
}

/** The spans of one call; every method is a no-op without a tracer. */
export class CallTrace {
  private call: otel.Span | undefined;
  private attemptSpan: otel.Span | undefined;
  private waits = 0;

  constructor(
    private readonly t: Tracing | undefined,
    private readonly scope: string,
  ) {}

  /** Opens the call's span under the active context. */
  start(): void {
    if (this.t === undefined) {
      return;
    }
    this.call = this.t.tracer.startSpan("polygate.call", { attributes: { "polygate.scope": this.scope } });
  }

  /** Opens attempt `n`'s span (ending the previous one). */
  startAttempt(n: number): void {
    if (this.t === undefined || this.call === undefined) {
      return;
    }
    this.endAttempt();
    const ctx = this.t.api.trace.setSpan(this.t.api.context.active(), this.call);
    this.attemptSpan = this.t.tracer.startSpan(
      "polygate.attempt",
      { attributes: { "polygate.scope": this.scope, "polygate.attempt": n } },
      ctx,
    );
  }

  callId(id: string): void {
    this.call?.setAttribute("polygate.call_id", id);
  }

  granted(g: Grant): void {
    this.attemptSpan?.setAttributes({ "polygate.source": g.source, "polygate.attempt": g.attempt, "polygate.probe": g.probe });
  }

  /** One wait for capacity: how long, and each source's refusal. */
  waited(sleepMs: number, reasons: SourceReason[]): void {
    const span = this.attemptSpan;
    if (span === undefined || !span.isRecording()) {
      return;
    }
    const cause = reasons.map((r) => `${r.source}=${r.reason}`).join(",");
    this.waits++;
    span.addEvent("wait", { "polygate.wait.cause": cause, "polygate.wait.sleep_s": sleepMs / 1000 });
    span.setAttributes({ "polygate.waits": this.waits, "polygate.wait.cause": cause });
  }

  /** The attempt's outcome and the sidecar's answer to it; ends the attempt's span. */
  reported(result: AttemptResult<unknown>, verdict: string, reason = "", backoffMs?: number): void {
    const span = this.attemptSpan;
    if (span !== undefined && span.isRecording() && this.t !== undefined) {
      const attrs: otel.Attributes = { "polygate.outcome": result.outcome, "polygate.verdict": verdict };
      if (result.httpStatus) {
        attrs["polygate.http_status"] = result.httpStatus;
      }
      if (reason) {
        attrs["polygate.reason"] = reason;
      }
      if (backoffMs !== undefined) {
        attrs["polygate.backoff_s"] = backoffMs / 1000;
      }
      span.setAttributes(attrs);
      if (result.outcome !== "SUCCESS") {
        span.setStatus({ code: this.t.api.SpanStatusCode.ERROR, message: result.outcome });
      }
    }
    this.endAttempt();
  }

  private endAttempt(): void {
    this.attemptSpan?.end();
    this.attemptSpan = undefined;
    this.waits = 0;
  }

  /** Ends the spans with the call's result: done (err undefined), a verdict, a cancel or an error. */
  end(attempts: number, err: unknown, cancelled: boolean): void {
    if (this.call === undefined || this.t === undefined) {
      return;
    }
    let attrs: otel.Attributes = { "polygate.verdict": "done" };
    if (err instanceof CallFailedError) {
      attrs = { "polygate.verdict": "failure", "polygate.reason": err.reason };
    } else if (cancelled) {
      attrs = { "polygate.verdict": "cancelled" };
    } else if (err !== undefined) {
      attrs = { "polygate.verdict": "error", "polygate.error": err instanceof Error ? err.name : typeof err };
    }
    for (const span of [this.attemptSpan, this.call]) {
      if (span === undefined || !span.isRecording()) {
        continue;
      }
      span.setAttributes(attrs);
      if (err !== undefined) {
        span.setStatus({ code: this.t.api.SpanStatusCode.ERROR, message: err instanceof Error ? err.name : String(err) });
      }
    }
    this.endAttempt();
    this.call.setAttribute("polygate.attempts", attempts);
    this.call.end();
    this.call = undefined;
  }

  /** The W3C trace context of the current span (the attempt's, else the call's), as RPC headers. */
  headers(): Record<string, string> {
    const span = this.attemptSpan ?? this.call;
    if (span === undefined) {
      return {};
    }
    const sc = span.spanContext();
    if (this.t === undefined || !this.t.api.isSpanContextValid(sc)) {
      return {};
    }
    const out: Record<string, string> = {
      traceparent: `00-${sc.traceId}-${sc.spanId}-${(sc.traceFlags & 0xff).toString(16).padStart(2, "0")}`,
    };
    const state = sc.traceState?.serialize();
    if (state) {
      out.tracestate = state;
    }
    return out;
  }

  /** Runs fn with the attempt's span active (for the application's attempt). */
  inAttempt<R>(fn: () => R): R {
    if (this.t === undefined || this.attemptSpan === undefined) {
      return fn();
    }
    return this.t.api.context.with(this.t.api.trace.setSpan(this.t.api.context.active(), this.attemptSpan), fn);
  }
}
