// Per-round coordination overhead of the whole client path with 4 real `psyche join` processes (each with its
// own PyTorch worker, 1 thread) on loopback, and the bytes each client sends per round vs a dense fp32 update.
//
// The coordinator runs in this process (CoordinatorServer, so its transitions are timestamped exactly), on the
// tiny demo model. Per round s:
//   wall      = RoundTrain(s) start -> RoundTrain(s+1) start (server transitions)
//   compute   = the slowest client's worker time for s (train_round: forward/backward + apply + produce)
//   overhead  = wall - compute: state push, data, publish, gossip, downloads, witness proofs, the witness window
//   to quorum = RoundTrain(s) start -> RoundWitness (the witness quorum's proofs arrived) - compute
//   window    = RoundWitness -> next RoundTrain: 0 when every witness attested every trainer before the
//               quorum formed, up to round_witness_time when one witness was still downloading
// The coordinator as shipped: millisecond clock, the demo's round_witness_time = 1 s as the upper bound of a
// witness window that closes once every witness attested every trainer, the server's default tick.
// Env: BENCH_ROUNDS (default 15), BENCH_CLIENTS (default 4).
import {join} from 'node:path'
import {execa, type ResultPromise} from 'execa'
import {CoordinatorServer} from '../src/core/backend/index.js'
import {loadRunConfigFile} from '../src/core/config/index.js'
import {ensureDemoCorpus} from '../src/core/corpus.js'
import {projectRoot} from '../src/core/worker/python.js'

const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 15)
const CLIENTS = Number(process.env.BENCH_CLIENTS ?? 4)
const statePath = join(projectRoot, 'templates', 'tiny-demo', 'state.toml')
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]
const p90 = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(xs.length * 0.9))]

interface Mode {
  name: string
  roundWitnessTime: number
}

async function measure(mode: Mode) {
  const run = await loadRunConfigFile(statePath)
  run.config = {...run.config!, init_min_clients: CLIENTS, min_clients: 1, round_witness_time: mode.roundWitnessTime, epoch_time: 3600, total_steps: ROUNDS + 2}
  const starts = new Map<number, number>()
  const quorums = new Map<number, number>()
  const server = await CoordinatorServer.start({
    run,
    log: (e) => {
      const ev = e as {event: string; to?: string; from?: string; step?: number}
      if (ev.event !== 'transition') return
      if (ev.to === 'RoundTrain') starts.set(ev.step!, performance.now())
      if (ev.to === 'RoundWitness') quorums.set(ev.step!, performance.now())
      if (ev.to === 'Cooldown' && ev.from === 'RoundWitness') starts.set(ev.step!, performance.now())
    },
  })
  const compute = new Map<number, number>()
  const resultBytes: number[] = []
  const sentPerRound: number[] = []
  let parameters = 0
  const clients: ResultPromise[] = []
  for (let i = 0; i < CLIENTS; i++) {
    const child = execa(
      process.execPath,
      [join(projectRoot, 'bin', 'psyche.js'), 'join', '--server-addr', `127.0.0.1:${server.port}`, '--run-id', run.run_id!, '--config', statePath, '--threads', '1', '--json'],
      {reject: false, stdin: 'ignore', buffer: false, cleanup: true},
    )
    clients.push(child)
    let partial = ''
    let lastOut = 0
    child.stdout!.setEncoding('utf8')
    child.stdout!.on('data', (chunk: string) => {
      partial += chunk
      const lines = partial.split('\n')
      partial = lines.pop()!
      for (const line of lines) {
        const e = JSON.parse(line)
        if (e.event === 'model_loaded') parameters = e.parameters
        if (e.event === 'round' && e.compute_ms !== null) {
          compute.set(e.step, Math.max(compute.get(e.step) ?? 0, e.compute_ms))
          resultBytes.push(e.result_bytes)
          sentPerRound.push(e.bytes_out - lastOut)
          lastOut = e.bytes_out
        }
      }
    })
  }
  const deadline = Date.now() + 600_000
  while (![...Array(ROUNDS).keys()].every((i) => compute.has(i + 2) && starts.has(i + 3)) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 200))
  for (const c of clients) c.kill('SIGTERM')
  await Promise.all(clients)
  await server.stop()

  // Round 1 is skipped: it includes the workers' first-step warm-up.
  const walls: number[] = []
  const overheads: number[] = []
  const toQuorum: number[] = []
  const windows: number[] = []
  const computes: number[] = []
  for (let s = 2; s < 2 + ROUNDS; s++) {
    const start = starts.get(s)
    const next = starts.get(s + 1)
    const c = compute.get(s)
    if (start === undefined || next === undefined || c === undefined) continue
    walls.push(next - start)
    computes.push(c)
    overheads.push(next - start - c)
    const q = quorums.get(s)
    if (q !== undefined) {
      toQuorum.push(q - start - c)
      windows.push(next - q)
    }
  }
  return {walls, overheads, toQuorum, windows, computes, resultBytes, sentPerRound, parameters}
}

await ensureDemoCorpus()
const rows: string[] = []
let bytesLine = ''
for (const mode of [{name: 'as shipped: ms clock, window ≤ 1 s, early close', roundWitnessTime: 1}] satisfies Mode[]) {
  const m = await measure(mode)
  if (m.walls.length === 0) throw new Error(`${mode.name}: no complete rounds measured`)
  rows.push(
    `| ${mode.name} | ${m.walls.length} | ${median(m.walls).toFixed(0)} ms | ${median(m.computes).toFixed(0)} ms | **${median(m.overheads).toFixed(0)} ms** (p90 ${p90(m.overheads).toFixed(0)}) | ${m.toQuorum.length ? `${median(m.toQuorum).toFixed(0)} ms (p90 ${p90(m.toQuorum).toFixed(0)})` : '-'} | ${m.windows.length ? `${median(m.windows).toFixed(0)} ms (p90 ${p90(m.windows).toFixed(0)}); ${m.windows.filter((w) => w < 500).length}/${m.windows.length} closed early` : '-'} |`,
  )
  const dense = 4 * m.parameters
  const result = median(m.resultBytes)
  const sent = median(m.sentPerRound)
  bytesLine = `${m.parameters.toLocaleString('en-US')} parameters: dense fp32 update ${dense.toLocaleString('en-US')} B; DisTrO result ${result.toLocaleString('en-US')} B (${(dense / result).toFixed(0)}× smaller); bytes a client actually sent per round (its result to ${CLIENTS - 1} peers, re-serves) median ${sent.toLocaleString('en-US')} B = ${((100 * sent) / dense).toFixed(2)} % of one dense update`
}
console.log(`${CLIENTS} clients on loopback, tiny demo model, median over rounds 2..${ROUNDS + 1}\n`)
console.log('| coordinator | rounds | round wall | slowest compute | overhead (wall - compute) | to quorum - compute | witness window |\n|---|---|---|---|---|---|---|')
console.log(rows.join('\n'))
console.log(`\n${bytesLine}`)
