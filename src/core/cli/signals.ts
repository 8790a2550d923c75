/**
 * The one place psyche reacts to SIGINT, SIGTERM and SIGHUP: every command gets a `Shutdown` from PsycheCommand.
 *
 * - A command that does not ask for an orderly stop exits at once with the signal's code (128 + its number). The
 *   process's `exit` event still runs, and with it the hook that kills live workers (worker/client.ts): no orphans.
 * - A command that asks (`requested()` or `onSignal(fn)`) stops in its own way: it closes what it opened and
 *   returns. If that takes longer than the grace period, or a second signal comes, the process exits at once.
 *
 * The listeners stay installed until the command ends (not `once`): execa's signal-exit re-raises a signal that has
 * no listener but its own, which would kill the process in the middle of its orderly stop.
 */
type ShutdownSignal = 'SIGINT' | 'SIGTERM' | 'SIGHUP'

const SIGNALS: readonly ShutdownSignal[] = ['SIGINT', 'SIGTERM', 'SIGHUP']

/** The conventional exit status of a process ended by a signal: 128 + the signal's number. */
export const SIGNAL_EXIT_CODE: Readonly<Record<ShutdownSignal, number>> = {SIGINT: 130, SIGTERM: 143, SIGHUP: 129}

interface ShutdownOptions {
  /** How long an orderly stop may take after the first signal before the process exits anyway. */
  graceMs?: number
  /** Ends the process (tests pass a recorder). */
  exit?: (code: number) => void
  /** Where listeners go (tests pass an EventEmitter). */
  target?: Pick<NodeJS.Process, 'on' | 'removeListener'>
}

export class Shutdown {
  /** The first signal received, if one was. */
  signal: ShutdownSignal | undefined
  private readonly graceMs: number
  private readonly exit: (code: number) => void
  private readonly target: Pick<NodeJS.Process, 'on' | 'removeListener'>
  private readonly listeners = new Map<ShutdownSignal, () => void>()
  private readonly waiters: ((signal: ShutdownSignal) => void)[] = []
  private readonly handlers: ((signal: ShutdownSignal) => void | Promise<void>)[] = []
  private orderly = false

  constructor(options: ShutdownOptions = {}) {
    this.graceMs = options.graceMs ?? 15_000
    this.exit = options.exit ?? ((code) => process.exit(code))
    this.target = options.target ?? process
  }

  /** The exit status that reports the signal (undefined while none came). */
  get exitCode(): number | undefined {
    return this.signal ? SIGNAL_EXIT_CODE[this.signal] : undefined
  }

  install(): void {
    for (const signal of SIGNALS) {
      if (this.listeners.has(signal)) continue
      const listener = () => this.receive(signal)
      this.listeners.set(signal, listener)
      this.target.on(signal, listener)
    }
  }

  dispose(): void {
    for (const [signal, listener] of this.listeners) this.target.removeListener(signal, listener)
    this.listeners.clear()
  }

  /** Resolves at the first signal. The command then stops in order and returns. */
  requested(): Promise<ShutdownSignal> {
    this.orderly = true
    if (this.signal) return Promise.resolve(this.signal)
    return new Promise((resolve) => this.waiters.push(resolve))
  }

  /** Runs `fn` at the first signal, then exits with the signal's code. */
  onSignal(fn: (signal: ShutdownSignal) => void | Promise<void>): void {
    this.orderly = true
    this.handlers.push(fn)
  }

  private receive(signal: ShutdownSignal): void {
    if (this.signal) {
      // a second signal: the person means it
      this.exit(SIGNAL_EXIT_CODE[this.signal])
      return
    }
    this.signal = signal
    const code = SIGNAL_EXIT_CODE[signal]
    if (!this.orderly) {
      this.exit(code)
      return
    }
    setTimeout(() => this.exit(code), this.graceMs).unref()
    for (const resolve of this.waiters.splice(0)) resolve(signal)
    if (this.handlers.length > 0) {
      void Promise.allSettled(this.handlers.map(async (fn) => fn(signal))).then(() => this.exit(code))
    }
  }
}
