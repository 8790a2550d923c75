// A target process of bench/attack.bench.ts (and test/adversarial/memory.test.ts), alone in its process so that its
// resident memory is its own: `coordinator` runs the coordinator server on the run given as JSON in
// PSYCHE_ATTACK_RUN; `data` serves PSYCHE_ATTACK_DATA_DIR (token files) at seq_len PSYCHE_ATTACK_SEQ. Each prints one
// JSON line {"port": …} when listening, then the coordinator's log events as JSON lines (with `t`, ms since start),
// and stops on SIGTERM or when its stdin closes.
import {CoordinatorServer} from '../src/core/backend/index.js'
import type {RunConfigFile} from '../src/core/config/types.js'
import {DataServer, LocalTokenDataset} from '../src/core/data/index.js'

const mode = process.argv[2]
const started = performance.now()
const out = (e: object) => process.stdout.write(`${JSON.stringify({...e, t: Math.round(performance.now() - started)})}\n`)
let stop: () => Promise<void>

if (mode === 'coordinator') {
  const run = JSON.parse(process.env.PSYCHE_ATTACK_RUN!) as RunConfigFile
  const limits = process.env.PSYCHE_ATTACK_LIMITS ? JSON.parse(process.env.PSYCHE_ATTACK_LIMITS) : undefined
  // Only what the bench reads: transitions, slow readers cut off, refusals counted by code.
  const refusals: Record<string, number> = {}
  const server = await CoordinatorServer.start({
    run,
    tickIntervalMs: 20,
    limits,
    log: (e) => {
      const ev = e as Record<string, unknown>
      if (ev.event === 'transition') out(ev)
      else if (ev.event === 'rejected') refusals[String(ev.code)] = (refusals[String(ev.code)] ?? 0) + 1
    },
  })
  const timer = setInterval(() => out({event: 'refusals', ...refusals}), 1000)
  out({port: server.port})
  stop = async () => {
    clearInterval(timer)
    await server.stop()
  }
} else if (mode === 'data') {
  const dataset = await LocalTokenDataset.open(process.env.PSYCHE_ATTACK_DATA_DIR!)
  const server = await DataServer.start(dataset.provider({seqLen: Number(process.env.PSYCHE_ATTACK_SEQ)}), {host: '127.0.0.1', port: 0})
  out({port: server.port})
  stop = async () => {
    await server.close()
    await dataset.close()
  }
} else {
  throw new Error(`usage: attack-target.ts coordinator|data (not ${mode})`)
}

let stopping = false
const end = async () => {
  if (stopping) return
  stopping = true
  await stop()
  process.exit(0)
}
process.on('SIGTERM', () => void end())
process.stdin.on('end', () => void end())
process.stdin.resume()
