// `npm run bench -- scale`: how the coordination layers grow with the number of clients N (bench/README.md, "Scale").
//
// For each N: the real coordinator server in this process, and N real clients (runner, result intake and
// validation, witnessing, libp2p over TCP on 127.0.0.1) in child processes of CLIENTS_PER_PROCESS clients each
// (bench/scale-shard.ts), each client with the load-test compute stand-in (src/core/worker/load-test-worker.ts: no
// model, a well-formed result of RESULT_BYTES after COMPUTE_MS). A few rounds each; measured per N:
//   join         first client process started -> all N joined (server log), and -> first RoundTrain (everyone loaded
//                and connected to everyone)
//   overhead     round period (RoundTrain(s) -> RoundTrain(s+1), server transitions) minus COMPUTE_MS, median
//   to quorum    RoundTrain(s) -> RoundWitness (a witness quorum's proofs arrived) minus COMPUTE_MS, median
//   server       CPU ms and frames/bytes sent per round, RSS (this process: the server, and reading the shards' lines)
//   per client   bytes per round: control (the coordinator link both ways, plus everything on the P2P sockets that is
//                not a result payload: gossip, noise, yamux, identify, requests) and result payloads (downloads)
//   connections  libp2p connections per client
// and the growth exponent of each (least-squares slope of log(value) over log(N)). Plots: bench/scale-*.png.
// Env: BENCH_SCALE_NS (default 8,32,128,256), BENCH_SCALE_ROUNDS (3), BENCH_SCALE_RESULT_BYTES (4096),
// BENCH_SCALE_COMPUTE_MS (500), BENCH_SCALE_PER_PROCESS (16), BENCH_SCALE_G (max_trainers_per_round; default 0: every
// client trains), BENCH_SCALE_OUT (JSON results, default bench/scale-results.json).
// The 128 and 256 runs are heavy: run them on an otherwise idle machine.
import {spawn, type ChildProcess} from 'node:child_process'
import {appendFileSync, writeFileSync} from 'node:fs'
import {join} from 'node:path'
import {createInterface} from 'node:readline'
import {RESULT_PROTOCOL} from '../src/core/p2p/index.js'
import {projectRoot} from '../src/core/worker/python.js'
import {scaleRun, ScaleServer, startMemoryClients} from '../test/scale/harness.js'
import {plotScale} from './scale-plot.js'

const NS = (process.env.BENCH_SCALE_NS ?? '8,32,128,256').split(',').map(Number)
const ROUNDS = Number(process.env.BENCH_SCALE_ROUNDS ?? 3)
const RESULT_BYTES = Number(process.env.BENCH_SCALE_RESULT_BYTES ?? 4096)
const COMPUTE_MS = Number(process.env.BENCH_SCALE_COMPUTE_MS ?? 500)
const PER_PROCESS = Number(process.env.BENCH_SCALE_PER_PROCESS ?? 16)
/** max_trainers_per_round (G): at most G clients train each round, so a client downloads and checks G results, not N (0: all). */
const MAX_TRAINERS = Number(process.env.BENCH_SCALE_G ?? 0)
/** How many clients train (and produce a result) in a round of N. */
const trainersOf = (n: number) => (MAX_TRAINERS > 0 ? Math.min(MAX_TRAINERS, n) : n)
const OUT = process.env.BENCH_SCALE_OUT ?? join(projectRoot, 'bench', 'scale-results.json')
/** A run that has not finished by then is stopped, and reported as such. */
const RUN_TIMEOUT_MS = Number(process.env.BENCH_SCALE_TIMEOUT_S ?? 900) * 1000
/**
 * 'libp2p' (default): as above. 'memory': every client in this process on the simulation's in-memory P2P layer (the
 * real server over TCP, the real clients): the coordinator's side measured exactly without libp2p's costs; CPU and
 * the P2P wire are not separable there (reported as '-').
 */
const P2P = process.env.BENCH_SCALE_P2P ?? 'libp2p'

const median = (xs: number[]) => (xs.length ? [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] : NaN)

interface ProcSample {
  at: number
  rchar: number
  wchar: number
  stdout: number
  cpu_ms: number
  rss: number
  /** the shard's P2P counters (bench/scale-shard.ts wire()) */
  wire?: Record<string, number>
}

export interface ScalePoint {
  n: number
  finished: boolean
  rounds_measured: number
  join_ms: number
  join_to_first_round_ms: number
  overhead_ms: number
  to_quorum_ms: number
  server_cpu_ms_per_round: number
  server_rss_mb: number
  server_frames_per_round: number
  server_bytes_out_per_round: number
  control_bytes_per_client_round: number
  coordinator_bytes_per_client_round: number
  p2p_control_bytes_per_client_round: number
  payload_bytes_per_client_round: number
  connections_per_client: number
  client_cpu_ms_per_client_round: number
  every_result_applied: boolean
  replicas_agree: boolean
  /**
   * Per client per round, by kind: bytes on the connections (conn_in/conn_out), on each protocol's streams
   * ('in /meshsub/1.2.0', 'out /psyche/result/1', …), and gossipsub's counters ('gossipsub rpc_sent_bytes',
   * 'gossipsub rpc_sent_ihave', 'gossipsub ihave_rcv_msgids', …). libp2p series only.
   */
  wire_per_client_round?: Record<string, number>
  errors: string[]
}

async function measureInProcess(n: number): Promise<ScalePoint> {
  const run = await scaleRun({clients: n, rounds: ROUNDS, maxTrainers: MAX_TRAINERS || undefined})
  const server = await ScaleServer.start(run, {limits: {maxConnectionsPerIp: 4096, maxHandshakes: 1024}})
  const t0 = performance.now()
  const {clients} = await startMemoryClients(server, n, {resultBytes: RESULT_BYTES, computeMs: COMPUTE_MS})
  // Unreferenced: the bench exits when its runs end, not RUN_TIMEOUT_MS after the last one began (under the shared lock).
  await Promise.race([Promise.all(clients.map((c) => c.done)), new Promise((r) => setTimeout(r, RUN_TIMEOUT_MS).unref())])
  const finished = server.server.state.run_state === 'Finished'
  for (const c of clients) c.client.stop()
  await Promise.all(clients.map((c) => c.done))
  await server.stop()
  const measured = server.perRound().filter((r) => r.step >= 1 && r.step <= ROUNDS)
  const roundsN = Math.max(1, measured.length)
  const coordinatorBytes = measured.reduce((acc, r) => acc + r.bytesOut + r.bytesIn, 0)
  const payloads: number[] = []
  for (const c of clients) for (let i = 1; i < c.rounds.length; i++) payloads.push(c.rounds[i].bytes_in - c.rounds[i - 1].bytes_in)
  const hashes = new Map<number, Set<string>>()
  for (const c of clients) for (const r of c.rounds) (hashes.get(r.step) ?? hashes.set(r.step, new Set()).get(r.step)!).add(r.param_hash)
  return {
    n,
    finished,
    rounds_measured: measured.length,
    join_ms: (server.joinedAt[n - 1] ?? NaN) - t0,
    join_to_first_round_ms: (server.roundStarts.get(1)?.at ?? NaN) - t0,
    overhead_ms: median(measured.map((r) => r.ms - COMPUTE_MS)),
    to_quorum_ms: median(measured.map((r) => (r.quorumMs ?? NaN) - COMPUTE_MS)),
    server_cpu_ms_per_round: NaN,
    server_rss_mb: NaN,
    server_frames_per_round: median(measured.map((r) => r.framesOut)),
    server_bytes_out_per_round: median(measured.map((r) => r.bytesOut)),
    coordinator_bytes_per_client_round: coordinatorBytes / n / roundsN,
    p2p_control_bytes_per_client_round: NaN,
    control_bytes_per_client_round: NaN,
    payload_bytes_per_client_round: median(payloads),
    connections_per_client: NaN,
    client_cpu_ms_per_client_round: NaN,
    every_result_applied: clients.every((c) => c.rounds.length === ROUNDS && c.rounds.every((r) => r.applied === trainersOf(n) && r.trainers === trainersOf(n))),
    replicas_agree: [...hashes.values()].every((s) => s.size === 1),
    errors: clients.flatMap((c) => c.events.filter((e) => /fail|error/.test(String(e.event))).map((e) => JSON.stringify(e).slice(0, 300))).slice(0, 20),
  }
}

async function measure(n: number): Promise<ScalePoint> {
  if (P2P === 'memory') return measureInProcess(n)
  const run = await scaleRun({clients: n, rounds: ROUNDS, warmupTime: 600, maxRoundTrainTime: 120, roundWitnessTime: 20, maxTrainers: MAX_TRAINERS || undefined})
  // Every client is on 127.0.0.1: the per-address bound must admit them all (the join pacing stays as shipped).
  const server = await ScaleServer.start(run, {limits: {maxConnectionsPerIp: 4096, maxHandshakes: 1024}})
  const shards = Math.ceil(n / PER_PROCESS)
  const procs: ChildProcess[] = []
  const rounds = new Map<string, {step: number; applied: number; trainers: number; bytes_in: number; bytes_out: number; conn_direct: number | null; param_hash: string}>()
  const samples = new Map<number, ProcSample[]>()
  const errors: string[] = []
  let done = 0
  const t0 = performance.now()
  for (let s = 0; s < shards; s++) {
    const count = Math.min(PER_PROCESS, n - s * PER_PROCESS)
    const args = JSON.stringify({serverAddr: server.addr, runId: run.run_id, count, resultBytes: RESULT_BYTES, computeMs: COMPUTE_MS, shard: s})
    // BENCH_SCALE_PROFILE=DIR: a CPU profile of each shard process there.
    const profile = process.env.BENCH_SCALE_PROFILE ? ['--cpu-prof', `--cpu-prof-dir=${process.env.BENCH_SCALE_PROFILE}`] : []
    const child = spawn(process.execPath, [...profile, '--import', 'tsx', join(projectRoot, 'bench', 'scale-shard.ts'), args], {
      cwd: projectRoot,
      stdio: ['ignore', 'pipe', 'pipe'],
    })
    procs.push(child)
    child.stderr!.on('data', (d: Buffer) => {
      const text = d.toString().trim()
      if (text && process.env.BENCH_SCALE_LOG) appendFileSync(process.env.BENCH_SCALE_LOG, `shard ${s} stderr: ${text}\n`)
      if (text && errors.length < 20) errors.push(`shard ${s}: ${text.slice(0, 300)}`)
    })
    createInterface({input: child.stdout!}).on('line', (line) => {
      if (process.env.BENCH_SCALE_LOG && !line.includes('"t":"proc"')) appendFileSync(process.env.BENCH_SCALE_LOG, line + '\n')
      let m: Record<string, unknown>
      try {
        m = JSON.parse(line)
      } catch {
        return
      }
      if (m.t === 'round') rounds.set(`${m.shard}:${m.client}:${m.step}`, m as never)
      else if (m.t === 'proc') {
        let list = samples.get(s)
        if (!list) samples.set(s, (list = []))
        list.push(m as unknown as ProcSample)
      } else if (m.t === 'done') {
        done++
        for (const e of m.errors as string[]) if (errors.length < 20) errors.push(`shard ${s}: ${e}`)
      } else if ((m.t === 'event' || m.t === 'p2p') && errors.length < 20 && /fail|error/.test(String(m.event))) errors.push(`shard ${s}: ${JSON.stringify(m).slice(0, 300)}`)
    })
  }
  const deadline = t0 + RUN_TIMEOUT_MS
  let nextProgress = t0 + 10_000
  while (done < shards && performance.now() < deadline && server.server.state.run_state !== 'Finished') {
    await new Promise((r) => setTimeout(r, 250))
    if (performance.now() < nextProgress) continue
    nextProgress += 10_000
    const st = server.server.state
    console.log(
      `  N=${n} ${((performance.now() - t0) / 1000).toFixed(0)} s: ${st.run_state} step ${st.progress.step}, joined ${server.joinedAt.length}, warmup ready ${st.epoch.warmup_witnesses.length}, round events ${rounds.size}, ${errors.length} errors${errors.length ? ` (last: ${errors.at(-1)!.slice(0, 200)})` : ''}`,
    )
  }
  // The clients leave once the run is Finished: give the shards a moment to report.
  const until = performance.now() + 20_000
  while (done < shards && performance.now() < until) await new Promise((r) => setTimeout(r, 250))
  const finished = server.server.state.run_state === 'Finished'
  for (const p of procs) p.kill('SIGKILL')
  await server.stop()

  const per = server.perRound()
  const measured = per.filter((r) => r.step >= 1 && r.step <= ROUNDS)
  const joinedAll = server.joinedAt.length >= n ? server.joinedAt[n - 1] : NaN
  const firstRound = server.roundStarts.get(1)?.at ?? NaN
  // Clients' bytes per round: the shards' socket I/O between the first and the last measured round boundary.
  const first = server.roundStarts.get(measured[0]?.step ?? -1)
  const last = server.roundStarts.get((measured.at(-1)?.step ?? -2) + 1)
  let wire = 0
  let cpu = 0
  const kinds: Record<string, number> = {}
  if (first && last) {
    // performance.now() in this process vs Date.now() in the shards: both converted to wall-clock ms.
    const wall = (t: number) => performance.timeOrigin + t
    for (const list of samples.values()) {
      const at = (t: number) => list.reduce((best, x) => (Math.abs(x.at - t) < Math.abs(best.at - t) ? x : best), list[0])
      const a = at(wall(first.at))
      const b = at(wall(last.at))
      wire += b.wchar - b.stdout - (a.wchar - a.stdout)
      cpu += b.cpu_ms - a.cpu_ms
      for (const [k, v] of Object.entries(b.wire ?? {})) kinds[k] = (kinds[k] ?? 0) + v - (a.wire?.[k] ?? 0)
    }
  }
  const roundsN = Math.max(1, measured.length)
  const coordinatorBytes = measured.reduce((acc, r) => acc + r.bytesOut + r.bytesIn, 0)
  const clientToServer = measured.reduce((acc, r) => acc + r.bytesIn, 0)
  const list = [...rounds.values()].filter((r) => r.step >= 1 && r.step <= ROUNDS)
  // Result payload bytes: each client's bytes_in (result and model downloads) per round, from its round events.
  const byClient = new Map<string, typeof list>()
  for (const [key, r] of rounds) {
    const client = key.split(':').slice(0, 2).join(':')
    let l = byClient.get(client)
    if (!l) byClient.set(client, (l = []))
    l.push(r)
  }
  const payloads: number[] = []
  for (const l of byClient.values()) {
    l.sort((a, b) => a.step - b.step)
    for (let i = 1; i < l.length; i++) payloads.push(l[i].bytes_in - l[i - 1].bytes_in)
  }
  const payloadPerClientRound = median(payloads)
  // P2P wire bytes written by clients (both directions are the same bytes on loopback: count writes once), minus
  // what they wrote to the coordinator, minus result payloads sent (= received).
  const p2pWirePerClientRound = (wire - clientToServer) / n / roundsN
  // With the nodes' wire counters (bench/scale-shard.ts): bytes the clients' P2P connections sent (after noise and
  // yamux) minus the result protocol's; without them, the estimate from the process's writes above.
  const sentOnP2P = kinds.conn_out
  const p2pControl = sentOnP2P !== undefined ? (sentOnP2P - (kinds[`out ${RESULT_PROTOCOL}`] ?? 0)) / n / roundsN : Math.max(0, p2pWirePerClientRound - payloadPerClientRound)
  const byStep = new Map<number, Set<string>>()
  for (const r of list) {
    let s = byStep.get(r.step)
    if (!s) byStep.set(r.step, (s = new Set()))
    s.add(r.param_hash)
  }
  return {
    n,
    finished,
    rounds_measured: measured.length,
    join_ms: joinedAll - t0,
    join_to_first_round_ms: firstRound - t0,
    overhead_ms: median(measured.map((r) => r.ms - COMPUTE_MS)),
    to_quorum_ms: median(measured.map((r) => (r.quorumMs ?? NaN) - COMPUTE_MS)),
    server_cpu_ms_per_round: median(measured.map((r) => r.cpuMs)),
    server_rss_mb: Math.max(...measured.map((r) => r.rss), 0) / 2 ** 20,
    server_frames_per_round: median(measured.map((r) => r.framesOut)),
    server_bytes_out_per_round: median(measured.map((r) => r.bytesOut)),
    coordinator_bytes_per_client_round: coordinatorBytes / n / roundsN,
    p2p_control_bytes_per_client_round: p2pControl,
    control_bytes_per_client_round: coordinatorBytes / n / roundsN + p2pControl,
    payload_bytes_per_client_round: payloadPerClientRound,
    connections_per_client: median(list.map((r) => r.conn_direct ?? NaN)),
    client_cpu_ms_per_client_round: cpu / n / roundsN,
    every_result_applied: list.length === n * ROUNDS && list.every((r) => r.applied === trainersOf(n) && r.trainers === trainersOf(n)),
    replicas_agree: [...byStep.values()].every((s) => s.size === 1),
    wire_per_client_round: Object.fromEntries(Object.entries(kinds).map(([k, v]) => [k, v / n / roundsN])),
    errors,
  }
}

/** Least-squares slope of log(y) over log(N): the growth exponent. */
export function exponent(points: {n: number; y: number}[]): number {
  const ps = points.filter((p) => p.y > 0 && Number.isFinite(p.y))
  if (ps.length < 2) return NaN
  const xs = ps.map((p) => Math.log(p.n))
  const ys = ps.map((p) => Math.log(p.y))
  const mx = xs.reduce((a, b) => a + b, 0) / xs.length
  const my = ys.reduce((a, b) => a + b, 0) / ys.length
  let num = 0
  let den = 0
  for (let i = 0; i < xs.length; i++) {
    num += (xs[i] - mx) * (ys[i] - my)
    den += (xs[i] - mx) ** 2
  }
  return num / den
}

export const METRICS: {key: keyof ScalePoint; label: string; unit: string}[] = [
  {key: 'overhead_ms', label: 'round period minus compute', unit: 'ms'},
  {key: 'to_quorum_ms', label: 'time to witness quorum (minus compute)', unit: 'ms'},
  {key: 'join_ms', label: 'time for all clients to join', unit: 'ms'},
  {key: 'server_frames_per_round', label: 'server frames sent per round', unit: ''},
  {key: 'server_cpu_ms_per_round', label: 'server CPU per round', unit: 'ms'},
  {key: 'server_rss_mb', label: 'server RSS', unit: 'MiB'},
  {key: 'server_bytes_out_per_round', label: 'server bytes sent per round', unit: 'B'},
  {key: 'control_bytes_per_client_round', label: 'control bytes per client per round', unit: 'B'},
  {key: 'coordinator_bytes_per_client_round', label: '  of which the coordinator link', unit: 'B'},
  {key: 'payload_bytes_per_client_round', label: 'result payload bytes per client per round', unit: 'B'},
  {key: 'connections_per_client', label: 'libp2p connections per client', unit: ''},
  {key: 'client_cpu_ms_per_client_round', label: 'client CPU per client per round', unit: 'ms'},
]

if (import.meta.url === `file://${process.argv[1]}`) {
  const points: ScalePoint[] = []
  console.log(
    `scale bench (${P2P} P2P): N = ${NS.join(', ')}; ${ROUNDS} rounds; results of ${RESULT_BYTES} B after ${COMPUTE_MS} ms; ${P2P === 'memory' ? 'every client in this process' : `${PER_PROCESS} clients per process`}`,
  )
  for (const n of NS) {
    const started = performance.now()
    const p = await measure(n)
    points.push(p)
    console.log(`N=${n} (${((performance.now() - started) / 1000).toFixed(0)} s): ${JSON.stringify(p)}`)
    writeFileSync(
      OUT,
      JSON.stringify({date: new Date().toISOString(), rounds: ROUNDS, result_bytes: RESULT_BYTES, compute_ms: COMPUTE_MS, per_process: PER_PROCESS, points}, null, 1),
    )
  }
  const ok = points.filter((p) => p.finished)
  console.log(`\n| metric | ${points.map((p) => `N=${p.n}`).join(' | ')} | exponent |`)
  console.log(`|---|${points.map(() => '---:').join('|')}|---:|`)
  for (const m of METRICS) {
    const fmt = (v: number) => (Number.isFinite(v) ? (Math.abs(v) >= 100 ? v.toFixed(0) : v.toFixed(1)) : '-')
    const e = exponent(ok.map((p) => ({n: p.n, y: p[m.key] as number})))
    console.log(`| ${m.label}${m.unit ? ` (${m.unit})` : ''} | ${points.map((p) => fmt(p[m.key] as number)).join(' | ')} | ${Number.isFinite(e) ? e.toFixed(2) : '-'} |`)
  }
  console.log(`| every result applied, replicas agree | ${points.map((p) => (p.every_result_applied && p.replicas_agree ? 'yes' : 'NO')).join(' | ')} | |`)
  // Which kinds of P2P traffic grow with N (the libp2p series): each counter per client per round, and its exponent.
  const kinds = [...new Set(points.flatMap((p) => Object.keys(p.wire_per_client_round ?? {})))].sort()
  if (kinds.length) {
    console.log(`\n| P2P per client per round | ${points.map((p) => `N=${p.n}`).join(' | ')} | exponent |`)
    console.log(`|---|${points.map(() => '---:').join('|')}|---:|`)
    for (const k of kinds) {
      const ys = points.map((p) => p.wire_per_client_round?.[k] ?? NaN)
      const e = exponent(ok.map((p) => ({n: p.n, y: p.wire_per_client_round?.[k] ?? NaN})))
      console.log(`| ${k} | ${ys.map((v) => (Number.isFinite(v) ? v.toFixed(0) : '-')).join(' | ')} | ${Number.isFinite(e) ? e.toFixed(2) : '-'} |`)
    }
  }
  for (const p of points) if (p.errors.length) console.log(`N=${p.n} errors: ${p.errors.slice(0, 5).join(' / ')}`)
  const shown = METRICS.filter((m) => points.some((p) => Number.isFinite(p[m.key] as number)))
  if (process.env.BENCH_SCALE_PLOT !== '0') await plotScale(points, shown, exponent, join(projectRoot, 'bench', `scale-${P2P}.png`))
  if (points.some((p) => !p.finished || !p.every_result_applied || !p.replicas_agree)) process.exitCode = 1
}
