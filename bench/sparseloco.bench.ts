// SparseLoCo against DisTrO on the whole client path: 4 real `psyche join` processes (each with its own PyTorch
// worker, 1 thread) on loopback, the tiny demo model and corpus, the coordinator in this process. Per optimizer:
//   wall        = RoundTrain(s) start -> RoundTrain(s+1) start (server transitions)
//   compute     = the slowest client's worker time for s (train_round: its inner steps or its step, apply, produce)
//   utilization = compute / wall: the share of a round the slowest client's worker computes
//   bytes/token = the result a client sends per round over the tokens the round trains (H global batches for SparseLoCo)
// DisTrO as the template ships it (chunk 64, top-8, 1-bit); SparseLoCo at τemplar's compression (chunk 64, top-64,
// 2-bit) with H inner steps. Env: BENCH_ROUNDS (default 8), BENCH_CLIENTS (default 4), BENCH_H (default "8,30").
import {mkdtempSync, readFileSync, rmSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {execa, type ResultPromise} from 'execa'
import {CoordinatorServer} from '../src/core/backend/index.js'
import {loadRunConfigFile} from '../src/core/config/index.js'
import {demoCorpusDir, ensureDemoCorpus} from '../src/core/corpus.js'
import {projectRoot} from '../src/core/worker/python.js'

const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 8)
const CLIENTS = Number(process.env.BENCH_CLIENTS ?? 4)
const HS = (process.env.BENCH_H ?? '8,30').split(',').map(Number)
const template = join(projectRoot, 'templates', 'tiny-demo')
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]

/** The tiny demo's state.toml with absolute paths and `optimizer` as its optimizer table. */
function runDir(optimizer: string): string {
  const dir = mkdtempSync(join(tmpdir(), 'psyche-bench-sparseloco-'))
  let text = readFileSync(join(template, 'state.toml'), 'utf8')
  text = text.replace(/data_location = .*/, `data_location = { Local = "${join(demoCorpusDir, 'train')}" }`)
  text = text.replace(/\[model\.LLM\.checkpoint\.Local\]\npath = "model"/, `[model.LLM.checkpoint.Local]\npath = "${join(template, 'model')}"`)
  text = text.slice(0, text.indexOf('[model.LLM.optimizer.')) + optimizer
  writeFileSync(join(dir, 'state.toml'), text)
  return dir
}

async function measure(statePath: string) {
  const run = await loadRunConfigFile(statePath)
  run.config = {...run.config!, init_min_clients: CLIENTS, min_clients: 1, epoch_time: 3600, max_round_train_time: 120, total_steps: ROUNDS + 2}
  const starts = new Map<number, number>()
  const server = await CoordinatorServer.start({
    run,
    log: (e) => {
      const ev = e as {event: string; to?: string; from?: string; step?: number}
      if (ev.event !== 'transition') return
      if (ev.to === 'RoundTrain') starts.set(ev.step!, performance.now())
      if (ev.to === 'Cooldown' && ev.from === 'RoundWitness') starts.set(ev.step!, performance.now())
    },
  })
  const compute = new Map<number, number>()
  const resultBytes: number[] = []
  const applied: number[] = []
  const clients: ResultPromise[] = []
  for (let i = 0; i < CLIENTS; i++) {
    const child = execa(
      process.execPath,
      [join(projectRoot, 'bin', 'psyche.js'), 'join', '--server-addr', `127.0.0.1:${server.port}`, '--run-id', run.run_id!, '--config', statePath, '--threads', '1', '--json'],
      {reject: false, stdin: 'ignore', buffer: false, cleanup: true},
    )
    clients.push(child)
    let partial = ''
    child.stdout!.setEncoding('utf8')
    child.stdout!.on('data', (chunk: string) => {
      partial += chunk
      const lines = partial.split('\n')
      partial = lines.pop()!
      for (const line of lines) {
        const e = JSON.parse(line)
        if (e.event === 'round' && e.compute_ms !== null) {
          compute.set(e.step, Math.max(compute.get(e.step) ?? 0, e.compute_ms))
          resultBytes.push(e.result_bytes)
          applied.push(e.peers_applied)
        }
      }
    })
  }
  const deadline = Date.now() + 900_000
  while (![...Array(ROUNDS).keys()].every((i) => compute.has(i + 2) && starts.has(i + 3)) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 200))
  for (const c of clients) c.kill('SIGTERM')
  await Promise.all(clients)
  await server.stop()
  // Round 1 is skipped: it includes the workers' first-step warm-up.
  const walls: number[] = []
  const computes: number[] = []
  const utilization: number[] = []
  for (let s = 2; s < 2 + ROUNDS; s++) {
    const [start, next, c] = [starts.get(s), starts.get(s + 1), compute.get(s)]
    if (start === undefined || next === undefined || c === undefined) continue
    walls.push(next - start)
    computes.push(c)
    utilization.push(c / (next - start))
  }
  const tokens = run.config.global_batch_size_end * run.model.LLM.max_seq_len
  return {walls, computes, utilization, result: median(resultBytes), applied: median(applied), tokens}
}

await ensureDemoCorpus()
const modes: {name: string; h: number; table: string}[] = [
  {
    name: 'DisTrO (the template)',
    h: 1,
    table: '[model.LLM.optimizer.Distro]\nclip_grad_norm = 1.0\ncompression_decay = 0.96\ncompression_chunk = 64\ncompression_topk = 8\nquantize_1bit = true\n',
  },
  ...HS.map((h) => ({name: `SparseLoCo H = ${h}`, h, table: `[model.LLM.optimizer.SparseLoCo]\ninner_steps = ${h}\nchunk = 64\ntopk = 64\nvalue_bits = 2\n`})),
]
const rows: string[] = []
for (const mode of modes) {
  const dir = runDir(mode.table)
  try {
    const m = await measure(join(dir, 'state.toml'))
    if (m.walls.length === 0) throw new Error(`${mode.name}: no complete rounds measured`)
    const tokens = m.tokens * mode.h
    rows.push(
      `| ${mode.name} | ${m.walls.length} | ${median(m.walls).toFixed(0)} ms | ${median(m.computes).toFixed(0)} ms | **${(100 * median(m.utilization)).toFixed(0)} %** | ${m.applied} | ${m.result.toLocaleString('en-US')} B | ${tokens.toLocaleString('en-US')} | ${(m.result / tokens).toFixed(3)} B |`,
    )
  } finally {
    rmSync(dir, {recursive: true, force: true})
  }
}
console.log(`${new Date().toISOString()}: ${CLIENTS} clients on loopback, tiny demo model, median over rounds 2..${ROUNDS + 1}\n`)
console.log(
  '| optimizer | rounds | round wall | slowest compute | utilization | peers applied | result | tokens per round | result bytes per token |\n|---|---|---|---|---|---|---|---|---|',
)
console.log(rows.join('\n'))
