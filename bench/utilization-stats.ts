// The pure parts of bench/utilization.bench.ts: what a row's logs and counters come to (test/bench/utilization.test.ts).

/** A span of time in ms (Date.now()). */
export interface Span {
  start: number
  end: number
}

/** The fraction of `window` that the compute spans cover (each clipped to the window; spans do not overlap). */
export function busyFraction(computes: Span[], window: Span): number {
  const wall = window.end - window.start
  if (!(wall > 0)) return NaN
  const busy = computes.reduce((sum, c) => sum + Math.max(0, Math.min(c.end, window.end) - Math.max(c.start, window.start)), 0)
  return busy / wall
}

/** Tokens in one batch: a 1B model's per-client batch of 256 sequences of 1,024 tokens. */
export const TOKENS_PER_BATCH = 256 * 1024

/** Bytes per token trained: `bytes` measured on a link scaled back by `k` (the run's ÷ K), over `batches` batches. */
export function bytesPerToken(bytes: number, batches: number, k: number): number {
  return batches > 0 ? (bytes * k) / (batches * TOKENS_PER_BATCH) : NaN
}

/**
 * One download of a result, as a fetcher logged it: who served it (a client id), whose result it is, its step; and
 * `share`, the fraction of it `from` served when it was fetched in pieces from several (default 1).
 */
export interface Fetch {
  fetcher: string
  from: string
  producer: string
  step: number
  share?: number
}

/**
 * How many times each producer uploaded its own result of each step (the fetches of it that it served), for the
 * steps in `steps`; and the most times any client uploaded any one result (its own or another's).
 */
export function uploadsPerResult(fetches: Fetch[], steps: Set<number>): {byProducer: number[]; maxByAnyone: number} {
  const own = new Map<string, number>()
  const any = new Map<string, number>()
  for (const f of fetches) {
    if (!steps.has(f.step)) continue
    const result = `${f.producer}@${f.step}`
    const share = f.share ?? 1
    if (f.from === f.producer) own.set(result, (own.get(result) ?? 0) + share)
    else own.set(result, own.get(result) ?? 0)
    const key = `${f.from}:${result}`
    any.set(key, (any.get(key) ?? 0) + share)
  }
  return {byProducer: [...own.values()], maxByAnyone: Math.max(0, ...any.values())}
}

/** What a row's numbers say limits it. */
export type Limit = 'compute (nothing else)' | 'uplink' | 'downlink' | "this machine's CPU and the round's coordination" | "the round's coordination"

/**
 * Where a round's time goes, per client and round in seconds: `compute`; `up` and `down`, the time its link needs for
 * the bytes it sent and received (bytes ÷ capacity); and the rest of the `period`, which is coordination (announce,
 * fetch requests, witness proofs, the coordinator's transitions) and this machine's CPU (the clients' own work, and
 * everyone else's on a shared machine): `cpuBusy` is the machine's CPU busy fraction over the window.
 * The limit is compute when the clients were ≥ 95 % busy; else the largest of the links' times and the rest,
 * charged to the CPU too when the machine was ≥ 90 % busy.
 */
export function limitOf(o: {busy: number; period: number; compute: number; up: number; down: number; cpuBusy: number}): {limit: Limit; rest: number} {
  const rest = Math.max(0, o.period - o.compute - Math.max(o.up, o.down))
  if (o.busy >= 0.95) return {limit: 'compute (nothing else)', rest}
  if (rest > Math.max(o.up, o.down)) return {limit: o.cpuBusy >= 0.9 ? "this machine's CPU and the round's coordination" : "the round's coordination", rest}
  return {limit: o.up >= o.down ? 'uplink' : 'downlink', rest}
}

/** The machine's CPU busy fraction between two /proc/stat `cpu` lines' counters (user nice system idle iowait …). */
export function cpuBusy(a: number[], b: number[]): number {
  const total = b.reduce((s, v) => s + v, 0) - a.reduce((s, v) => s + v, 0)
  const idle = b[3] + (b[4] ?? 0) - (a[3] + (a[4] ?? 0))
  return total > 0 ? 1 - idle / total : NaN
}

export const median = (xs: number[]): number => (xs.length ? [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] : NaN)
