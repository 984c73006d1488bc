// The end-to-end tests' harness: the real sidecar binary and the fake
// upstream of e2e/upstream (driven through its /_control/ API), started on
// free ports for each test and stopped after it.

import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { createClient, type Client as RpcClient } from "@connectrpc/connect";

import { connect } from "../src/connection.js";
import { AdmissionService, type SourceState } from "../src/gen/polygate/admission/v1/admission_pb.js";
import { TIMEOUT_MS, binary, start, type Started } from "./procs.js";

/** A step of a route's script (e2e/upstream.Step). */
export interface UpstreamStep {
  status?: number;
  headers?: Record<string, string>;
  body?: string;
  hang?: boolean;
  stream?: string[];
  gated?: boolean;
  times?: number;
}

/** The fake provider. */
export class Upstream {
  constructor(
    readonly url: string,
    private readonly proc: Started,
  ) {}

  static async start(): Promise<Upstream> {
    const p = await start(binary("POLYGATE_FAKEUPSTREAM_BIN", "./e2e/cmd/fakeupstream"), ["--exit-on-stdin-eof"], "fakeupstream listening on ");
    return new Upstream(p.addr, p);
  }

  baseUrl(route: string): string {
    return `${this.url}/${route}`;
  }

  private async control(route: string, init?: RequestInit, query = ""): Promise<Response> {
    const r = await fetch(`${this.url}/_control/${route}${query}`, init);
    if (!r.ok) {
      throw new Error(`fake upstream /_control/${route}${query}: ${r.status} ${await r.text()}`);
    }
    return r;
  }

  async set(route: string, ...steps: UpstreamStep[]): Promise<void> {
    await this.control(route, { method: "PUT", body: JSON.stringify({ steps }) });
  }

  /** Lets a gated stream of the route send its next element. */
  async release(route: string): Promise<void> {
    await this.control(route, { method: "POST" });
  }

  /** The route's log, after waiting for at least count requests. */
  async requests(route: string, count = 0): Promise<{ at_ms: number; status: number }[]> {
    const r = await this.control(route, undefined, `?wait_count=${count}&timeout_ms=${TIMEOUT_MS}`);
    return ((await r.json()) as { requests: { at_ms: number; status: number }[] | null }).requests ?? [];
  }

  stop(): Promise<void> {
    return this.proc.stop();
  }
}

/** A running sidecar, its metrics endpoint and a raw client for reading its state. */
export class Sidecar {
  readonly raw: RpcClient<typeof AdmissionService>;

  private constructor(
    readonly addr: string,
    readonly metricsUrl: string,
    private readonly proc: Started,
  ) {
    this.raw = createClient(AdmissionService, connect(addr, undefined, undefined).transport);
  }

  /** Starts the sidecar with config (YAML) on listen (a free port by default), metrics on a free port. */
  static async start(config: string, listen = "127.0.0.1:0"): Promise<Sidecar> {
    const dir = mkdtempSync(join(tmpdir(), "polygate-e2e-"));
    const file = join(dir, "polygate.yaml");
    writeFileSync(file, `metrics_listen: 127.0.0.1:0\n${config}`);
    const p = await start(binary("POLYGATE_SIDECAR_BIN", "./cmd/sidecar"), ["--config", file, "--listen", listen.replace("$DIR", dir)], "polygate listening on ");
    return new Sidecar(p.addr, await p.line("polygate metrics on "), p);
  }

  async source(scope: string, name: string): Promise<SourceState> {
    const d = await this.raw.describeScope({ scope }, { timeoutMs: TIMEOUT_MS });
    const s = d.scope?.sources.find((x) => x.name === name);
    if (s === undefined) {
      throw new Error(`scope ${scope} has no source ${name}`);
    }
    return s;
  }

  async liveCalls(scope: string): Promise<number> {
    return (await this.raw.describeScope({ scope }, { timeoutMs: TIMEOUT_MS })).scope?.liveCalls ?? -1;
  }

  /** The value of one Prometheus series (0 when absent), e.g. polygate_attempts_total{outcome="cancelled",...}. */
  async metric(name: string, labels: Record<string, string>): Promise<number> {
    const text = await (await fetch(this.metricsUrl)).text();
    for (const line of text.split("\n")) {
      const m = /^([a-z_]+)\{(.*)\} (\S+)$/.exec(line);
      if (m === null || m[1] !== name) {
        continue;
      }
      const have = Object.fromEntries([...m[2]!.matchAll(/(\w+)="([^"]*)"/g)].map((x) => [x[1], x[2]]));
      if (Object.entries(labels).every(([k, v]) => have[k] === v)) {
        return Number(m[3]);
      }
    }
    return 0;
  }

  logs(): string {
    return this.proc.logs();
  }

  stop(): Promise<void> {
    return this.proc.stop();
  }
}

/** Polls state only the sidecar can report until cond holds, or fails after TIMEOUT_MS. */
export async function eventually(what: string, cond: () => Promise<boolean>): Promise<void> {
  const deadline = performance.now() + TIMEOUT_MS;
  while (!(await cond())) {
    if (performance.now() > deadline) {
      throw new Error(`${what}: not within ${TIMEOUT_MS} ms`);
    }
    await new Promise((r) => setTimeout(r, 5));
  }
}
