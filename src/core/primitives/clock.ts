/** Time as the client sees it: wall-clock milliseconds and waiting (a manual clock in the simulation). */
export interface Clock {
  now(): number
  /** Resolves after `ms`. */
  sleep(ms: number): Promise<void>
}

export const systemClock: Clock = {
  now: () => Date.now(),
  sleep: (ms) => new Promise((resolve) => setTimeout(resolve, ms)),
}
