// Client: the sidecar's address, credentials and defaults, and what to do
// when the sidecar cannot be reached; runCall (loop.ts) runs each call.

import { createClient, type Client as RpcClient, type Transport } from "@connectrpc/connect";

import { AdmissionService } from "./gen/polygate/admission/v1/admission_pb.js";
import { connect, type TLSOptions } from "./connection.js";
import type { SidecarError } from "./errors.js";
import { runCall } from "./loop.js";
import { CallTrace, tracer, type Tracing } from "./tracing.js";
import type { AttemptFn, CallOptions, Grant, TracerProviderLike } from "./types.js";

/** What a call does when the sidecar cannot be reached. */
export type OnSidecarUnavailable = "fail" | "allow";

/**
 * The source an "allow" client calls directly for a scope while the sidecar
 * is unreachable and no call of the scope was granted a source yet.
 */
export interface Fallback {
  /** Its name (Grant.source, e.g. for prepare to pick its API key). */
  source: string;
  /** Its attributes (base_url...). */
  attributes?: Record<string, string>;
  /** Its timeout for one attempt, in milliseconds (0: none). */
  timeoutMs?: number;
}

const ENV_ADDR = "POLYGATE_ADDR";
const ENV_TOKEN = "POLYGATE_TOKEN";
const ENV_MODE = "POLYGATE_ON_SIDECAR_UNAVAILABLE";

/** Options of a Client. */
export interface ClientOptions {
  /**
   * The sidecar: "host:port", "[v6]:port" or "unix:///path"; default the
   * POLYGATE_ADDR environment variable.
   */
  addr?: string;
  /** Sent as "authorization: Bearer <token>" with every RPC; default POLYGATE_TOKEN. */
  token?: string;
  /**
   * undefined (the default): plaintext to a unix socket or a loopback
   * address, TLS with the system's roots to anything else; true: TLS with
   * the system's roots; false: plaintext; an object: its files.
   */
  tls?: boolean | TLSOptions;
  /** Every call's priority unless the call sets its own (default 0). */
  priority?: number;
  /** Every call's tenant unless the call sets its own (default: the scope's default tenant). */
  tenant?: string;
  /**
   * "fail": a call fails (UnavailableError) when the sidecar cannot be
   * reached. "allow": the call's attempt goes directly, ungoverned, to the
   * source the scope's calls last began on, or else to `fallback[scope]`;
   * each outage is logged once and every such attempt counted
   * (ungovernedAttempts). Default POLYGATE_ON_SIDECAR_UNAVAILABLE, else "fail".
   */
  onSidecarUnavailable?: OnSidecarUnavailable;
  /** Per scope, the source to call ungoverned when no call of the scope was granted one yet. */
  fallback?: Record<string, Fallback>;
  /** The OpenTelemetry provider of the call and attempt spans; default the global one; null: no spans. */
  tracerProvider?: TracerProviderLike | null;
  /** Where the client logs an outage of the sidecar (default console.warn). */
  log?: (message: string) => void;
  /** A connect Transport to the sidecar that the caller owns (addr, token and tls are then unused). */
  transport?: Transport;
}

/** A client of the polygate sidecar. Share one per process; close it at the end. */
export class Client {
  private readonly rpc: RpcClient<typeof AdmissionService>;
  private readonly closeConn: () => void;
  private readonly tracing: Promise<Tracing | undefined>;
  private readonly priority: number;
  private readonly tenant: string;
  private readonly mode: OnSidecarUnavailable;
  private readonly fallback: Record<string, Fallback>;
  private readonly log: (message: string) => void;
  private readonly target: string;
  private readonly lastGrant = new Map<string, Grant>();
  private outage = false;
  private ungoverned = 0;

  constructor(options: ClientOptions = {}) {
    if (options.transport !== undefined) {
      this.rpc = createClient(AdmissionService, options.transport);
      this.closeConn = () => {};
      this.target = "the caller's transport";
    } else {
      const addr = options.addr ?? process.env[ENV_ADDR] ?? "";
      if (addr.trim() === "") {
        throw new TypeError(`Client needs the sidecar's address: the addr option or $${ENV_ADDR} (host:port or unix:///path)`);
      }
      const conn = connect(addr, options.token ?? process.env[ENV_TOKEN]?.trim(), options.tls, {
        addr: options.addr === undefined ? `$${ENV_ADDR}` : "addr",
        token: options.token === undefined ? `$${ENV_TOKEN}` : "token",
      });
      this.rpc = createClient(AdmissionService, conn.transport);
      this.closeConn = conn.close;
      this.target = conn.target;
    }
    this.mode = modeOf(options.onSidecarUnavailable);
    this.fallback = options.fallback ?? {};
    this.priority = options.priority ?? 0;
    this.tenant = options.tenant ?? "";
    this.log = options.log ?? ((m) => console.warn(m));
    this.tracing = tracer(options.tracerProvider);
  }

  /** What a call does when the sidecar cannot be reached. */
  get onSidecarUnavailable(): OnSidecarUnavailable {
    return this.mode;
  }

  /** Attempts made without the sidecar while it was unreachable (onSidecarUnavailable: "allow"). */
  get ungovernedAttempts(): number {
    return this.ungoverned;
  }

  /**
   * Runs one call of scope: asks the sidecar for a source, runs
   * `fn(grant, signal)` for the attempt, reports its result and does what
   * the sidecar answers (done, retry after a backoff, wait, or fail) until
   * the call ends. Resolves to the `value` of the result that succeeded;
   * rejects with a CallFailedError subclass for a verdict, a SidecarError
   * subclass for a gRPC error, or the signal's reason when it aborts.
   */
  async call<T>(scope: string, fn: AttemptFn<T>, options: CallOptions = {}): Promise<T> {
    const trace = new CallTrace(await this.tracing, scope);
    return runCall(
      {
        rpc: this.rpc,
        trace,
        observe: (err) => this.observe(err),
        ungoverned: (s) => this.ungovernedGrant(s),
        allowUnreachable: this.mode === "allow",
        granted: (s, g) => {
          if (g.attempt <= 1) {
            this.lastGrant.set(s, g);
          }
        },
        now: () => performance.now(),
      },
      scope,
      fn,
      { ...options, priority: options.priority ?? this.priority, tenant: options.tenant ?? this.tenant },
    );
  }

  /** Closes the connection the client opened. */
  close(): void {
    this.closeConn();
  }

  /** Follows the sidecar's reachability: an outage of an "allow" client is logged when it begins and when it ends. */
  private observe(err: SidecarError | undefined): void {
    const down = err !== undefined && err.unreachable;
    if (down === this.outage) {
      return;
    }
    this.outage = down;
    if (this.mode !== "allow") {
      return;
    }
    this.log(
      down
        ? `polygate: the sidecar at ${this.target} is unreachable (${err.details.slice(0, 200)}); on_sidecar_unavailable=allow: ` +
            "attempts go directly to the source each scope's calls last began on, ungoverned, until it answers again"
        : `polygate: the sidecar at ${this.target} answers again; calls are governed again (${this.ungoverned} ungoverned attempts so far)`,
    );
  }

  /** The grant of an ungoverned attempt (runCall asks only when the client allows them). */
  private ungovernedGrant(scope: string): Grant | undefined {
    const g = this.lastGrant.get(scope);
    const f = this.fallback[scope];
    if (g === undefined && f === undefined) {
      return undefined;
    }
    this.ungoverned++;
    return {
      callId: "",
      source: g?.source ?? f?.source ?? "",
      attributes: { ...(g?.attributes ?? f?.attributes ?? {}) },
      attempt: 1,
      probe: false,
      timeoutMs: g?.timeoutMs ?? f?.timeoutMs ?? 0,
      permitId: "",
      ungoverned: true,
    };
  }
}

function modeOf(given: string | undefined): OnSidecarUnavailable {
  let where = "onSidecarUnavailable";
  if (given === undefined) {
    given = process.env[ENV_MODE] || "fail";
    where = `$${ENV_MODE}`;
  }
  if (given !== "fail" && given !== "allow") {
    throw new TypeError(`${where}: ${JSON.stringify(given.slice(0, 50))} is not allowed: fail or allow`);
  }
  return given;
}
