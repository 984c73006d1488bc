// The Go programs the tests run: built once with `go build` (or taken from an
// environment variable), started on free ports, stopped when the test ends.

import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";

import { REPO } from "./repo.js";

/** Bound of every wait of the tests: conditions are awaited until it, never slept for. */
export const TIMEOUT_MS = 60_000;

const built = new Map<string, string>();
let binDir: string | undefined;

/** The binary of a Go package of the repository: $env, or built once into a temporary directory. */
export function binary(env: string, pkg: string): string {
  const given = process.env[env];
  if (given) {
    return given;
  }
  let path = built.get(pkg);
  if (path === undefined) {
    binDir ??= mkdtempSync(join(tmpdir(), "polygate-ts-"));
    path = join(binDir, pkg.split("/").at(-1)!);
    execFileSync("go", ["build", "-o", path, pkg], { cwd: REPO, stdio: "inherit" });
    built.set(pkg, path);
  }
  return path;
}

/** A started process and the address it announced. */
export interface Started {
  proc: ChildProcess;
  addr: string;
  /** The rest of the first line of its standard output that starts with prefix. */
  line(prefix: string): Promise<string>;
  /** Its standard error so far. */
  logs(): string;
  stop(): Promise<void>;
}

/**
 * Starts a program and waits for its "<prefix> ADDR" line on standard
 * output. Its environment is the test's without POLYGATE_* variables (the
 * sidecar would read them as its configuration), plus env. Its standard
 * input is a pipe: programs started with --exit-on-stdin-eof end with the
 * test process, which a program left running never holds up.
 */
export async function start(path: string, args: string[], prefix: string, env?: Record<string, string>): Promise<Started> {
  const inherited = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("POLYGATE_")));
  const proc = spawn(path, args, { stdio: ["pipe", "pipe", "pipe"], env: { ...inherited, ...env } });
  proc.unref();
  for (const s of [proc.stdin, proc.stdout, proc.stderr]) {
    (s as unknown as { unref?: () => void } | null)?.unref?.();
  }
  let stderr = "";
  proc.stderr!.setEncoding("utf8").on("data", (d: string) => {
    stderr += d;
  });
  const lines: string[] = [];
  const waiters: (() => void)[] = [];
  let exitCode: number | null | undefined;
  createInterface({ input: proc.stdout! }).on("line", (l) => {
    lines.push(l);
    waiters.splice(0).forEach((w) => w());
  });
  const exited = new Promise<void>((resolve) =>
    proc.once("exit", (code) => {
      exitCode = code;
      waiters.splice(0).forEach((w) => w());
      resolve();
    }),
  );
  const line = (p: string): Promise<string> =>
    new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`${path} printed no line "${p}..." within ${TIMEOUT_MS} ms:\n${stderr}`)), TIMEOUT_MS);
      const check = (): void => {
        const found = lines.find((l) => l.startsWith(p));
        if (found !== undefined) {
          clearTimeout(timer);
          resolve(found.slice(p.length).trim());
        } else if (exitCode !== undefined) {
          clearTimeout(timer);
          reject(new Error(`${path} exited (${exitCode}) before printing "${p}...":\n${stderr}`));
        } else {
          waiters.push(check);
        }
      };
      check();
    });
  const addr = await line(prefix);
  return {
    proc,
    addr,
    line,
    logs: () => stderr,
    stop: async () => {
      if (exitCode === undefined) {
        proc.ref(); // the wait for its exit holds the test process
        proc.kill("SIGTERM");
        const kill = setTimeout(() => proc.kill("SIGKILL"), TIMEOUT_MS); // a shutdown that hangs must not hang the run
        await exited;
        clearTimeout(kill);
      }
    },
  };
}
