/**
 * The testnet's kill scheduler: every interval, K random live clients are killed and, after a delay,
 * restarted. Victim choice is a pure function of the live clients and the random source.
 */

/** Up to `count` distinct victims among `alive`, never all of them: the run (and the model) lives in the survivors. */
export function pickVictims<T>(alive: readonly T[], count: number, random: () => number): T[] {
  const victims: T[] = []
  while (victims.length < Math.min(count, alive.length - 1)) {
    const pick = alive[Math.floor(random() * alive.length)]
    if (!victims.includes(pick)) victims.push(pick)
  }
  return victims
}

/**
 * The clients that may be killed now: the live ones that have not finished, and none once one of them has applied
 * `rounds` steps (the run's end, `--rounds`). Past that a kill only postpones the end: the run waits for every live
 * client to apply its rounds, and a client killed near the end must first rejoin at an epoch boundary; with rejoins
 * slower than the kill interval the end could be put off kill after kill.
 */
export function killCandidates<T extends {alive: boolean; finished: boolean; lastStep: number | null}>(clients: readonly T[], rounds: number | undefined): T[] {
  if (rounds !== undefined && clients.some((c) => (c.lastStep ?? 0) >= rounds)) return []
  return clients.filter((c) => c.alive && !c.finished)
}

interface KillSchedulerOptions<T> {
  /** Victims per interval. */
  count: number
  intervalMs: number
  /** How long a killed client stays down before restart() is called. */
  restartDelayMs: number
  random: () => number
  /** The clients that may be killed now (alive, not finished). */
  candidates: () => T[]
  kill: (victim: T) => void
  restart: (victim: T) => void
}

export class KillScheduler<T> {
  private readonly timers: NodeJS.Timeout[] = []
  private interval: NodeJS.Timeout | undefined

  constructor(private readonly o: KillSchedulerOptions<T>) {}

  start(): void {
    if (this.o.count <= 0 || this.interval) return
    this.interval = setInterval(() => this.killNow(this.o.count), this.o.intervalMs)
  }

  /** Kills up to `count` random candidates now (never all), each restarted restartDelayMs later. */
  killNow(count: number): void {
    for (const victim of pickVictims(this.o.candidates(), count, this.o.random)) {
      this.o.kill(victim)
      this.timers.push(setTimeout(() => this.o.restart(victim), this.o.restartDelayMs))
    }
  }

  /** True once started (until stopped): dead clients may still come back. */
  get active(): boolean {
    return this.interval !== undefined
  }

  stop(): void {
    if (this.interval) clearInterval(this.interval)
    this.interval = undefined
    for (const t of this.timers) clearTimeout(t)
    this.timers.length = 0
  }
}
