// `npm run bench -- utilization`: how busy a client's GPU would stay, with home links, for a 1B model (issue 38 item 5).
//
// N real clients (runner, result intake and validation, witnessing, libp2p over TCP), each alone on its own host
// (test/net/lab.ts: network namespaces; needs root, ip and tc) behind a home link limited with tc tbf to
// 100 / K Mbit/s down and 20 / K up, and the coordinator server on a host of its own. Each client has the load-test
// compute stand-in (src/core/worker/load-test-worker.ts) set to a 1B model on an H200 (bench/README.md, "GPU"):
//   step         a per-client batch of 256 × 1024 = 262,144 tokens at the measured 40,477 tokens/s of `psyche train`
//                at 1B: 6,476 ms of compute per step (only forward/backward: DisTrO's or SparseLoCo's own work on the
//                device is not modelled);
//   result size  DisTrO's result for llama-1b, 3,513,025 B (0.026 bit/parameter); SparseLoCo's, 21,476,224 B
//                (0.156 bit/parameter × 1,100,048,384 parameters; bench/README.md, "SparseLoCo: bytes per round"),
//                both ÷ K, as the links are: transfer times are those of the full-size run.
// A SparseLoCo round is H inner steps: each client gets H batches a round and computes H steps, then sends one result.
// The runner is the same for both (Training.begin/train: round r+1's compute overlaps round r's downloads).
// Rows (BENCH_UTIL_ROWS, comma-separated; default distro@8,sparseloco-h15@8):
//   distro@N            DisTrO, every client trains every step (global batch N × 262,144 tokens)
//   distro-gG@N         DisTrO with max_trainers_per_round = G: the same global batch over G trainers (each computes
//                       N / G batches; the others verify, witness, serve and wait)
//   sparseloco-hH@N     SparseLoCo with H inner steps a round
// Each row: BENCH_UTIL_WARMUP (1) rounds not measured, then BENCH_UTIL_ROUNDS (2) measured: the window is from the
// start of the first measured round to the start of the round after the last (the coordinator's RoundTrain).
// Other knobs: BENCH_UTIL_K (8: link rates and result sizes ÷ K), BENCH_UTIL_STEP_MS (6476), BENCH_UTIL_PER_CLIENT
// (print every client's line), BENCH_UTIL_DOWNLOAD_TIMEOUT_S (600: a result download's time limit),
// BENCH_UTIL_SPECULATE=0 (clients begin a round's compute only once it begins, not on its predicted batches as soon
// as their previous result is out: client/decide.ts `speculate`). Compute of a speculative round that was undone
// (its round gave other batches) is not counted as busy; one still running when the window closes counts up to its
// end. BENCH_UTIL_PIECE_BYTES (1 MiB ÷ K: the piece size of results fetched in pieces).
// Per client: GPU-busy fraction (its compute ÷ the window's wall), bytes up and down through its link per token
// trained (kernel counters, × K: at full scale), its CPU. Per result: how many fetchers downloaded it from its
// producer (the fetchers' result_fetched events). What limits the row: see utilization-stats.ts limitOf.
import {spawn, type ChildProcess} from 'node:child_process'
import {readFileSync} from 'node:fs'
import {loadavg} from 'node:os'
import {join} from 'node:path'
import {createInterface} from 'node:readline'
import {fileURLToPath} from 'node:url'
import {loadRunConfigFile} from '../src/core/config/index.js'
import {P2PNode} from '../src/core/p2p/index.js'
import {DEFAULT_SERVING_LIMITS} from '../src/core/p2p/result-exchange.js'
import {BLOCK_BYTES, DEFAULT_PIECE_BYTES} from '../src/core/primitives/pieces.js'
import {generateIdentity} from '../src/core/protocol/identity.js'
import {projectRoot} from '../src/core/worker/python.js'
import {Lab, labUnavailable, type Host} from '../test/net/lab.js'
import {scaleRun, ScaleServer, startScaleClient} from '../test/scale/harness.js'
import {busyFraction, bytesPerToken, cpuBusy, limitOf, median, uploadsPerResult, type Fetch, type Span} from './utilization-stats.js'

const K = Number(process.env.BENCH_UTIL_K ?? 8)
const STEP_MS = Number(process.env.BENCH_UTIL_STEP_MS ?? 6476)
const WARMUP = Number(process.env.BENCH_UTIL_WARMUP ?? 1)
const ROUNDS = Number(process.env.BENCH_UTIL_ROUNDS ?? 2)
const ROWS = (process.env.BENCH_UTIL_ROWS ?? 'distro@8,sparseloco-h15@8').split(',').map((s) => s.trim())
/**
 * A result download's time limit (P2PNode downloadTimeoutMs; the client's default is 60 s): with every fetcher served
 * by the producer at once, each download gets 1 / (N − 1) of its uplink, and a SparseLoCo result at N = 8 needs
 * 7 × 21.5 MB ÷ 2.5 MB/s ≈ 60 s, so the default would cut it (bench/README.md, "Utilization").
 */
const DOWNLOAD_TIMEOUT_S = Number(process.env.BENCH_UTIL_DOWNLOAD_TIMEOUT_S ?? 600)
const SPECULATE = process.env.BENCH_UTIL_SPECULATE !== '0'
/**
 * Results of --swarm-min-bytes or more are fetched in pieces (p2p/piece-fetch.ts): 1 MiB at full scale, so ÷ K here
 * (whole 64 KiB blocks, at least one), for as many pieces per result as in the full-size run.
 */
const PIECE_BYTES = Number(process.env.BENCH_UTIL_PIECE_BYTES ?? Math.max(BLOCK_BYTES, Math.round(DEFAULT_PIECE_BYTES / K / BLOCK_BYTES) * BLOCK_BYTES))
const DISTRO_BYTES = 3_513_025
const SPARSELOCO_BYTES = 21_476_224
const DOWN_MBIT = 100
const UP_MBIT = 20

interface Row {
  spec: string
  n: number
  optimizer: 'distro' | 'sparseloco'
  h: number
  g: number | undefined
}

function parseRow(spec: string): Row {
  const m = /^(distro|sparseloco)(?:-g(\d+)|-h(\d+))?@(\d+)$/.exec(spec)
  if (!m || (m[1] === 'distro' && m[3]) || (m[1] === 'sparseloco' && (m[2] || !m[3])))
    throw new Error(`BENCH_UTIL_ROWS: ${JSON.stringify(spec)} is not distro@N, distro-gG@N or sparseloco-hH@N`)
  return {spec, n: Number(m[4]), optimizer: m[1] as Row['optimizer'], h: m[3] ? Number(m[3]) : 1, g: m[2] ? Number(m[2]) : undefined}
}

const say = (o: object) => process.stdout.write(`${JSON.stringify(o)}\n`)

/** The run's max_round_train_time: three times a trainer's compute, and two minutes. */
const maxRoundTrainSeconds = (row: Row) => Math.ceil((row.h * STEP_MS * (row.g ? row.n / row.g : 1)) / 1000) * 3 + 120

/** The server process, on its own host: the run, and every state transition with its time. */
async function serverProcess(o: {row: Row; rounds: number}): Promise<void> {
  const {row} = o
  const run = await scaleRun({
    clients: row.n,
    rounds: o.rounds,
    warmupTime: 600,
    maxRoundTrainTime: maxRoundTrainSeconds(row),
    roundWitnessTime: 60,
  })
  run.run_id = `utilization-${row.spec.replace(/@/, '-')}`
  run.config!.epoch_time = 36_000
  if (row.g) run.config!.max_trainers_per_round = row.g
  if (row.optimizer === 'sparseloco') {
    const template = await loadRunConfigFile(join(projectRoot, 'templates', 'tiny-sparseloco', 'state.toml'))
    const optimizer = template.model!.LLM.optimizer as {SparseLoCo: object}
    run.model!.LLM.optimizer = {SparseLoCo: {...optimizer.SparseLoCo, inner_steps: row.h}} as never
  }
  const server = await ScaleServer.start(run, {host: '0.0.0.0'})
  say({t: 'server', port: server.server.port, run_id: run.run_id})
  // Each RoundTrain's start, as the server's log stamped it (performance.now() in this process, to epoch ms).
  const sent = new Set<number>()
  setInterval(() => {
    for (const [step, w] of server.roundStarts) {
      if (sent.has(step)) continue
      sent.add(step)
      // Who the round holds and who left the epoch so far (dropped: no witness quorum saw its result of a round).
      const {epoch} = server.server.state
      const quorum = server.quorumAt.get(step - 1)
      const previous = server.roundStarts.get(step - 1)
      say({
        t: 'round_start',
        step,
        at: performance.timeOrigin + w.at,
        roster: epoch.clients.length,
        dropped: epoch.exited.filter((x) => x.state === 'Dropped').length,
        exited: epoch.exited.length,
        // the previous round's RoundTrain to its RoundWitness: a witness quorum held every result, or max_round_train_time
        quorum_s: quorum !== undefined && previous ? (quorum - previous.at) / 1000 : undefined,
      })
    }
  }, 100)
  process.stdin.resume()
  process.stdin.on('end', () => void server.stop().then(() => process.exit(0)))
}

/** One client's process, on its own host. */
async function clientProcess(o: {serverAddr: string; runId: string; ip: string; resultBytes: number; stepMs: number}): Promise<void> {
  // A libp2p error thrown outside any caller (seen here: yamux writing its go-away to a closed connection) would end
  // the process, and the row with it: it is counted as the row's problem instead, and the client goes on.
  process.on('uncaughtException', (error) => say({t: 'event', event: 'uncaught_exception', reason: `${error.name}: ${error.message}`}))
  const identity = generateIdentity()
  const p2p = await P2PNode.start({
    identity,
    runId: o.runId,
    listen: [`/ip4/${o.ip}/tcp/0`],
    relay: false,
    quic: false,
    downloadTimeoutMs: DOWNLOAD_TIMEOUT_S * 1000,
    // the size from which a producer serves its result to a few peers only (the rest fetch it from them) is scaled as
    // the results are, so a scaled run swarms what the full-size run would (DisTrO's 3.5 MB ÷ 16 is under 256 KiB)
    serving: {swarmMinBytes: Math.round(DEFAULT_SERVING_LIMITS.swarmMinBytes / K), pieceBytes: PIECE_BYTES},
    log: (e) => {
      const ev = e as Record<string, unknown>
      if (ev.event === 'result_fetched') {
        // Fetched in pieces from several holders: a share of an upload for each.
        const pieces = Object.fromEntries(((ev.pieces ?? [{peer_id: String(ev.from), pieces: 1}]) as {peer_id: string; pieces: number}[]).map((p) => [p.peer_id, p.pieces]))
        const total = Object.values(pieces).reduce((a, b) => a + b, 0)
        for (const [from, n] of Object.entries(pieces)) say({t: 'fetched', from, producer: ev.client_id, step: ev.step, share: n / total})
      } else if (/fail|bad_blob|refused|stale/.test(String(ev.event))) say({t: 'p2p', ...ev})
    },
  })
  say({t: 'client', id: identity.id, peer_id: p2p.peerId})
  const c = await startScaleClient({
    serverAddr: o.serverAddr,
    runId: o.runId,
    identity,
    p2p,
    resultBytes: o.resultBytes,
    computeMs: 0,
    computeMsPerBatch: o.stepMs,
    speculate: SPECULATE,
  })
  let rounds = 0
  let computes = 0
  setInterval(() => {
    for (const r of c.rounds.slice(rounds)) say({t: 'round', step: r.step, applied: r.applied, trainers: r.trainers, param_hash: r.param_hash.slice(0, 16), at: Date.now()})
    rounds = c.rounds.length
    for (const x of c.worker.computed.slice(computes)) say({t: 'compute', ...x})
    computes = c.worker.computed.length
    say({t: 'running', compute: c.worker.running ?? null})
    for (const e of c.events.splice(0)) say({t: 'event', ...e})
    const cpu = process.cpuUsage()
    say({t: 'cpu', at: Date.now(), cpu_ms: (cpu.user + cpu.system) / 1000})
  }, 500)
  process.stdin.resume()
  process.stdin.on('end', () => process.exit(0))
  await c.done
}

/** A child process on a host: its JSON lines go to `on`. */
function start(lab: Lab, host: Host, args: unknown[], on: (line: Record<string, unknown>) => void): ChildProcess {
  const argv = lab.exec(host, [process.execPath, ...process.execArgv, fileURLToPath(import.meta.url), ...args.map((a) => (typeof a === 'string' ? a : JSON.stringify(a)))])
  const child = spawn(argv[0], argv.slice(1), {stdio: ['pipe', 'pipe', 'inherit']})
  createInterface({input: child.stdout!}).on('line', (line) => {
    if (line.startsWith('{')) on(JSON.parse(line) as Record<string, unknown>)
  })
  // A process that dies before the row ends (a crash) is one of the row's problems.
  child.on('exit', (code, signal) => on({t: 'exited', reason: `exit code ${code}${signal ? `, ${signal}` : ''}`}))
  return child
}

function procStatCpu(): number[] {
  return readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1).map(Number)
}

interface ClientRecord {
  host: Host
  id?: string
  peerId?: string
  computes: (Span & {step: number; batches: number; speculative?: boolean})[]
  /** The compute under way at the last report (null: none): one running past the window's end counts up to it. */
  running: {step: number; batches: number; start: number; speculative?: boolean} | null
  /** Speculative rounds whose work was used, and the steps of those undone (their compute is not counted). */
  speculation: {used: number; discarded: Set<number>}
  cpu: {at: number; cpu_ms: number}[]
  hashes: Map<number, string>
  applied: Map<number, number>
  fetches: Fetch[]
  problems: string[]
  /** Problems the client and its P2P node logged (fetch_failed, stale_connection, …), by event, over the whole run. */
  events: Map<string, number>
  link: {at: number; rx: number; tx: number}[]
}

/** A RoundTrain's start as the server saw it: the roster, who was dropped so far, when the previous round's quorum came. */
interface RoundStart {
  step: number
  roster: number
  dropped: number
  quorum_s?: number
}

interface RowResult {
  row: Row
  window: Span
  period: number
  clients: {busy: number; compute: number; upS: number; downS: number; upPerToken: number; downPerToken: number; upUse: number; downUse: number; cpuPct: number; batches: number}[]
  uploads: {byProducer: number[]; maxByAnyone: number}
  cpuBusy: number
  load: number[]
  everyResultApplied: boolean
  replicasAgree: boolean
  problems: string[]
  events: Map<string, number>
  /** Speculative rounds over the whole run, all clients: used, and undone. */
  speculation: {used: number; discarded: number}
  rounds: RoundStart[]
}

async function measure(row: Row): Promise<RowResult> {
  const resultBytes = Math.round((row.optimizer === 'sparseloco' ? SPARSELOCO_BYTES : DISTRO_BYTES) / K)
  const lab = new Lab()
  const procs: ChildProcess[] = []
  const transitions: {step: number; at: number}[] = []
  const rounds: RoundStart[] = []
  const clients: ClientRecord[] = []
  const loads: number[] = []
  try {
    const serverHost = lab.addPublicHost('srv')
    let port = 0
    let runId = ''
    await new Promise<void>((resolve) => {
      procs.push(
        start(lab, serverHost, ['server', {row, rounds: WARMUP + ROUNDS + 1}], (l) => {
          if (l.t === 'server') {
            port = l.port as number
            runId = l.run_id as string
            resolve()
          } else if (l.t === 'round_start') {
            transitions.push({step: l.step as number, at: l.at as number})
            rounds.push(l as never)
            // progress, on stderr: a row takes many minutes
            process.stderr.write(
              `${row.spec}: round ${String(l.step)} starts at ${new Date(l.at as number).toISOString().slice(11, 19)}: roster ${String(l.roster)}, dropped so far ${String(l.dropped)}, previous round's quorum after ${l.quorum_s === undefined ? '—' : `${Number(l.quorum_s).toFixed(0)} s`}\n`,
            )
          }
        }),
      )
    })
    for (let i = 0; i < row.n; i++) {
      const host = lab.addPublicHost(`c${i}`)
      lab.limitRate(host, UP_MBIT / K, DOWN_MBIT / K)
      const rec: ClientRecord = {
        host,
        computes: [],
        running: null,
        speculation: {used: 0, discarded: new Set()},
        cpu: [],
        hashes: new Map(),
        applied: new Map(),
        fetches: [],
        problems: [],
        events: new Map(),
        link: [],
      }
      clients.push(rec)
      procs.push(
        start(lab, host, ['client', {serverAddr: `${serverHost.ip}:${port}`, runId, ip: host.ip, resultBytes, stepMs: STEP_MS}], (l) => {
          if (l.t === 'client') [rec.id, rec.peerId] = [l.id as string, l.peer_id as string]
          else if (l.t === 'compute') rec.computes.push(l as never)
          else if (l.t === 'running') rec.running = l.compute as ClientRecord['running']
          else if (l.t === 'cpu') rec.cpu.push(l as never)
          else if (l.t === 'round') {
            rec.hashes.set(l.step as number, l.param_hash as string)
            rec.applied.set(l.step as number, l.applied as number)
          } else if (l.t === 'event' && l.event === 'speculation') {
            if (l.outcome === 'used') rec.speculation.used++
            else if (l.outcome === 'discarded') rec.speculation.discarded.add(l.step as number)
          } else if (l.t === 'fetched')
            rec.fetches.push({fetcher: rec.id ?? '', from: l.from as string, producer: l.producer as string, step: l.step as number, share: l.share as number})
          else {
            const name = `${String(l.event ?? l.t)}${typeof l.reason === 'string' ? ` (${l.reason.replace(/12D3Koo\w+/g, 'PEER').slice(0, 60)})` : ''}`
            rec.events.set(name, (rec.events.get(name) ?? 0) + 1)
            if (rec.problems.length < 2) rec.problems.push(JSON.stringify({...l, commitment: undefined, client_id: undefined}).slice(0, 300))
          }
        }),
      )
    }
    const started = (step: number) => transitions.find((t) => t.step === step)?.at
    const first = WARMUP + 1
    const last = WARMUP + ROUNDS + 1
    // A round lasts at most max_round_train_time and round_witness_time (60 s), and the clients' start takes a while.
    const timeoutAt = Date.now() + (maxRoundTrainSeconds(row) + 90) * 1000 * last + 300_000
    let stat0: number[] | undefined
    let stat1: number[] | undefined
    const linkSample = () => {
      const at = Date.now()
      for (const c of clients) c.link.push({at, ...lab.linkBytes(c.host)})
    }
    for (;;) {
      await new Promise((r) => setTimeout(r, 250))
      if (Date.now() > timeoutAt) throw new Error(`${row.spec}: round ${last} did not start in time (rounds started: ${transitions.map((t) => t.step).join(' ')})`)
      if (!stat0 && started(first) !== undefined) {
        stat0 = procStatCpu()
        linkSample()
      }
      if (stat0 && !stat1) loads.push(loadavg()[0])
      if (!stat1 && started(last) !== undefined) {
        stat1 = procStatCpu()
        linkSample()
        break
      }
    }
    await new Promise((r) => setTimeout(r, 1500)) // the last compute and fetch lines
    const window = {start: started(first)!, end: started(last)!}
    const wall = (window.end - window.start) / 1000
    const byPeer = new Map(clients.map((c) => [c.peerId, c.id]))
    const fetches = clients.flatMap((c) => c.fetches.map((f) => ({...f, from: byPeer.get(f.from) ?? f.from})))
    const cpuAt = (c: ClientRecord, at: number) => c.cpu.reduce((best, s) => (Math.abs(s.at - at) < Math.abs(best.at - at) ? s : best), c.cpu[0])
    const upCap = ((UP_MBIT / K) * 1e6) / 8
    const downCap = ((DOWN_MBIT / K) * 1e6) / 8
    const perClient = clients.map((c) => {
      // A compute still running when the window closed (with speculation one usually is: the next round's, begun
      // before the round starts) counts up to the window's end, unless it was undone by then.
      const open = c.running && c.running.start < window.end && !(c.running.speculative && c.speculation.discarded.has(c.running.step))
      const kept = [
        ...c.computes.filter((x) => !(x.speculative && c.speculation.discarded.has(x.step))),
        ...(open ? [{...c.running!, end: Math.max(window.end, c.running!.start + c.running!.batches * STEP_MS)}] : []),
      ]
      // Compute inside the window, and the batches it trained there (a compute across an edge: its share of them).
      const inside = (x: Span) => Math.max(0, Math.min(x.end, window.end) - Math.max(x.start, window.start))
      const batches = kept.reduce((s, x) => s + (x.end > x.start ? (x.batches * inside(x)) / (x.end - x.start) : 0), 0)
      const [a, b] = c.link
      const up = b.tx - a.tx
      const down = b.rx - a.rx
      const linkWall = (b.at - a.at) / 1000
      return {
        busy: busyFraction(kept, window),
        compute: kept.reduce((s, x) => s + inside(x), 0) / 1000 / ROUNDS,
        upS: up / upCap / ROUNDS,
        downS: down / downCap / ROUNDS,
        upPerToken: bytesPerToken(up, batches, K),
        downPerToken: bytesPerToken(down, batches, K),
        upUse: up / (upCap * linkWall),
        downUse: down / (downCap * linkWall),
        cpuPct: ((cpuAt(c, window.end).cpu_ms - cpuAt(c, window.start).cpu_ms) / 1000 / wall) * 100,
        batches,
      }
    })
    // Round s is applied with round s + 1's result (one round late), so by RoundTrain(last) every step up to last - 2
    // is applied everywhere, and its results fetched.
    const applySteps = Array.from({length: last - 2}, (_, i) => i + 1)
    const hashesAgree = applySteps.every((s) => new Set(clients.map((c) => c.hashes.get(s))).size === 1)
    return {
      row,
      window,
      period: wall / ROUNDS,
      clients: perClient,
      uploads: uploadsPerResult(fetches, new Set(applySteps)),
      cpuBusy: cpuBusy(stat0!, stat1!),
      load: loads,
      everyResultApplied: applySteps.every((s) => clients.every((c) => c.applied.get(s) === (row.g ?? row.n))),
      replicasAgree: hashesAgree,
      problems: clients.flatMap((c, i) => c.problems.map((p) => `client ${i}: ${p}`)).slice(0, 4),
      speculation: {used: clients.reduce((n, c) => n + c.speculation.used, 0), discarded: clients.reduce((n, c) => n + c.speculation.discarded.size, 0)},
      rounds,
      events: clients.reduce((all, c) => {
        for (const [k, v] of c.events) all.set(k, (all.get(k) ?? 0) + v)
        return all
      }, new Map<string, number>()),
    }
  } finally {
    for (const p of procs) p.stdin?.end()
    await new Promise((r) => setTimeout(r, 300))
    lab.destroySync()
  }
}

const pct = (x: number) => (Number.isFinite(x) ? `${(x * 100).toFixed(0)} %` : '—')
const num = (x: number, d = 0) => (Number.isFinite(x) ? x.toLocaleString('en-US', {maximumFractionDigits: d, minimumFractionDigits: d}) : '—')
const span = (xs: number[], f: (x: number) => string) => {
  const ok = xs.filter(Number.isFinite)
  return ok.length ? `${f(Math.min(...ok))} / ${f(median(ok))} / ${f(Math.max(...ok))}` : '—'
}

function label(row: Row): string {
  if (row.optimizer === 'sparseloco') return `SparseLoCo H = ${row.h}`
  return row.g ? `DisTrO, max_trainers_per_round = ${row.g}` : 'DisTrO every step'
}

const TABLE_HEADER = `| row | N | round period | GPU-busy (min / median / max) | a round: compute + link time up / down + rest (s) | up B/token | down B/token | producer's uploads per result (max / mean) | uplink / downlink use (busiest) | client CPU (median, of a core) | machine CPU busy | load avg (1 min) | all applied, replicas agree | limit |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|`

/** A row's line of the table printed at the end. */
function tableLine(r: RowResult): string {
  const c = r.clients
  const max = (f: (x: RowResult['clients'][number]) => number) => Math.max(...c.map(f))
  const busy = median(c.map((x) => x.busy))
  const compute = max((x) => x.compute)
  const up = max((x) => x.upS)
  const down = max((x) => x.downS)
  const {limit, rest} = limitOf({busy, period: r.period, compute, up, down, cpuBusy: r.cpuBusy})
  const u = r.uploads.byProducer
  const cells = [
    label(r.row),
    String(r.row.n),
    `${num(r.period, 1)} s`,
    span(
      c.map((x) => x.busy),
      pct,
    ),
    `${num(compute, 1)} + ${num(up, 1)} / ${num(down, 1)} + ${num(rest, 1)}`,
    num(median(c.map((x) => x.upPerToken)), 2),
    num(median(c.map((x) => x.downPerToken)), 2),
    u.length ? `${num(Math.max(...u), 1)} / ${num(u.reduce((a, b) => a + b, 0) / u.length, 1)}` : '—',
    `${pct(max((x) => x.upUse))} / ${pct(max((x) => x.downUse))}`,
    `${num(median(c.map((x) => x.cpuPct)))} %`,
    pct(r.cpuBusy),
    `${num(Math.min(...r.load), 1)}–${num(Math.max(...r.load), 1)}`,
    `${r.everyResultApplied ? 'yes' : 'NO'}, ${r.replicasAgree ? 'yes' : 'NO'}`,
    limit,
  ]
  return `| ${cells.join(' | ')} |`
}

if (process.argv[2] === 'server') await serverProcess(JSON.parse(process.argv[3]) as Parameters<typeof serverProcess>[0])
else if (process.argv[2] === 'client') await clientProcess(JSON.parse(process.argv[3]) as Parameters<typeof clientProcess>[0])
else {
  const unavailable = labUnavailable({rates: true})
  if (unavailable) {
    console.log(`utilization bench skipped: ${unavailable}`)
    process.exit(0)
  }
  const rows = ROWS.map(parseRow)
  const down = DOWN_MBIT / K
  const up = UP_MBIT / K
  console.log(
    `K = ${K}: links ${num(down, 2)} Mbit/s down, ${num(up, 2)} up (100 / 20 ÷ K); results DisTrO ${num(DISTRO_BYTES / K)} B, SparseLoCo ${num(SPARSELOCO_BYTES / K)} B (1B model ÷ K); ` +
      `step ${num(STEP_MS)} ms (262,144 tokens at 40,477 tokens/s, 1B on an H200); result download limit ${DOWNLOAD_TIMEOUT_S} s; ${WARMUP} warm-up round(s), ${ROUNDS} measured; load average at start ${loadavg()
        .map((l) => l.toFixed(2))
        .join(', ')}`,
  )
  const results: RowResult[] = []
  for (const row of rows) {
    const t = Date.now()
    const r = await measure(row).catch((error: Error) => error)
    if (r instanceof Error) {
      console.log(`${row.spec}: not measured: ${r.message}`)
      continue
    }
    results.push(r)
    console.log(`${TABLE_HEADER}\n${tableLine(r)}`)
    const events = [...r.events].map(([k, v]) => `${k} ×${v}`).join(', ')
    console.log(
      `${row.spec}: ${((Date.now() - t) / 1000).toFixed(0)} s; speculative rounds (all clients, whole run): ${r.speculation.used} used, ${r.speculation.discarded} undone; members dropped: ${r.rounds.at(-1)?.dropped ?? 0}; rounds (roster, then the quorum's time of the round before): ${r.rounds.map((x) => `${x.step}: ${x.roster}${x.quorum_s === undefined ? '' : `, ${x.quorum_s.toFixed(0)} s`}`).join('; ')}; problems logged (all clients, whole run): ${events || 'none'}${r.problems.length ? `; e.g. ${r.problems.join(' | ')}` : ''}`,
    )
    if (process.env.BENCH_UTIL_PER_CLIENT) {
      console.log('| client | GPU-busy | up B/token | down B/token | uplink use | downlink use | CPU |')
      console.log('|---|---|---|---|---|---|---|')
      r.clients.forEach((c, i) =>
        console.log(`| ${i} | ${pct(c.busy)} | ${num(c.upPerToken, 2)} | ${num(c.downPerToken, 2)} | ${pct(c.upUse)} | ${pct(c.downUse)} | ${num(c.cpuPct)} % |`),
      )
    }
  }
  console.log(`\n${TABLE_HEADER}`)
  for (const r of results) console.log(tableLine(r))
}
