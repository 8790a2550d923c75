// The live terminal view drawn with ink; loaded by startTerminalView (terminal-view.ts) only when a terminal shows it,
// so commands that print plain lines or JSON never load ink and React.
import {Box, render, Text} from 'ink'
import {createElement as h, useEffect, useState, type ReactElement} from 'react'
import {timeLeftText} from './summary.js'
import {clientFigures, fixed, mb, sparkline, STATE_COLOR, type TerminalView} from './terminal-format.js'

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
        timeLeftText(s) ? `  ${timeLeftText(s)}` : '',
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
        `${clientFigures(c)}${c.note ? `  ${c.note}` : ''}`,
      ),
    ),
    ...(v.notes ?? []).slice(-2).map((n, i) => h(Text, {key: `n${i}`, dimColor: true}, `· ${n}`)),
    ...v.warnings.slice(-3).map((w, i) => h(Text, {key: `w${i}`, color: 'yellow'}, `! ${w}`)),
  )
}

/** Draws the view live until stop(). */
export function renderView(get: () => TerminalView, intervalMs: number): {stop: () => void} {
  const app = render(h(View, {get, intervalMs}), {exitOnCtrlC: false, patchConsole: false, stdout: process.stdout})
  return {
    stop: () => {
      app.rerender(h(View, {get, intervalMs: 1e9}))
      app.unmount()
    },
  }
}
