// A join flood against one member, over a real link: the member (the holder) is on its own host, its link limited
// to BENCH_MBIT Mbit/s each way (tc tbf), as a home or cloud uplink is; 3 other members are on a second host, and
// BENCH_JOINERS joiners on a third (network namespaces on one segment, test/net/lab.ts; needs root, ip and tc).
// A round: each of the 4 members publishes a result of BENCH_RESULT_KB KiB and fetches the other three's over
// libp2p, as a round's exchange does; its time is from the first publish to the last fetch. The joiners download
// the model (BENCH_MODEL_MB) from the holder again and again, as fast as it lets them. The honest round time is
// measured quiet, then under the flood with the serving bound off (every request served at once, as before) and at
// its defaults (join --max-model-uploads 4, --max-model-uploads-per-peer 2).
//
//   npm run bench -- join-flood       (BENCH_JOINERS=8 BENCH_ROUNDS=10 BENCH_MBIT=50 BENCH_MODEL_MB=64 BENCH_RESULT_KB=1024;
//                                      BENCH_MAX_UPLOADS, BENCH_MAX_UPLOADS_PER_PEER, BENCH_UPLOAD_MBIT: the bounds, default the flags')
import {spawn, type ChildProcess} from 'node:child_process'
import {randomBytes} from 'node:crypto'
import {createInterface} from 'node:readline'
import {fileURLToPath} from 'node:url'
import {DEFAULT_MODEL_SERVE_LIMITS, P2PNode, type ModelSnapshot, type ResultAnnouncement} from '../src/core/p2p/index.js'
import {generateIdentity} from '../src/core/protocol/identity.js'
import {Lab, labUnavailable} from '../test/net/lab.js'

const JOINERS = Number(process.env.BENCH_JOINERS ?? 8)
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 10)
const MBIT = Number(process.env.BENCH_MBIT ?? 50)
const MODEL_MB = Number(process.env.BENCH_MODEL_MB ?? 64)
const RESULT_KB = Number(process.env.BENCH_RESULT_KB ?? 1024)
const RUN = 'bench-join-flood'

type Command = {cmd: 'connect'; addrs: string[]} | {cmd: 'publish'; step: number} | {cmd: 'fetch'; list: ResultAnnouncement[]} | {cmd: 'flood'; id: string} | {cmd: 'stats'}

/** A process of `count` P2P nodes in one namespace, driven by JSON lines on stdin (one answer line each). */
async function nodesProcess(options: {count: number; serve: boolean; limits: {maxUploads: number; maxUploadsPerPeer: number; maxUploadBytesPerSecond: number}}): Promise<void> {
  const identities = Array.from({length: options.count}, () => generateIdentity())
  const nodes = await Promise.all(
    identities.map((identity) => P2PNode.start({identity, runId: RUN, listen: ['/ip4/0.0.0.0/tcp/0'], quic: false, modelServeLimits: options.limits})),
  )
  if (options.serve) {
    const frames = Array.from({length: Math.max(1, Math.round(MODEL_MB / 4))}, (_, i) => ({
      name: `t${i}`,
      dtype: 'float32',
      shape: [1 << 20],
      data: new Uint8Array(randomBytes(4 << 20)),
    }))
    const model: ModelSnapshot = {step: 1, paramHash: 'bench', frames}
    for (const n of nodes) n.serveModel(async () => model)
  }
  const say = (o: unknown) => process.stdout.write(`${JSON.stringify(o)}\n`)
  say({nodes: nodes.map((n, i) => ({id: identities[i].id, addrs: n.addresses().map(String)}))})
  let fetched = 0
  let failed = 0
  for await (const line of createInterface({input: process.stdin})) {
    const c = JSON.parse(line) as Command
    if (c.cmd === 'connect') {
      for (const n of nodes) await n.connect(c.addrs)
      say({ok: true})
    } else if (c.cmd === 'publish') {
      say({list: await Promise.all(nodes.map((n, i) => n.publishResult(c.step, i, i + 1, new Uint8Array(randomBytes(RESULT_KB * 1024)))))})
    } else if (c.cmd === 'fetch') {
      const mine = new Set(identities.map((i) => i.id))
      await Promise.all(nodes.flatMap((n) => c.list.filter((a) => !mine.has(a.client_id)).map((a) => n.fetchResult(a))))
      for (const n of nodes) n.dropResultsBefore(c.list[0].step)
      say({ok: true})
    } else if (c.cmd === 'flood') {
      for (const n of nodes)
        void (async () => {
          for (;;) {
            const ok = await n.fetchModel([c.id], {step: 1}).then(
              () => true,
              () => false,
            )
            if (ok) fetched++
            else {
              failed++
              await new Promise((r) => setTimeout(r, 500))
            }
          }
        })()
      say({ok: true})
    } else if (c.cmd === 'stats') {
      say({serve: nodes[0].modelServeStats(), fetched, failed})
    }
  }
  await Promise.all(nodes.map((n) => n.stop()))
  process.exit(0)
}

/** The nodes process on a host, and a way to send it a command and read its answer. */
class Remote {
  private readonly lines: string[] = []
  private waiting?: (line: string) => void
  constructor(readonly proc: ChildProcess) {
    createInterface({input: proc.stdout!}).on('line', (line) => {
      if (this.waiting) {
        const w = this.waiting
        this.waiting = undefined
        w(line)
      } else this.lines.push(line)
    })
  }
  static start(lab: Lab, host: ReturnType<Lab['addPublicHost']>, options: Parameters<typeof nodesProcess>[0]): Remote {
    const argv = lab.exec(host, [process.execPath, ...process.execArgv, fileURLToPath(import.meta.url), 'nodes', JSON.stringify(options)])
    return new Remote(spawn(argv[0], argv.slice(1), {stdio: ['pipe', 'pipe', 'inherit']}))
  }
  next<T>(): Promise<T> {
    const line = this.lines.shift()
    if (line !== undefined) return Promise.resolve(JSON.parse(line) as T)
    return new Promise((resolve) => (this.waiting = (l) => resolve(JSON.parse(l) as T)))
  }
  ask<T>(c: Command): Promise<T> {
    this.proc.stdin!.write(`${JSON.stringify(c)}\n`)
    return this.next<T>()
  }
  stop(): void {
    this.proc.stdin!.end()
    this.proc.kill('SIGTERM')
  }
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]
const p90 = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(xs.length * 0.9))]
let nextStep = 10

async function rounds(holder: Remote, members: Remote): Promise<number[]> {
  const times: number[] = []
  for (let r = 0; r < ROUNDS; r++) {
    const step = nextStep++
    const t = performance.now()
    const [a, b] = await Promise.all([holder.ask<{list: ResultAnnouncement[]}>({cmd: 'publish', step}), members.ask<{list: ResultAnnouncement[]}>({cmd: 'publish', step})])
    const list = [...a.list, ...b.list]
    await Promise.all([holder.ask({cmd: 'fetch', list}), members.ask({cmd: 'fetch', list})])
    times.push(performance.now() - t)
  }
  return times
}

interface Row {
  label: string
  times: number[]
  served?: {uploads: number; busy: number; peakUploads: number}
  seconds: number
}

async function scenario(mode: 'unbounded' | 'bounded'): Promise<Row[]> {
  const bounded = {
    maxUploads: Number(process.env.BENCH_MAX_UPLOADS ?? DEFAULT_MODEL_SERVE_LIMITS.maxUploads),
    maxUploadsPerPeer: Number(process.env.BENCH_MAX_UPLOADS_PER_PEER ?? DEFAULT_MODEL_SERVE_LIMITS.maxUploadsPerPeer),
    maxUploadBytesPerSecond: (Number(process.env.BENCH_UPLOAD_MBIT ?? 0) * 1e6) / 8,
  }
  const limits = mode === 'unbounded' ? {maxUploads: 1_000_000, maxUploadsPerPeer: 1_000_000, maxUploadBytesPerSecond: 0} : bounded
  const lab = new Lab()
  const remotes: Remote[] = []
  try {
    const [holderHost, membersHost, joinersHost] = ['holder', 'members', 'joiners'].map((n) => lab.addPublicHost(n))
    lab.limitRate(holderHost, MBIT)
    const holder = Remote.start(lab, holderHost, {count: 1, serve: true, limits})
    const members = Remote.start(lab, membersHost, {count: 3, serve: false, limits})
    const joiners = Remote.start(lab, joinersHost, {count: JOINERS, serve: false, limits})
    remotes.push(holder, members, joiners)
    type Up = {nodes: {id: string; addrs: string[]}[]}
    const [h, m, j] = await Promise.all([holder.next<Up>(), members.next<Up>(), joiners.next<Up>()])
    const addrsOf = (u: Up) => u.nodes.flatMap((n) => n.addrs.filter((a) => !a.includes('/127.0.0.1/')))
    await Promise.all([
      holder.ask({cmd: 'connect', addrs: addrsOf(m)}),
      members.ask({cmd: 'connect', addrs: [...addrsOf(h), ...addrsOf(m)]}),
      joiners.ask({cmd: 'connect', addrs: addrsOf(h)}),
    ])
    await rounds(holder, members) // warm-up
    const out: Row[] = []
    if (mode === 'bounded') {
      const t = performance.now()
      out.push({label: 'none (quiet)', times: await rounds(holder, members), seconds: (performance.now() - t) / 1000})
    }
    await joiners.ask({cmd: 'flood', id: h.nodes[0].id})
    await new Promise((r) => setTimeout(r, 3_000)) // the flood under way
    const before = (await holder.ask<{serve: Row['served']}>({cmd: 'stats'})).serve!
    const t = performance.now()
    const times = await rounds(holder, members)
    const seconds = (performance.now() - t) / 1000
    const after = (await holder.ask<{serve: Row['served']}>({cmd: 'stats'})).serve!
    const label =
      mode === 'unbounded'
        ? `${JOINERS} joiners, no bound (every request served at once)`
        : `${JOINERS} joiners, bound ${limits.maxUploads} in all, ${limits.maxUploadsPerPeer} per joiner${limits.maxUploadBytesPerSecond ? `, ${(limits.maxUploadBytesPerSecond * 8) / 1e6} Mbit/s` : ''}`
    out.push({label, times, seconds, served: {uploads: after.uploads - before.uploads, busy: after.busy - before.busy, peakUploads: after.peakUploads}})
    return out
  } finally {
    for (const r of remotes) r.stop()
    lab.destroySync()
  }
}

if (process.argv[2] === 'nodes') {
  await nodesProcess(JSON.parse(process.argv[3]) as Parameters<typeof nodesProcess>[0])
} else {
  const unavailable = labUnavailable({rates: true})
  if (unavailable) {
    console.log(`join-flood bench skipped: ${unavailable}`)
    process.exit(0)
  }
  const rows = [...(await scenario('bounded')), ...(await scenario('unbounded'))]
  const quiet = median(rows[0].times)
  console.log(`\nthe holder's link ${MBIT} Mbit/s; ${MODEL_MB} MB model; ${ROUNDS} rounds of 4 members × ${RESULT_KB} KiB results\n`)
  console.log('| join flood | honest round (median) | p90 | vs quiet | model pieces uploaded (4 MiB) | answered busy | most uploads at once |')
  console.log('|---|---|---|---|---|---|---|')
  for (const r of [rows[0], rows[2], rows[1]]) {
    const med = median(r.times)
    console.log(
      `| ${r.label} | ${med.toFixed(0)} ms | ${p90(r.times).toFixed(0)} ms | ${r === rows[0] ? '—' : `+${(((med - quiet) / quiet) * 100).toFixed(0)} %`} | ${r.served?.uploads ?? 0} | ${r.served?.busy ?? 0} | ${r.served?.peakUploads ?? 0} |`,
    )
  }
}
