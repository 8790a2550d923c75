// Time and bytes per round across hosts (network namespaces, see test/net/lab.ts): a coordinator and 3 clients
// training the tiny-demo model (1.5M parameters) for BENCH_NET_ROUNDS rounds on each topology:
//   segment  - every host on one bridge: clients connect directly;
//   nat      - each client behind its own NAT router (masquerade): clients reach each other through the
//              coordinator's circuit relay;
//   slow     - like segment, one client's link limited to 5 Mbit/s each way (tc tbf).
// Then a client of the nat topology is killed and restarted: the model transfer to it goes through the relay.
// Needs root and ip/nft/tc (as test/net); prints a markdown table for bench/README.md.
import {copyFileSync, mkdtempSync, rmSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {ensureDemoCorpus} from '../src/core/corpus.js'
import {projectRoot} from '../src/core/worker/python.js'
import {NetRun, rounds, waitForStep} from '../test/net/harness.js'
import {Lab, labUnavailable, type Host} from '../test/net/lab.js'

const ROUNDS = Number(process.env.BENCH_NET_ROUNDS ?? 6)
const unavailable = labUnavailable({nat: true, rates: true})
if (unavailable) {
  console.log(`skipped: ${unavailable}`)
  process.exit(0)
}
await ensureDemoCorpus()
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]

interface Row {
  topology: string
  secondsPerRound: number
  computeMs: number
  bytesInPerRound: number
  /** Per round: the time between a client's consecutive round events minus the slowest client's compute for that step. */
  overheadMs: number
  overheadP90Ms: number
  resultBytes: number
  relayed: number
  exchanged: string
  model?: {bytes: number; seconds: number; relayed: boolean}
}

async function measure(topology: 'segment' | 'nat' | 'slow'): Promise<Row> {
  const lab = new Lab()
  const dir = mkdtempSync(join(tmpdir(), 'psyche-bench-net-'))
  const run = new NetRun(lab, dir, lab.addPublicHost('coord'), {
    // Two epochs: the rounds measured are in the first; a client killed at its end rejoins in the second and
    // takes the model from its peers.
    roundsPerEpoch: ROUNDS + 1,
    totalSteps: 2 * (ROUNDS + 1),
    initMinClients: 3,
    minClients: 2,
    lr: 1e-2,
    maxRoundTrainTime: 30,
    warmupTime: 60,
    seqLen: 128,
  })
  // The tiny-demo model instead of the tests' smaller one.
  copyFileSync(join(projectRoot, 'templates', 'tiny-demo', 'model', 'config.json'), join(dir, 'model', 'config.json'))
  try {
    await run.startServer()
    const hosts: Host[] = ['a', 'b', 'c'].map((n) => (topology === 'nat' ? lab.addNatHost(n) : lab.addPublicHost(n)))
    if (topology === 'slow') lab.limitRate(hosts[0], 5)
    const clients = await Promise.all(hosts.map((h) => run.startClient(h.name, h)))
    await waitForStep(run, clients, ROUNDS, 600_000)
    const perRound: number[] = []
    for (const c of clients) {
      const r = rounds(c).filter((x) => x.step <= ROUNDS)
      for (let i = 1; i < r.length; i++) perRound.push((r[i].bytes_in - r[i - 1].bytes_in) / (r[i].step - r[i - 1].step))
    }
    // Round time: from the first applied round to the last, per round (start-up excluded).
    const seconds = clients.map((c) => {
      const t = c.events.flatMap((e, i) => (e.event === 'round' && (e.step as number) <= ROUNDS ? [c.times[i]] : []))
      return (t.at(-1)! - t[0]) / 1000 / Math.max(1, t.length - 1)
    })
    const all = clients.flatMap((c) => rounds(c).filter((r) => r.step <= ROUNDS))
    // Coordination overhead (as bench/coordination.bench.ts, from the clients' side): round period minus the slowest compute.
    const slowest = new Map<number, number>()
    for (const r of all) if (r.compute_ms) slowest.set(r.step, Math.max(slowest.get(r.step) ?? 0, r.compute_ms))
    const overheads = clients.flatMap((c) => {
      const seen = c.events.flatMap((e, i) => (e.event === 'round' && (e.step as number) <= ROUNDS ? [{step: e.step as number, t: c.times[i]}] : []))
      return seen.slice(1).flatMap((x, i) => (x.step === seen[i].step + 1 && slowest.has(x.step) ? [x.t - seen[i].t - slowest.get(x.step)!] : []))
    })
    const exchanged = all.filter((r) => r.peers_applied === r.other_trainers && r.other_trainers === 2).length
    const row: Row = {
      topology,
      secondsPerRound: median(seconds),
      computeMs: median(all.map((r) => r.compute_ms ?? 0).filter((x) => x > 0)),
      overheadMs: median(overheads),
      overheadP90Ms: [...overheads].sort((a, b) => a - b)[Math.floor(overheads.length * 0.9)],
      bytesInPerRound: median(perRound),
      resultBytes: median(clients.flatMap((c) => c.events.filter((e) => e.event === 'trained').map((e) => e.result_bytes as number))),
      relayed: Math.max(...all.map((r) => r.conn_relayed ?? 0)),
      exchanged: `${exchanged}/${all.length}`,
    }
    if (topology !== 'slow') {
      // Kill one client and restart it: it loads the model from a peer at the next epoch.
      const victim = clients[2]
      victim.kill('SIGKILL')
      await victim.proc
      const again = await run.startClient('c', hosts[2])
      const fetched = await again.waitFor((e) => e.event === 'model_fetched', 'the model transfer', 300_000)
      row.model = {bytes: fetched.bytes as number, seconds: (fetched.ms as number) / 1000, relayed: fetched.relayed as boolean}
    }
    return row
  } finally {
    await run.stop()
    lab.destroySync()
    rmSync(dir, {recursive: true, force: true})
  }
}

const rows: Row[] = []
for (const topology of ['segment', 'nat', 'slow'] as const) {
  const row = await measure(topology)
  rows.push(row)
  console.log(JSON.stringify(row))
}
console.log(
  `\n| topology | s/round (median) | compute ms (median) | overhead ms (median, p90) | result bytes | bytes in/round/client | relayed connections | rounds with all peers' results | model to a restarted client |`,
)
console.log('|---|---|---|---|---|---|---|---|---|')
for (const r of rows) {
  const model = r.model ? `${(r.model.bytes / 1e6).toFixed(1)} MB in ${r.model.seconds.toFixed(1)} s (from start, ${r.model.relayed ? 'relayed' : 'direct'})` : '-'
  console.log(
    `| ${r.topology} | ${r.secondsPerRound.toFixed(2)} | ${r.computeMs.toFixed(0)} | ${r.overheadMs.toFixed(0)} (${r.overheadP90Ms.toFixed(0)}) | ${r.resultBytes} | ${r.bytesInPerRound.toFixed(0)} | ${r.relayed} | ${r.exchanged} | ${model} |`,
  )
}
