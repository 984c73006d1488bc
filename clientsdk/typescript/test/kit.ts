// The TypeScript runner of the conformance kit (clientsdk/conformance): it
// plays the application's side of each exchange with a Client and a governed
// fetch against the kit's fake sidecar, and returns every difference, the
// fake's and its own.

import { isDeepStrictEqual } from "node:util";

import { Client, UnavailableError, governedFetch } from "../src/index.js";
import { TIMEOUT_MS, binary, start, type Started } from "./procs.js";

/** An exchange, as far as the runner reads it (clientsdk/conformance/README.md). */
export interface Exchange {
  name: string;
  scope?: string;
  client?: {
    on_sidecar_unavailable?: "fail" | "allow";
    fallback?: { source: string };
    priority?: number;
    tenant?: string;
    token?: string;
    tls?: "tls" | "mtls";
  };
  calls: Call[];
  script: unknown[];
}

interface Call {
  sidecar_down?: boolean;
  request: { method: string; path: string; headers?: Record<string, string>; body?: string };
  options?: { estimated_tokens?: number; deadline_ms?: number; priority?: number; tenant?: string };
  abort_after?: number;
  app_sees: {
    error?: "aborted" | "unavailable";
    status?: number;
    headers?: Record<string, string | null>;
    body?: string;
    body_json?: Record<string, unknown>;
  };
}

/** Where an exchange's sidecar and upstream listen, and the PEMs of a TLS one. */
export interface Endpoints {
  sidecar: string;
  upstream: string;
  tls?: { ca: string; client_cert?: string; client_key?: string };
}

/** The placeholder the application's requests are written against. */
const PLACEHOLDER = "http://polygate.invalid";

/** The kit's fake sidecar and its control API. */
export class Kit {
  private constructor(
    private readonly url: string,
    private readonly proc: Started,
  ) {}

  /** Starts the fake sidecar on a free port. */
  static async start(): Promise<Kit> {
    const p = await start(binary("POLYGATE_FAKESIDECAR_BIN", "./clientsdk/conformance/fakesidecar"), ["--exit-on-stdin-eof"], "fakesidecar listening on ");
    return new Kit(p.addr, p);
  }

  stop(): Promise<void> {
    return this.proc.stop();
  }

  private async fetch(path: string, init?: RequestInit): Promise<Response> {
    const r = await fetch(this.url + path, init);
    if (!r.ok) {
      throw new Error(`fakesidecar ${path}: ${r.status} ${await r.text()}`);
    }
    return r;
  }

  /**
   * Runs one exchange (its JSON text); resolves to every difference found,
   * none when the SDK conformed. resultWaitMs bounds the wait for steps that
   * have not come when the application is done.
   */
  async run(text: string, resultWaitMs = TIMEOUT_MS): Promise<string[]> {
    const ex = JSON.parse(text) as Exchange;
    const ep = await this.begin(text);
    const fallback = ex.client?.fallback;
    const logs: string[] = [];
    const client = new Client({
      addr: ep.sidecar,
      onSidecarUnavailable: ex.client?.on_sidecar_unavailable ?? "fail",
      ...(fallback === undefined ? {} : { fallback: { [ex.scope ?? "chat"]: { source: fallback.source, attributes: { base_url: `${ep.upstream}/${fallback.source}` } } } }),
      ...(ex.client?.priority === undefined ? {} : { priority: ex.client.priority }),
      ...(ex.client?.tenant === undefined ? {} : { tenant: ex.client.tenant }),
      token: ex.client?.token ?? "",
      ...(ep.tls === undefined ? {} : { tls: { ca: ep.tls.ca, ...(ep.tls.client_cert === undefined ? {} : { cert: ep.tls.client_cert, key: ep.tls.client_key! }) } }),
      tracerProvider: null,
      log: (m) => logs.push(m),
    });
    const problems: string[] = [];
    try {
      for (const [i, call] of ex.calls.entries()) {
        if (call.sidecar_down) {
          await this.stopSidecar();
        }
        for (const p of await this.call(client, ex.scope ?? "chat", call)) {
          problems.push(`calls[${i}]: ${p}`);
        }
      }
    } finally {
      client.close();
    }
    const report = await this.result(resultWaitMs);
    problems.push(...report.mismatches);
    if (problems.length > 0) {
      problems.push(`(events: ${JSON.stringify(report.events)})`);
    }
    return problems;
  }

  /** Serves an exchange (its JSON text); resolves to where its sidecar and upstream listen. */
  async begin(text: string): Promise<Endpoints> {
    return (await (await this.fetch("/exchange", { method: "POST", body: text })).json()) as Endpoints;
  }

  /** Stops the exchange's sidecar: its address refuses connections from then on. */
  async stopSidecar(): Promise<void> {
    await this.fetch("/sidecar/stop", { method: "POST" });
  }

  /** What the fake saw, once every step came (or after waitMs). */
  async result(waitMs = TIMEOUT_MS): Promise<{ mismatches: string[]; events: unknown[] }> {
    return (await (await this.fetch(`/result?timeout_ms=${waitMs}`)).json()) as { mismatches: string[]; events: unknown[] };
  }

  /** One call of the application; the differences between what it saw and app_sees. */
  private async call(client: Client, scope: string, call: Call): Promise<string[]> {
    const o = call.options ?? {};
    const governed = governedFetch(client, scope, {
      ...(o.estimated_tokens === undefined ? {} : { estimatedTokens: o.estimated_tokens }),
      ...(o.deadline_ms === undefined ? {} : { deadlineMs: o.deadline_ms }),
      ...(o.priority === undefined ? {} : { priority: o.priority }),
      ...(o.tenant === undefined ? {} : { tenant: o.tenant }),
    });
    const abort = new AbortController();
    let aborter: Promise<void> = Promise.resolve();
    if (call.abort_after) {
      aborter = this.fetch(`/events?count=${call.abort_after}&timeout_ms=${TIMEOUT_MS}`).then(() => abort.abort());
    }
    const r = call.request;
    let response: Response | undefined;
    let error: unknown;
    try {
      response = await governed(PLACEHOLDER + r.path, {
        method: r.method,
        ...(r.headers === undefined ? {} : { headers: r.headers }),
        ...(r.body === undefined ? {} : { body: r.body }),
        signal: abort.signal,
      });
    } catch (e) {
      error = e;
    }
    await aborter;
    return seen(call.app_sees, response, error, abort.signal);
  }
}

async function seen(want: Call["app_sees"], response: Response | undefined, error: unknown, signal: AbortSignal): Promise<string[]> {
  if (want.error !== undefined) {
    if (response !== undefined) {
      return [`the application got a ${response.status} response, want the ${want.error} error`];
    }
    const ok = want.error === "aborted" ? error === signal.reason : error instanceof UnavailableError;
    return ok ? [] : [`the application got ${String(error)}, want the ${want.error} error`];
  }
  if (response === undefined) {
    return [`the application got ${String(error)}, want a ${want.status} response`];
  }
  const out: string[] = [];
  if (response.status !== want.status) {
    out.push(`status = ${response.status}, want ${want.status}`);
  }
  for (const [k, v] of Object.entries(want.headers ?? {})) {
    const got = response.headers.get(k);
    if (got !== v) {
      out.push(`header ${k} = ${JSON.stringify(got)}, want ${JSON.stringify(v)}`);
    }
  }
  const text = await response.text();
  if (want.body !== undefined && text !== want.body) {
    out.push(`body = ${JSON.stringify(text.slice(0, 500))}, want ${JSON.stringify(want.body)}`);
  }
  if (want.body_json !== undefined) {
    let doc: unknown;
    try {
      doc = JSON.parse(text);
    } catch {
      return [...out, `body is not JSON: ${JSON.stringify(text.slice(0, 500))}`];
    }
    for (const [path, v] of Object.entries(want.body_json)) {
      const got = path.split(".").reduce<unknown>((at, key) => (typeof at === "object" && at !== null ? (at as Record<string, unknown>)[key] : undefined), doc);
      if (!isDeepStrictEqual(got, v)) {
        out.push(`body ${path} = ${JSON.stringify(got)}, want ${JSON.stringify(v)}`);
      }
    }
  }
  return out;
}
