// The gRPC connection to the sidecar: its address, TLS, bearer token, and the
// translation of gRPC errors into the SDK's.

import { closeSync, openSync, readSync } from "node:fs";
import { isIP, connect as netConnect } from "node:net";
import type * as http2 from "node:http2";

import { BinaryReader, WireType } from "@bufbuild/protobuf/wire";
import { Code, ConnectError, type Interceptor } from "@connectrpc/connect";
import { Http2SessionManager, createGrpcTransport } from "@connectrpc/connect-node";
import type { Transport } from "@connectrpc/connect";

import { sidecarError, type SidecarError, type SidecarFacts, type StatusCode } from "./errors.js";

/** TLS to the sidecar: PEM files or their contents. */
export interface TLSOptions {
  /** Roots that verify the sidecar (default: the system's). */
  caFile?: string;
  ca?: string | Buffer;
  /** Client certificate and key, for mTLS: both or neither. */
  certFile?: string;
  keyFile?: string;
  cert?: string | Buffer;
  key?: string | Buffer;
  /** The name the sidecar's certificate is checked against, when it is not the address's host. */
  serverName?: string;
}

/** A connection's transport and how to close it. */
export interface Connection {
  transport: Transport;
  target: string;
  close(): void;
}

const MAX_PEM = 1 << 20;

/** Where the address and the token came from, as errors name them: an option or an environment variable. */
export interface Origins {
  addr: string;
  token: string;
}

/**
 * Opens a connection to target: "host:port", "[v6]:port", "dns:///host:port"
 * or "unix:///path" (also "unix:path"). tls undefined is plaintext to a unix
 * socket or a loopback address and TLS with the system's roots to anything
 * else; true is TLS with the system's roots; false plaintext.
 */
export function connect(
  target: string,
  token: string | undefined,
  tls: boolean | TLSOptions | undefined,
  from: Origins = { addr: "addr", token: "token" },
): Connection {
  const t = target.trim();
  const interceptors: Interceptor[] = [];
  if (token) {
    if (!/^[\x21-\x7e]+$/.test(token)) {
      throw new TypeError(`${from.token}: only printable ASCII without spaces is allowed in a bearer token`);
    }
    const value = `Bearer ${token}`;
    interceptors.push((next) => (req) => {
      req.header.set("authorization", value);
      return next(req);
    });
  }
  const unix = /^unix:(?:\/\/)?(\/.*|[^/].*)$/.exec(t);
  let baseUrl: string;
  let nodeOptions: http2.ClientSessionOptions | http2.SecureClientSessionOptions = {};
  if (unix !== null) {
    const path = unix[1]!;
    baseUrl = "http://localhost";
    nodeOptions = { createConnection: () => netConnect(path) };
    if (tls !== undefined && tls !== false) {
      throw new TypeError(`tls: a unix socket (${t}) is plaintext; leave tls unset or false`);
    }
  } else {
    const hostPort = t.replace(/^dns:(?:\/\/\/)?/, "");
    const host = hostOf(hostPort);
    if (host === "" || !/:\d+$/.test(hostPort)) {
      throw new TypeError(`${from.addr}: ${JSON.stringify(target.slice(0, 200))} is not host:port, [v6]:port or unix:///path`);
    }
    const secure = tls === undefined ? !isLoopback(host) : tls !== false;
    baseUrl = `${secure ? "https" : "http"}://${hostPort}`;
    if (secure && typeof tls === "object") {
      nodeOptions = tlsOptions(tls);
    }
  }
  const session = new Http2SessionManager(baseUrl, {}, nodeOptions);
  const transport = createGrpcTransport({ baseUrl, sessionManager: session, interceptors });
  return { transport, target: t, close: () => session.abort() };
}

function tlsOptions(o: TLSOptions): http2.SecureClientSessionOptions {
  if ((o.certFile ?? o.cert) === undefined !== ((o.keyFile ?? o.key) === undefined)) {
    throw new TypeError("tls: a client certificate and its key go together: give both or neither");
  }
  const read = (field: string, path: string | undefined, value: string | Buffer | undefined): string | Buffer | undefined => {
    if (path === undefined) {
      return value;
    }
    let data: Buffer;
    try {
      data = readAtMost(path, MAX_PEM + 1);
    } catch (e) {
      throw new TypeError(`tls.${field} ${JSON.stringify(path)} cannot be read: ${(e as Error).message}`);
    }
    if (data.length > MAX_PEM) {
      throw new TypeError(`tls.${field} ${JSON.stringify(path)} is larger than ${MAX_PEM} bytes`);
    }
    return data;
  };
  const out: http2.SecureClientSessionOptions = {};
  const ca = read("caFile", o.caFile, o.ca);
  const cert = read("certFile", o.certFile, o.cert);
  const key = read("keyFile", o.keyFile, o.key);
  if (ca !== undefined) out.ca = ca;
  if (cert !== undefined) out.cert = cert;
  if (key !== undefined) out.key = key;
  if (o.serverName !== undefined) out.servername = o.serverName;
  return out;
}

/** The first max bytes of a file, read without reading more (a device or a huge file is cut, not read whole). */
function readAtMost(path: string, max: number): Buffer {
  const fd = openSync(path, "r");
  try {
    const buf = Buffer.alloc(max);
    let n = 0;
    while (n < max) {
      const got = readSync(fd, buf, n, max - n, null);
      if (got === 0) {
        break;
      }
      n += got;
    }
    return buf.subarray(0, n);
  } finally {
    closeSync(fd);
  }
}

function hostOf(hostPort: string): string {
  if (hostPort.startsWith("[")) {
    const end = hostPort.indexOf("]");
    return end < 0 ? "" : hostPort.slice(1, end);
  }
  const colon = hostPort.lastIndexOf(":");
  return colon < 0 ? hostPort : hostPort.slice(0, colon);
}

/** Whether host is localhost or a loopback address, where plaintext is the default. */
export function isLoopback(host: string): boolean {
  const h = host.toLowerCase();
  if (h === "localhost") {
    return true;
  }
  if (isIP(h) === 4) {
    return h.startsWith("127.");
  }
  return isIP(h) === 6 && (h === "::1" || h === "0:0:0:0:0:0:0:1");
}

const CODE_NAMES: Record<number, StatusCode> = {
  [Code.Canceled]: "CANCELLED",
  [Code.Unknown]: "UNKNOWN",
  [Code.InvalidArgument]: "INVALID_ARGUMENT",
  [Code.DeadlineExceeded]: "DEADLINE_EXCEEDED",
  [Code.NotFound]: "NOT_FOUND",
  [Code.AlreadyExists]: "ALREADY_EXISTS",
  [Code.PermissionDenied]: "PERMISSION_DENIED",
  [Code.ResourceExhausted]: "RESOURCE_EXHAUSTED",
  [Code.FailedPrecondition]: "FAILED_PRECONDITION",
  [Code.Aborted]: "ABORTED",
  [Code.OutOfRange]: "OUT_OF_RANGE",
  [Code.Unimplemented]: "UNIMPLEMENTED",
  [Code.Internal]: "INTERNAL",
  [Code.Unavailable]: "UNAVAILABLE",
  [Code.DataLoss]: "DATA_LOSS",
  [Code.Unauthenticated]: "UNAUTHENTICATED",
};

const ERROR_INFO = "google.rpc.ErrorInfo";

/**
 * The SDK's error for an RPC's failure that the caller did not cause (an
 * abort of the caller's is the caller's). The sidecar attaches a
 * google.rpc.ErrorInfo to every error it answers; an UNAVAILABLE without
 * one, a stream the connection closed under it (CANCELLED) or a failed
 * connection is the sidecar not reached at all: an UnavailableError that is
 * `unreachable`. call is what the call had done when the RPC failed.
 */
export function rpcError(method: string, err: unknown, call: Pick<SidecarFacts, "attempts" | "lastResult"> = {}): SidecarError {
  const ce = ConnectError.from(err);
  let code = CODE_NAMES[ce.code] ?? "UNKNOWN";
  let info: { reason: string; metadata: Record<string, string> } | undefined;
  for (const d of ce.details) {
    if ("type" in d && d.type === ERROR_INFO) {
      info = decodeErrorInfo(d.value);
    }
  }
  const unreachable = info === undefined && (code === "UNAVAILABLE" || code === "CANCELLED" || isConnectionFailure(ce));
  if (unreachable) {
    code = "UNAVAILABLE";
  }
  return sidecarError(method, code, ce.rawMessage, {
    reason: info?.reason ?? "",
    metadata: info?.metadata ?? {},
    unreachable,
    ...call,
  });
}

function isConnectionFailure(ce: ConnectError): boolean {
  const cause = ce.cause as { code?: unknown } | undefined;
  return typeof cause?.code === "string" && /^(ECONNREFUSED|ECONNRESET|ENOENT|EHOSTUNREACH|ENETUNREACH|EPIPE|ETIMEDOUT|ERR_HTTP2_)/.test(cause.code);
}

/** google.rpc.ErrorInfo: reason = 1, domain = 2, map<string, string> metadata = 3. */
function decodeErrorInfo(bytes: Uint8Array): { reason: string; metadata: Record<string, string> } {
  const out = { reason: "", metadata: {} as Record<string, string> };
  try {
    const r = new BinaryReader(bytes);
    while (r.pos < r.len) {
      const [field, wire] = r.tag();
      if (field === 1 && wire === WireType.LengthDelimited) {
        out.reason = r.string();
      } else if (field === 3 && wire === WireType.LengthDelimited) {
        const entry = new BinaryReader(r.bytes());
        let k = "";
        let v = "";
        while (entry.pos < entry.len) {
          const [f, w] = entry.tag();
          if (f === 1 && w === WireType.LengthDelimited) k = entry.string();
          else if (f === 2 && w === WireType.LengthDelimited) v = entry.string();
          else entry.skip(w);
        }
        out.metadata[k] = v;
      } else {
        r.skip(wire);
      }
    }
  } catch {
    // a malformed detail: what was read so far
  }
  return out;
}
