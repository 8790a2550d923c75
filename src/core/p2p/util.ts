import {setMaxListeners} from 'node:events'
import {errorMessage} from '../errors.js'
import type {Libp2pEvents} from '@libp2p/interface'
import type {EventLog} from '../events.js'

/** Our protocols also run over relayed connections, which the relay limits in time and bytes (see psyche relay). */
export const ON_LIMITED = {runOnLimitedConnection: true} as const

/**
 * A deadline for one transfer. Every chunk read/write listens on it, so Node's 10-listener warning does not apply.
 * Its timer holds it strongly (unref'd: it keeps no process alive). AbortSignal.timeout's timer holds its signal
 * weakly, and Node 20's AbortSignal.any follows its sources without holding them: a timeout signal inside a composite
 * may be collected and the composite never abort (nodejs/node#57736), which left WebRTC attempts waiting forever.
 */
export function deadline(ms: number): AbortSignal {
  const controller = new AbortController()
  setTimeout(() => controller.abort(new DOMException('The operation was aborted due to timeout', 'TimeoutError')), ms).unref()
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
