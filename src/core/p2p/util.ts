import {setMaxListeners} from 'node:events'
import {errorMessage} from '../errors.js'
import type {Libp2pEvents} from '@libp2p/interface'
import type {EventLog} from '../events.js'

/** Our protocols also run over relayed connections, which the relay limits in time and bytes (see psyche relay). */
export const ON_LIMITED = {runOnLimitedConnection: true} as const

const LAG_TICK_MS = 50
const LAG_JITTER_MS = 2
let lagTotal = 0
let lastTick = 0
let lagTicker: ReturnType<typeof setInterval> | undefined

/**
 * How long this process could not run its timers, in all (ms): its event loop busy with other work, or the process
 * not scheduled at all (a machine short of CPU). A ticker every LAG_TICK_MS adds up how late it woke, past a little
 * jitter; started on first use, unref'd.
 */
function eventLoopLagMs(): number {
  const now = performance.now()
  if (lagTicker === undefined) {
    lastTick = now
    lagTicker = setInterval(() => {
      const at = performance.now()
      lagTotal += Math.max(0, at - lastTick - LAG_TICK_MS - LAG_JITTER_MS)
      lastTick = at
    }, LAG_TICK_MS)
    lagTicker.unref()
  }
  // Also the lateness of a tick that is due and has not run yet (our caller ran first).
  return lagTotal + Math.max(0, now - lastTick - LAG_TICK_MS - LAG_JITTER_MS)
}
/** A deadline is stretched by the event-loop lag it saw to at most this many times its length. */
const MAX_DEADLINE_STRETCH = 3

/**
 * A deadline for one transfer. Every chunk read/write listens on it, so Node's 10-listener warning does not apply.
 * It counts only the time this process could run (eventLoopLagMs): a peer that answered while our event loop was busy,
 * or while the machine gave us no CPU, is not timed out for our own delay, as a starved client on a weak machine
 * would otherwise cut every peer it was talking to; it is stretched to at most MAX_DEADLINE_STRETCH times `ms`, so a
 * peer that is gone is still given up on.
 * Its timer holds it strongly (unref'd: it keeps no process alive). AbortSignal.timeout's timer holds its signal
 * weakly, and Node 20's AbortSignal.any follows its sources without holding them: a timeout signal inside a composite
 * may be collected and the composite never abort (nodejs/node#57736), which left WebRTC attempts waiting forever.
 */
export function deadline(ms: number): AbortSignal {
  const controller = new AbortController()
  const start = performance.now()
  const lagAtStart = eventLoopLagMs()
  const latest = ms * MAX_DEADLINE_STRETCH
  const check = () => {
    const elapsed = performance.now() - start
    const ran = elapsed - (eventLoopLagMs() - lagAtStart)
    if (ran >= ms - 1 || elapsed >= latest - 1) controller.abort(new DOMException('The operation was aborted due to timeout', 'TimeoutError'))
    else setTimeout(check, Math.min(ms - ran, latest - elapsed)).unref()
  }
  setTimeout(check, ms).unref()
  setMaxListeners(Infinity, controller.signal)
  return controller.signal
}

/**
 * Aborts when any of `signals` does, with its reason: AbortSignal.any, but held by its sources through their abort
 * listeners, so it lives as long as any of them (see deadline). Once it aborts, its listeners on the others go.
 */
export function anySignal(...signals: AbortSignal[]): AbortSignal {
  const controller = new AbortController()
  setMaxListeners(Infinity, controller.signal)
  const already = signals.find((s) => s.aborted)
  if (already) {
    controller.abort(already.reason)
    return controller.signal
  }
  const onAbort = (event: Event) => {
    for (const s of signals) s.removeEventListener('abort', onAbort)
    controller.abort((event.target as AbortSignal).reason)
  }
  for (const s of signals) s.addEventListener('abort', onAbort)
  return controller.signal
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms).unref?.())
}

/** An error's message, with the reasons inside an AggregateError (libp2p's "All multiaddr dials failed"). */
export function dialErrorMessage(error: unknown): string {
  const message = errorMessage(error)
  if (error instanceof AggregateError && error.errors.length > 0) return `${message} (${error.errors.map((e) => errorMessage(e)).join('; ')})`
  return message
}

/** Aborts a stream with an Error (whatever was thrown). */
export function abortStream(stream: {abort(error: Error): void}, error: unknown): void {
  stream.abort(error instanceof Error ? error : new Error(String(error)))
}

/** A logger that never throws: a throwing logger must not break the network path. */
export function safeLog(log: EventLog | undefined): EventLog {
  return (event) => {
    try {
      log?.(event)
    } catch {
      // ignored on purpose
    }
  }
}

/** Counting semaphore: at most `limit` holders at once, the rest wait in FIFO order. */
export class Semaphore {
  active = 0
  peak = 0
  private readonly waiting: (() => void)[] = []
  constructor(private readonly limit: number) {}

  async acquire(): Promise<void> {
    if (this.active >= this.limit) await new Promise<void>((resolve) => this.waiting.push(resolve))
    else this.active++
    this.peak = Math.max(this.peak, this.active)
  }

  release(): void {
    const next = this.waiting.shift()
    // The slot passes straight to the next waiter, so `active` is unchanged.
    if (next) next()
    else this.active--
  }
}

/**
 * Paces bytes to `bytesPerSecond`, shared by every caller: take(n) resolves when n more bytes may go. Callers are
 * served in the order they ask (each reserves the next slot of the wire), with at most `burstBytes` sent ahead.
 */
export class Pacer {
  /** When (performance.now() ms) the bytes reserved so far have gone at the rate. */
  private until = 0
  constructor(
    readonly bytesPerSecond: number,
    private readonly burstBytes = 256 * 1024,
  ) {}

  async take(bytes: number, signal?: AbortSignal): Promise<void> {
    const now = performance.now()
    this.until = Math.max(this.until, now) + (bytes / this.bytesPerSecond) * 1000
    const wait = this.until - now - (this.burstBytes / this.bytesPerSecond) * 1000
    if (wait <= 0) return
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        signal?.removeEventListener('abort', onAbort)
        resolve()
      }, wait)
      const onAbort = () => {
        clearTimeout(timer)
        reject(signal!.reason as Error)
      }
      signal?.addEventListener('abort', onAbort, {once: true})
    })
  }
}

/** libp2p's event bus as a service's `events` component sees it (connection:open, transport:listening, ...). */
export interface Libp2pEventTarget {
  addEventListener<K extends keyof Libp2pEvents>(type: K, listener: (event: Libp2pEvents[K]) => void): void
  removeEventListener<K extends keyof Libp2pEvents>(type: K, listener: (event: Libp2pEvents[K]) => void): void
}
