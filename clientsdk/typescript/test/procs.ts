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
  /** Its standard error so far. */
  logs(): string;
  stop(): Promise<void>;
}

/**
 * Starts a program and waits for its "<prefix> ADDR" line on standard
 * output. Its standard input is a pipe: programs started with
 * --exit-on-stdin-eof end with the test process.
 */
export async function start(path: string, args: string[], prefix: string, env?: Record<string, string>): Promise<Started> {
  const proc = spawn(path, args, { stdio: ["pipe", "pipe", "pipe"], env: { ...process.env, ...env } });
  let stderr = "";
  proc.stderr!.setEncoding("utf8").on("data", (d: string) => {
    stderr += d;
  });
  const exited = new Promise<void>((resolve) => proc.once("exit", () => resolve()));
  const addr = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${path} did not announce its address within ${TIMEOUT_MS} ms:\n${stderr}`)), TIMEOUT_MS);
    proc.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`${path} exited (${code}) before announcing its address:\n${stderr}`));
    });
    createInterface({ input: proc.stdout! }).on("line", (line) => {
      if (line.startsWith(prefix)) {
        clearTimeout(timer);
        resolve(line.slice(prefix.length).trim());
      }
    });
  });
  return {
    proc,
    addr,
    logs: () => stderr,
    stop: async () => {
      if (proc.exitCode === null && proc.signalCode === null) {
        proc.kill("SIGTERM");
        await exited;
      }
    },
  };
}
