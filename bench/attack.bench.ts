// `npm run bench -- attack`: the coordinator server and the data server under hostile connections (issue 20).
// Coordinator: a real server process (bench/attack-target.ts) and 4 honest clients in this process (real runner,
// coordinator link and witnessing; the load-test compute stand-in, 300 ms a round; in-memory P2P), with 0, 100 and
// 1,000 hostile connections from a third process (bench/attack-hostile.ts: the maximum address list, half joining,
// half watching, none reading). Measures the server's resident memory (peak during the run) and the honest
// clients' round time (median), and the CPU time per round of the server, the attacker's process and the honest
// clients' process (BENCH_ATTACK_SERIES=1: per round; BENCH_ATTACK_PROF=DIR: the server under --cpu-prof). Data
// server: its resident memory under 100 clients that each ask for 60 batches (about 15 MB of answers) and never read. BENCH_ATTACK_ROUNDS (default 24), BENCH_ATTACK_COUNTS (0,100,1000).
import {spawn, type ChildProcess} from 'node:child_process'
import {mkdtempSync, readFileSync, rmSync, writeFileSync} from 'node:fs'
import {cpus, tmpdir} from 'node:os'
import {join} from 'node:path'
import {createInterface} from 'node:readline'
import {generateIdentity} from '../src/core/protocol/index.js'
import {projectRoot} from '../src/core/worker/python.js'
import {MemoryNetwork} from '../test/sim/harness.js'
import {scaleRun, startScaleClient, type ScaleClient} from '../test/scale/harness.js'

const ROUNDS = Number(process.env.BENCH_ATTACK_ROUNDS ?? 24)
// BENCH_ATTACK_COUNTS=none: the data server only.
const COUNTS = process.env.BENCH_ATTACK_COUNTS === 'none' ? [] : (process.env.BENCH_ATTACK_COUNTS ?? '0,100,1000').split(',').map(Number)
const HONEST = 4
// BENCH_ATTACK_MODE=refusals: the hostile connections flood refused witnesses (attack-hostile.ts refusals) instead;
// BENCH_ATTACK_LIMITS: the server's limits as JSON (e.g. {"maxStrikes": 1000000000} for no strike budget).
const MODE = process.env.BENCH_ATTACK_MODE === 'refusals' ? 'refusals' : 'coordinator'
const COMPUTE_MS = 300

function fileLimit(): number {
  const m = /^Max open files\s+(\d+)/m.exec(readFileSync('/proc/self/limits', 'utf8'))
  return m ? Number(m[1]) : Infinity
}

function rssMb(pid: number): number {
  const m = /^VmRSS:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))
  return m ? Number(m[1]) / 1024 : NaN
}

/** A process's CPU time so far (user + system, ms), from /proc (NaN once it is gone). */
function cpuMsOf(pid: number): number {
  try {
    // Fields after the command name (which may hold spaces): utime and stime are the 12th and 13th.
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ')
    return ((Number(fields[11]) + Number(fields[12])) * 1000) / CLOCK_TICKS
  } catch {
    return NaN
  }
}
const CLOCK_TICKS = 100
function ownCpuMs(): number {
  const u = process.cpuUsage()
  return (u.user + u.system) / 1000
}

// BENCH_ATTACK_PROF=DIR: the coordinator server runs under the V8 CPU profiler (one .cpuprofile per run in DIR).
const PROF_DIR = process.env.BENCH_ATTACK_PROF

function tsx(args: string[], env: Record<string, string> = {}, nodeArgs: string[] = []): {child: ChildProcess; lines: AsyncIterableIterator<string>} {
  const child = spawn(process.execPath, [...nodeArgs, '--import', 'tsx', ...args], {cwd: projectRoot, env: {...process.env, ...env}, stdio: ['pipe', 'pipe', 'inherit']})
  return {child, lines: createInterface({input: child.stdout!})[Symbol.asyncIterator]()}
}

async function firstJson(lines: AsyncIterableIterator<string>): Promise<Record<string, unknown>> {
  const {value, done} = await lines.next()
  if (done) throw new Error('the process ended before saying anything')
  return JSON.parse(value)
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b)
  return s.length ? s[Math.floor(s.length / 2)] : NaN
}

async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null) return
  const exited = new Promise((r) => child.once('exit', r))
  child.stdin?.end()
  setTimeout(() => child.kill('SIGKILL'), 5000).unref()
  await exited
}

interface CoordinatorResult {
  hostile: number
  rss_start_mb: number
  rss_peak_mb: number
  round_ms_median: number
  round_ms_p90: number
  rounds: number
  /** CPU time per measured round (ms): the server's (what it controls), the attacker process's, the honest clients' process's. */
  server_cpu_ms_per_round: number
  attacker_cpu_ms_per_round: number
  clients_cpu_ms_per_round: number
  refusals: Record<string, number>
  hostile_open_at_end: number
  hostile_sent: number
}

async function coordinatorUnder(hostile: number): Promise<CoordinatorResult> {
  const run = await scaleRun({clients: HONEST, rounds: ROUNDS, warmupTime: 30, maxRoundTrainTime: 10, roundWitnessTime: 2})
  run.run_id = 'attack-bench'
  const prof = PROF_DIR ? ['--cpu-prof', '--cpu-prof-dir', PROF_DIR] : []
  const target = tsx(
    ['bench/attack-target.ts', 'coordinator'],
    {PSYCHE_ATTACK_RUN: JSON.stringify(run), ...(process.env.BENCH_ATTACK_LIMITS ? {PSYCHE_ATTACK_LIMITS: process.env.BENCH_ATTACK_LIMITS} : {})},
    prof,
  )
  const {port} = (await firstJson(target.lines)) as {port: number}
  const addr = `127.0.0.1:${port}`
  const pid = target.child.pid!
  const rssStart = rssMb(pid)
  let peak = rssStart
  const sampler = setInterval(() => {
    try {
      peak = Math.max(peak, rssMb(pid))
    } catch {}
  }, 100)
  // At every round start: the time, and the CPU time so far of the server, the attacker and this process.
  const roundStarts: {step: number; t: number; server: number; attacker: number; clients: number}[] = []
  let attackerPid: number | undefined
  let refusals: Record<string, number> = {}
  let finished: () => void = () => {}
  const done = new Promise<void>((r) => (finished = r))
  let trainingStarted: () => void = () => {}
  const training = new Promise<void>((r) => (trainingStarted = r))
  void (async () => {
    for await (const line of target.lines) {
      const e = JSON.parse(line)
      if (e.event === 'refusals') refusals = e
      if (e.event !== 'transition') continue
      if (e.to === 'RoundTrain' || e.to === 'Cooldown')
        roundStarts.push({step: e.step, t: e.t, server: cpuMsOf(pid), attacker: attackerPid ? cpuMsOf(attackerPid) : 0, clients: ownCpuMs()})
      if (e.to === 'RoundTrain') trainingStarted()
      if (e.to === 'Finished' || e.to === 'Cooldown') finished()
    }
  })()
  const net = new MemoryNetwork(run.run_id!)
  const clients: ScaleClient[] = await Promise.all(
    Array.from({length: HONEST}, () => {
      const identity = generateIdentity()
      return startScaleClient({serverAddr: addr, runId: run.run_id!, identity, p2p: net.node(identity), resultBytes: 4096, computeMs: COMPUTE_MS})
    }),
  )
  await training
  let attacker: ReturnType<typeof tsx> | undefined
  let hostileStats = {opened: 0, refused: 0, closed: 0, sent: 0}
  if (hostile > 0) {
    attacker = tsx(['bench/attack-hostile.ts', MODE, addr, run.run_id!, String(hostile)])
    attackerPid = attacker.child.pid
    void (async () => {
      for await (const line of attacker!.lines) hostileStats = JSON.parse(line)
    })()
  }
  const firstMeasured = roundStarts.length + 2 // rounds that start once the attack is under way
  await Promise.race([done, new Promise((r) => setTimeout(r, 180_000))])
  clearInterval(sampler)
  for (const c of clients) c.client.stop()
  await Promise.all(clients.map((c) => c.done))
  if (attacker) await stopChild(attacker.child)
  await stopChild(target.child)
  const measured = roundStarts.slice(firstMeasured)
  const perRound = (k: 'server' | 'attacker' | 'clients') => (measured.length > 1 ? Math.round((measured.at(-1)![k] - measured[0][k]) / (measured.length - 1)) : NaN)
  const durations = measured.map((r, i, all) => (i > 0 ? r.t - all[i - 1].t : NaN)).filter((x) => !Number.isNaN(x))
  const sorted = [...durations].sort((a, b) => a - b)
  return {
    hostile,
    rss_start_mb: Math.round(rssStart),
    rss_peak_mb: Math.round(peak),
    round_ms_median: Math.round(median(durations)),
    round_ms_p90: Math.round(sorted[Math.floor(sorted.length * 0.9)] ?? NaN),
    rounds: durations.length,
    server_cpu_ms_per_round: perRound('server'),
    attacker_cpu_ms_per_round: perRound('attacker'),
    clients_cpu_ms_per_round: perRound('clients'),
    ...(process.env.BENCH_ATTACK_SERIES
      ? {server_cpu_ms_series: measured.map((r, i) => (i > 0 ? Math.round(r.server - measured[i - 1].server) : 0)), round_ms_series: durations}
      : {}),
    refusals: Object.fromEntries(Object.entries(refusals).filter(([k]) => k !== 'event' && k !== 't')),
    hostile_open_at_end: hostileStats.opened - hostileStats.closed,
    hostile_sent: hostileStats.sent,
  }
}

async function dataServerUnder(clients: number): Promise<{clients: number; rss_start_mb: number; rss_after_mb: number}> {
  const seq = 1024
  const dir = mkdtempSync(join(tmpdir(), 'psyche-attack-data-'))
  try {
    const ids = new Uint16Array(2_000_000)
    for (let i = 0; i < ids.length; i++) ids[i] = (i * 7919) % 50_000
    writeFileSync(join(dir, 'a.bin'), Buffer.from(ids.buffer))
    const target = tsx(['bench/attack-target.ts', 'data'], {PSYCHE_ATTACK_DATA_DIR: dir, PSYCHE_ATTACK_SEQ: String(seq)})
    const {port} = (await firstJson(target.lines)) as {port: number}
    const pid = target.child.pid!
    await new Promise((r) => setTimeout(r, 500))
    const start = rssMb(pid)
    const attacker = tsx(['bench/attack-hostile.ts', 'data', `127.0.0.1:${port}`, String(seq), String(clients)])
    await new Promise((r) => setTimeout(r, 8000))
    let after = rssMb(pid)
    for (let i = 0; i < 10; i++) {
      await new Promise((r) => setTimeout(r, 200))
      after = Math.max(after, rssMb(pid))
    }
    await stopChild(attacker.child)
    await stopChild(target.child)
    return {clients, rss_start_mb: Math.round(start), rss_after_mb: Math.round(after)}
  } finally {
    rmSync(dir, {recursive: true, force: true})
  }
}

const limit = fileLimit()
console.log(
  JSON.stringify({
    bench: 'attack',
    date: new Date().toISOString(),
    cpus: cpus().length,
    cpu: cpus()[0]?.model,
    ulimit_n: limit,
    rounds: ROUNDS,
    honest: HONEST,
    compute_ms: COMPUTE_MS,
  }),
)
const results: CoordinatorResult[] = []
for (const n of COUNTS) {
  // Respect ulimit -n: the attacker's process and the server each hold one descriptor per connection.
  const hostile = Math.min(n, Math.max(0, limit - 256))
  const r = await coordinatorUnder(hostile)
  results.push(r)
  console.log(JSON.stringify({coordinator: r}))
}
const quiet = results.find((r) => r.hostile === 0)
if (quiet) {
  for (const r of results)
    console.log(
      JSON.stringify({
        hostile: r.hostile,
        rss_growth_mb: r.rss_peak_mb - quiet.rss_peak_mb,
        round_time_vs_quiet_pct: Math.round((r.round_ms_median / quiet.round_ms_median - 1) * 1000) / 10,
        server_cpu_per_round_vs_quiet_pct: Math.round((r.server_cpu_ms_per_round / quiet.server_cpu_ms_per_round - 1) * 1000) / 10,
      }),
    )
}
console.log(JSON.stringify({data_server: await dataServerUnder(Number(process.env.BENCH_ATTACK_DATA_CLIENTS ?? 100))}))
process.exit(0)
