// The terminal view's content and its plain-text form; no ink here (terminal-ink.ts draws it, loaded only for a live view).
import {timeLeftText, type RunSummary} from './summary.js'

/** What the live terminal view shows; every field optional but the title. Built by the command from its events. */
export interface TerminalView {
  title: string
  summary?: RunSummary
  clients: {name: string; state: string; step?: number | null; loss?: number | null; note?: string}[]
  /** Loss per round, oldest first (the sparkline), and the latest. */
  losses: number[]
  /** The latest validation loss (held-out samples), when clients evaluate. */
  valLoss?: number | null
  tokensPerSecond?: number | null
  bytesIn?: number | null
  bytesOut?: number | null
  applied?: number | null
  accepted?: number | null
  peers?: {all: number; direct?: number | null; relayed?: number | null} | null
  warnings: string[]
  /** News (a model loaded, a rejoin, what a waiting client waits for): shown apart from the warnings. */
  notes?: string[]
}

const BARS = '▁▂▃▄▅▆▇█'

/** A unicode sparkline of the last `width` values. */
export function sparkline(values: number[], width = 40): string {
  const v = values.slice(-width)
  if (v.length === 0) return ''
  const lo = Math.min(...v)
  const hi = Math.max(...v)
  return v.map((x) => BARS[hi === lo ? 3 : Math.round(((x - lo) / (hi - lo)) * (BARS.length - 1))]).join('')
}

export const mb = (b: number | null | undefined) => (b === null || b === undefined ? '–' : `${(b / 1e6).toFixed(2)} MB`)
export const fixed = (x: number | null | undefined, d: number) => (x === null || x === undefined ? '–' : x.toFixed(d))
export const STATE_COLOR: Record<string, string> = {Healthy: 'green', Dropped: 'red', Ejected: 'red', Withdrawn: 'yellow', Pending: 'yellow', exited: 'red', killed: 'red'}

/** A client row's step and loss, from the client's own reports; nothing (not dashes) before it has reported. */
export function clientFigures(c: TerminalView['clients'][number]): string {
  const has = (x: number | null | undefined) => x !== null && x !== undefined
  if (!has(c.step) && !has(c.loss)) return ''
  return ` step ${String(c.step ?? '–').padEnd(5)} loss ${fixed(c.loss, 3)}`
}

/** The view's lines as plain text (what the ink view draws, without colour): also for tests and the README. */
export function viewLines(v: TerminalView): string[] {
  const s = v.summary
  const lines = [v.title]
  if (s) {
    const left = timeLeftText(s) ? `  ${timeLeftText(s)}` : ''
    lines.push(`phase ${s.run_state}${left}   round ${s.step}/${s.total_steps}   epoch ${s.epoch}`)
    const c = s.clients_by_state
    lines.push(
      `clients ${c.healthy} healthy, ${c.dropped} dropped, ${c.withdrawn} withdrawn, ${c.ejected} ejected, ${c.pending} pending` +
        (s.round ? `   witnesses ${s.round.witness_proofs}/${s.round.witnesses_expected} (quorum ${s.round.witness_quorum})` : ''),
    )
  }
  const last = v.losses.at(-1)
  lines.push(`loss ${fixed(last, 3)} ${sparkline(v.losses)}${v.valLoss !== null && v.valLoss !== undefined ? `   validation ${fixed(v.valLoss, 3)}` : ''}`)
  const peers = v.peers ? `${v.peers.all}${v.peers.direct !== undefined && v.peers.direct !== null ? ` (${v.peers.direct} direct, ${v.peers.relayed ?? 0} relayed)` : ''}` : '–'
  lines.push(
    `tokens/s ${fixed(v.tokensPerSecond, 0)}   in ${mb(v.bytesIn)}   out ${mb(v.bytesOut)}   applied ${v.applied ?? '–'} of ${v.accepted ?? '–'} accepted   peers ${peers}`,
  )
  for (const c of v.clients) lines.push(`  ${c.name.padEnd(18)} ${c.state.padEnd(10)}${clientFigures(c)}${c.note ? `  ${c.note}` : ''}`)
  for (const n of (v.notes ?? []).slice(-2)) lines.push(`· ${n}`)
  for (const w of v.warnings.slice(-3)) lines.push(`! ${w}`)
  return lines
}
