// The shared outcome table: an upstream HTTP result to its outcome and the
// largest retry hint it gave. testdata/classification.json holds the vectors
// the Go, Python and TypeScript SDKs all run, so that they cannot disagree.

/** How one attempt ended (the outcome table of the polygate README). */
export type Outcome =
  /** 2xx. The call is done. */
  | "SUCCESS"
  /** 5xx, 408, timeout, connection error. A breaker failure, charged to the retry budget. */
  | "TRANSIENT"
  /** 429 that is not quota exhaustion. Neutral for the breaker, not charged. */
  | "RATE_LIMITED"
  /** 401, 403, 429 insufficient_quota. Opens the source's breaker at once. */
  | "SOURCE_DEAD"
  /** Any other 4xx. The call fails non_retryable. */
  | "CLIENT_ERROR"
  /** The caller gave up. The call ends. */
  | "CANCELLED";

/** The ceiling of every hint the SDK parses, in milliseconds (24 hours). */
export const MAX_RETRY_HINT_MS = 86_400_000;

const NS_PER_MS = 1_000_000;
const MAX_HINT_NS = MAX_RETRY_HINT_MS * NS_PER_MS; // 8.64e13: exact in a double
const MAX_BODY = 1 << 20; // bodies longer than this are not parsed
const UNITS_NS: Record<string, number> = {
  ns: 1,
  us: 1_000,
  "µs": 1_000,
  ms: 1_000_000,
  s: 1_000_000_000,
  m: 60_000_000_000,
  h: 3_600_000_000_000,
};
const NUMBER = /^([0-9]*)(?:(\.)([0-9]*))?$/;
const PART = /([0-9.]*)(ns|us|µs|ms|s|m|h)/y;

/** Header access the classifier needs: a fetch Headers, or a plain record. */
export type HeaderSource = Headers | Record<string, string> | Iterable<[string, string]> | undefined | null;

/** Body the classifier reads: bytes or text ("" or undefined when there is none). */
export type BodySource = Uint8Array | string | undefined | null;

/** The outcome of an upstream result and its retry hint in milliseconds. */
export interface Classification {
  outcome: Outcome;
  /** The largest retry hint the upstream gave, in [0, MAX_RETRY_HINT_MS]; 0 if none. */
  retryAfterMs: number;
}

/**
 * Maps an upstream HTTP result to its outcome and the largest retry hint it
 * gave.
 *
 * 2xx SUCCESS (hints ignored); 5xx and 408 TRANSIENT; 429 RATE_LIMITED, or
 * SOURCE_DEAD when a JSON body says insufficient_quota; 401 and 403
 * SOURCE_DEAD; other 4xx, 1xx and 3xx CLIENT_ERROR; a status outside
 * 100..599 TRANSIENT.
 *
 * Hints: `retry-after-ms` (milliseconds); without a usable one, `Retry-After`
 * (seconds or an HTTP date measured from `now`); without a usable one of
 * those, OpenAI's `x-ratelimit-reset-requests` and `-tokens` of each exhausted
 * dimension. A `retryDelay` anywhere in a JSON body counts too, and the
 * largest wins. Every hint saturates at 24 hours and is never negative.
 */
export function classify(status: number, headers: HeaderSource, body: BodySource, now: Date = new Date()): Classification {
  if (status >= 200 && status <= 299) {
    return { outcome: "SUCCESS", retryAfterMs: 0 };
  }
  const doc = parseJSON(bodyText(body));
  let outcome: Outcome;
  if (!Number.isInteger(status) || status < 100 || status > 599 || status >= 500 || status === 408) {
    outcome = "TRANSIENT";
  } else if (status === 429) {
    outcome = insufficientQuota(doc) ? "SOURCE_DEAD" : "RATE_LIMITED";
  } else if (status === 401 || status === 403) {
    outcome = "SOURCE_DEAD";
  } else {
    outcome = "CLIENT_ERROR";
  }
  return { outcome, retryAfterMs: hintMs(headers, doc, now) };
}

/**
 * The largest retry hint of a response's headers and JSON body, in
 * milliseconds, saturated to [0, MAX_RETRY_HINT_MS]; see classify.
 */
export function retryHintMs(headers: HeaderSource, body: BodySource, now: Date = new Date()): number {
  return hintMs(headers, parseJSON(bodyText(body)), now);
}

/** retryHintMs of a body already parsed (doc, undefined when it is not JSON). */
function hintMs(headers: HeaderSource, doc: unknown, now: Date): number {
  const h = lowered(headers);
  let hint = parseNumber((h.get("retry-after-ms") ?? "").trim(), UNITS_NS.ms!);
  if (hint === undefined) {
    hint = retryAfterHeader(h.get("retry-after") ?? "", now);
  }
  if (hint === undefined) {
    hint = Math.max(resetHint(h, "requests"), resetHint(h, "tokens"));
  }
  return Math.min(Math.max(hint, bodyRetryDelay(doc)), MAX_HINT_NS) / NS_PER_MS;
}

/**
 * OpenAI-style `usage.total_tokens` of a JSON body: a non-negative integer,
 * or undefined.
 */
export function totalTokens(body: BodySource): number | undefined {
  const doc = parseJSON(bodyText(body));
  const usage = isObject(doc) ? doc.usage : undefined;
  const n = isObject(usage) ? usage.total_tokens : undefined;
  if (typeof n !== "number" || !Number.isInteger(n) || n < 0 || n >= 2 ** 63) {
    return undefined;
  }
  return n;
}

function bodyText(body: BodySource): string {
  if (body === undefined || body === null) {
    return "";
  }
  if (typeof body === "string") {
    return body;
  }
  return new TextDecoder().decode(body);
}

/** Header names lowered; the first of repeated headers wins. */
function lowered(headers: HeaderSource): Map<string, string> {
  const out = new Map<string, string>();
  if (headers === undefined || headers === null) {
    return out;
  }
  const entries: Iterable<[string, string]> =
    typeof Headers !== "undefined" && headers instanceof Headers
      ? headers.entries()
      : Symbol.iterator in headers
        ? (headers as Iterable<[string, string]>)
        : Object.entries(headers as Record<string, string>);
  for (const [k, v] of entries) {
    const key = String(k).toLowerCase();
    if (!out.has(key)) {
      out.set(key, String(v));
    }
  }
  return out;
}

/**
 * Digits with an optional fraction, as a count of unit, in nanoseconds,
 * exactly, saturated to the 24 h ceiling; undefined when s is not such a
 * number (a sign, an exponent, NaN, inf).
 */
function parseNumber(s: string, unitNs: number): number | undefined {
  const m = NUMBER.exec(s);
  if (m === null || (!m[1] && !m[3])) {
    return undefined;
  }
  const limit = Math.floor(MAX_HINT_NS / unitNs);
  let n = 0;
  for (const c of m[1] ?? "") {
    n = n * 10 + (c.charCodeAt(0) - 48);
    if (n > limit) {
      return MAX_HINT_NS;
    }
  }
  let ns = n * unitNs;
  let scale = unitNs;
  for (const c of m[3] ?? "") {
    scale = Math.floor(scale / 10);
    if (scale === 0) {
      break;
    }
    ns += (c.charCodeAt(0) - 48) * scale;
  }
  return Math.min(ns, MAX_HINT_NS);
}

/**
 * OpenAI's and Google's durations ("1s", "6m0s", "20ms", "7.66s"); a bare
 * number is seconds. Nanoseconds saturated to the 24 h ceiling, or undefined.
 */
function parseDuration(raw: string): number | undefined {
  const s = raw.trim();
  if (s === "") {
    return undefined;
  }
  const bare = parseNumber(s, UNITS_NS.s!);
  if (bare !== undefined) {
    return bare;
  }
  let total = 0;
  let pos = 0;
  while (pos < s.length) {
    PART.lastIndex = pos;
    const m = PART.exec(s);
    if (m === null) {
      return undefined;
    }
    const n = parseNumber(m[1] ?? "", UNITS_NS[m[2] ?? ""]!);
    if (n === undefined) {
      return undefined;
    }
    total = Math.min(total + n, MAX_HINT_NS);
    pos = PART.lastIndex;
  }
  return total;
}

function retryAfterHeader(raw: string, now: Date): number | undefined {
  const v = raw.trim();
  if (v === "") {
    return undefined;
  }
  const n = parseNumber(v, UNITS_NS.s!);
  if (n !== undefined) {
    return n;
  }
  const when = parseHTTPDate(v);
  if (when === undefined) {
    return undefined;
  }
  const deltaMs = when - now.getTime();
  return Math.min(Math.max(0, deltaMs * NS_PER_MS), MAX_HINT_NS);
}

/** OpenAI's x-ratelimit-reset-<dim>, counted only when the dimension is exhausted. */
function resetHint(h: Map<string, string>, dim: string): number {
  const remaining = (h.get(`x-ratelimit-remaining-${dim}`) ?? "").trim();
  if (remaining !== "") {
    const n = Number(remaining);
    if (!Number.isNaN(n) && n > 0) {
      return 0;
    }
  }
  return parseDuration(h.get(`x-ratelimit-reset-${dim}`) ?? "") ?? 0;
}

function parseJSON(text: string): unknown {
  if (text === "" || text.length > MAX_BODY) {
    return undefined;
  }
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function insufficientQuota(doc: unknown): boolean {
  if (!isObject(doc)) {
    return false;
  }
  const places: unknown[] = [doc.code, doc.type];
  if (isObject(doc.error)) {
    places.push(doc.error.code, doc.error.type);
  }
  return places.includes("insufficient_quota");
}

function bodyRetryDelay(doc: unknown): number {
  const walk = (v: unknown, depth: number): number => {
    if (depth > 32) {
      return 0;
    }
    let most = 0;
    if (Array.isArray(v)) {
      for (const x of v) {
        most = Math.max(most, walk(x, depth + 1));
      }
    } else if (isObject(v)) {
      for (const [k, x] of Object.entries(v)) {
        if (k === "retryDelay" && typeof x === "string") {
          most = Math.max(most, parseDuration(x) ?? 0);
        } else {
          most = Math.max(most, walk(x, depth + 1));
        }
      }
    }
    return most;
  };
  return walk(doc, 0);
}

const MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"];
const DAY = "(?:mon|tue|wed|thu|fri|sat|sun)";
const LONG_DAY = "(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)";
const MON = "(?<mon>jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)";
const TIME = "(?<h>\\d{2}):(?<mi>\\d{2}):(?<s>\\d{2})";
// The three forms of RFC 9110's HTTP-date: IMF-fixdate, RFC 850, asctime.
const HTTP_DATES = [
  new RegExp(`^${DAY}, (?<day>\\d{2}) ${MON} (?<year>\\d{4}) ${TIME} GMT$`, "i"),
  new RegExp(`^${LONG_DAY}, (?<day>\\d{2})-${MON}-(?<yy>\\d{2}) ${TIME} GMT$`, "i"),
  new RegExp(`^${DAY} ${MON} +(?<day>\\d{1,2}) ${TIME} (?<year>\\d{4})$`, "i"),
];

/** An HTTP date as milliseconds since the epoch, or undefined. */
function parseHTTPDate(v: string): number | undefined {
  for (const re of HTTP_DATES) {
    const g = re.exec(v)?.groups;
    if (g === undefined) {
      continue;
    }
    const yy = Number(g.yy);
    const year = g.year !== undefined ? Number(g.year) : yy < 69 ? 2000 + yy : 1900 + yy;
    const month = MONTHS.indexOf((g.mon ?? "").toLowerCase()) + 1;
    const [day, h, mi, s] = [Number(g.day), Number(g.h), Number(g.mi), Number(g.s)];
    if (day < 1 || day > daysIn(year, month) || h > 23 || mi > 59 || s > 59) {
      return undefined;
    }
    return daysFromCivil(year, month, day) * 86_400_000 + ((h * 60 + mi) * 60 + s) * 1000;
  }
  return undefined;
}

function daysIn(year: number, month: number): number {
  const leap = (year % 4 === 0 && year % 100 !== 0) || year % 400 === 0;
  return [31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][month - 1] ?? 0;
}

/** Days since 1970-01-01 of a proleptic Gregorian date, for any year. */
function daysFromCivil(year: number, month: number, day: number): number {
  const y = month <= 2 ? year - 1 : year;
  const era = Math.floor(y / 400);
  const yoe = y - era * 400;
  const doy = Math.floor((153 * (month + (month > 2 ? -3 : 9)) + 2) / 5) + day - 1;
  const doe = yoe * 365 + Math.floor(yoe / 4) - Math.floor(yoe / 100) + doy;
  return era * 146_097 + doe - 719_468;
}
