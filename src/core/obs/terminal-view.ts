import type {HistoryPoint} from './history.js'
import type {TerminalView} from './terminal-format.js'

export {sparkline, viewLines} from './terminal-format.js'

/**
 * Draws the view live (ink) until stop(); call only when stdout is a terminal and --json is off. ink and React load
 * here, in the background (a few hundred ms), so commands that never draw never load them; stop() before they have
 * loaded draws nothing.
 */
export function startTerminalView(get: () => TerminalView, opts: {intervalMs?: number} = {}): {stop: () => void} {
  let stopped = false
  let drawn: {stop: () => void} | undefined
  import('./terminal-ink.js').then(
    ({renderView}) => {
      if (!stopped) drawn = renderView(get, opts.intervalMs ?? 500)
    },
    (error: Error) => process.stderr.write(`psyche: cannot draw the terminal view: ${error.message}\n`),
  )
  return {
    stop: () => {
      stopped = true
      drawn?.stop()
    },
  }
}

/** Keeps the last warnings (rejections, crashes...), one line each, for the view. */
export class Warnings {
  readonly list: string[] = []
  add(text: string): void {
    this.list.push(`${new Date().toISOString().slice(11, 19)} ${text.slice(0, 160)}`)
    if (this.list.length > 20) this.list.shift()
  }
}

/** The run-wide part of a view from a metrics history (server run, testnet): the loss series, last throughput, total bytes. */
export function historyFigures(points: HistoryPoint[]): Pick<TerminalView, 'losses' | 'valLoss' | 'tokensPerSecond' | 'bytesIn' | 'bytesOut' | 'applied' | 'accepted'> {
  const lastWith = (f: (p: HistoryPoint) => number | null) => {
    for (let i = points.length - 1; i >= 0; i--) if (f(points[i]) !== null) return f(points[i])
    return null
  }
  return {
    losses: points.map((p) => p.loss).filter((l): l is number => l !== null),
    valLoss: lastWith((p) => p.val_loss),
    tokensPerSecond: lastWith((p) => p.tokens_per_second),
    bytesIn: points.reduce((a, p) => a + p.bytes_in, 0),
    bytesOut: points.reduce((a, p) => a + p.bytes_out, 0),
    applied: lastWith((p) => p.applied),
    accepted: lastWith((p) => p.accepted),
  }
}
