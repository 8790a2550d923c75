import {Box, render, Text} from 'ink'
import {createElement as h, useEffect, useState, type ReactElement} from 'react'
import type {HistoryPoint} from './history.js'
import type {RunSummary} from './summary.js'

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

const mb = (b: number | null | undefined) => (b === null || b === undefined ? '–' : `${(b / 1e6).toFixed(2)} MB`)
const fixed = (x: number | null | undefined, d: number) => (x === null || x === undefined ? '–' : x.toFixed(d))
const STATE_COLOR: Record<string, string> = {Healthy: 'green', Dropped: 'red', Ejected: 'red', Withdrawn: 'yellow', Pending: 'yellow', exited: 'red', killed: 'red'}

/** The view's lines as plain text (what the ink view draws, without colour): also for tests and the README. */
export function viewLines(v: TerminalView): string[] {
  const s = v.summary
  const lines = [v.title]
  if (s) {
    const left = s.phase_time_left_seconds === null ? '' : `  ${s.phase_time_left_seconds.toFixed(0)}s left`
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
  for (const c of v.clients)
    lines.push(`  ${c.name.padEnd(18)} ${c.state.padEnd(10)} step ${String(c.step ?? '–').padEnd(5)} loss ${fixed(c.loss, 3)}${c.note ? `  ${c.note}` : ''}`)
  for (const w of v.warnings.slice(-3)) lines.push(`! ${w}`)
  return lines
}

function View({get, intervalMs}: {get: () => TerminalView; intervalMs: number}): ReactElement {
  const [v, setV] = useState(get)
  useEffect(() => {
    const t = setInterval(() => setV(get()), intervalMs)
    return () => clearInterval(t)
  }, [])
  const s = v.summary
  const last = v.losses.at(-1)
  const peers = v.peers ? `${v.peers.all}${v.peers.direct !== undefined && v.peers.direct !== null ? ` (${v.peers.direct} direct, ${v.peers.relayed ?? 0} relayed)` : ''}` : '–'
  return h(
    Box,
    {flexDirection: 'column', borderStyle: 'round', paddingX: 1},
    h(Text, {bold: true}, v.title),
    s &&
      h(
        Text,
        null,
        'phase ',
        h(Text, {color: 'cyan', bold: true}, s.run_state),
        s.phase_time_left_seconds === null ? '' : `  ${s.phase_time_left_seconds.toFixed(0)}s left`,
        '   round ',
        h(Text, {bold: true}, `${s.step}/${s.total_steps}`),
        `   epoch ${s.epoch}`,
      ),
    s &&
      h(
        Text,
        null,
        `clients `,
        h(Text, {color: 'green'}, `${s.clients_by_state.healthy} healthy`),
        `, ${s.clients_by_state.dropped} dropped, ${s.clients_by_state.withdrawn} withdrawn, ${s.clients_by_state.ejected} ejected, ${s.clients_by_state.pending} pending`,
        s.round ? `   witnesses ${s.round.witness_proofs}/${s.round.witnesses_expected} (quorum ${s.round.witness_quorum})` : '',
      ),
    h(Text, null, 'loss ', h(Text, {bold: true}, fixed(last, 3)), ' ', h(Text, {color: 'blue'}, sparkline(v.losses))),
    h(
      Text,
      null,
      `tokens/s ${fixed(v.tokensPerSecond, 0)}   in ${mb(v.bytesIn)}   out ${mb(v.bytesOut)}   applied ${v.applied ?? '–'} of ${v.accepted ?? '–'} accepted   peers ${peers}`,
    ),
    ...v.clients.map((c, i) =>
      h(
        Text,
        {key: `c${i}`},
        `  ${c.name.padEnd(18)} `,
        h(Text, {color: STATE_COLOR[c.state] ?? 'white'}, c.state.padEnd(10)),
        ` step ${String(c.step ?? '–').padEnd(5)} loss ${fixed(c.loss, 3)}${c.note ? `  ${c.note}` : ''}`,
      ),
    ),
    ...v.warnings.slice(-3).map((w, i) => h(Text, {key: `w${i}`, color: 'yellow'}, `! ${w}`)),
  )
}

/** Draws the view live (ink) until stop(); call only when stdout is a terminal and --json is off. */
export function startTerminalView(get: () => TerminalView, opts: {intervalMs?: number} = {}): {stop: () => void} {
  const app = render(h(View, {get, intervalMs: opts.intervalMs ?? 500}), {exitOnCtrlC: false, patchConsole: false, stdout: process.stdout})
  return {
    stop: () => {
      app.rerender(h(View, {get, intervalMs: 1e9}))
      app.unmount()
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
