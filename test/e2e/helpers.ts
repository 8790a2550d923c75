import {mkdirSync, writeFileSync} from 'node:fs'
import {join} from 'node:path'
import {execa, type ResultPromise} from 'execa'
import {nonSnakeKeys} from '../../src/core/cli/json.js'
import {demoCorpusDir} from '../../src/core/corpus.js'
import type {EventLine, RoundEvent} from '../../src/core/events.js'
import {projectRoot, pythonEnv, workerPython} from '../../src/core/worker/python.js'
import {cliPath} from '../helpers.js'
export {freePort} from '../helpers.js'

/** A small model for end-to-end runs: fast on one CPU thread, big enough that the loss visibly falls. */
const e2eModelConfig = {
  architectures: ['LlamaForCausalLM'],
  model_type: 'llama',
  vocab_size: 4096,
  hidden_size: 32,
  intermediate_size: 64,
  num_hidden_layers: 1,
  num_attention_heads: 2,
  num_key_value_heads: 2,
  max_position_embeddings: 128,
  rms_norm_eps: 1e-5,
  rope_theta: 10000.0,
  hidden_act: 'silu',
  initializer_range: 0.02,
  tie_word_embeddings: false,
  torch_dtype: 'float32',
}

export interface RunShape {
  runId?: string
  roundsPerEpoch?: number
  totalSteps?: number
  minClients?: number
  initMinClients?: number
  warmupTime?: number
  /** seconds (default 600: the rounds_per_epoch decide) */
  epochTime?: number
  maxRoundTrainTime?: number
  cooldownTime?: number
  batchSize?: number
  seqLen?: number
  lr?: number
  verificationPercent?: number
  /** DisTrO: chunk (default 32), values kept per chunk (default 8) and 1-bit quantization (default on); a smaller chunk, more values and no quantization make bigger results. */
  compressionChunk?: number
  compressionTopk?: number
  /** Overrides of the small model's config.json (a wider model makes bigger results). */
  model?: {hidden_size?: number; intermediate_size?: number}
  quantize1bit?: boolean
  /** SparseLoCo instead of DisTrO: inner steps per round, chunk, top-k (its other settings at their defaults). */
  sparseloco?: {innerSteps: number; chunk?: number; topk?: number; outerLr?: number}
  /** seconds a wait for members lasts once enough have joined (default 1) */
  waitingExtraTime?: number
  /** config.checkpointers: the client ids that may report checkpoints */
  checkpointers?: string[]
}

/**
 * A run directory for end-to-end tests: state.toml (DisTrO or SparseLoCo, constant LR, short phases) and model/config.json.
 * Absolute data path (the demo corpus), so the server and every client read the same file from anywhere.
 */
export function writeE2eRun(dir: string, shape: RunShape = {}): string {
  mkdirSync(join(dir, 'model'), {recursive: true})
  writeFileSync(join(dir, 'model', 'config.json'), JSON.stringify({...e2eModelConfig, ...shape.model}, null, 2))
  const text = `run_id = "${shape.runId ?? 'e2e'}"
run_state = "WaitingForMembers"

[config]
warmup_time = ${shape.warmupTime ?? 10}
cooldown_time = ${shape.cooldownTime ?? 2}
epoch_time = ${shape.epochTime ?? 600}
rounds_per_epoch = ${shape.roundsPerEpoch ?? 3}
max_round_train_time = ${shape.maxRoundTrainTime ?? 6}
round_witness_time = 1
min_clients = ${shape.minClients ?? 1}
init_min_clients = ${shape.initMinClients ?? 3}
verification_percent = ${shape.verificationPercent ?? 0}
witness_nodes = 0
global_batch_size_start = ${shape.batchSize ?? 12}
global_batch_size_end = ${shape.batchSize ?? 12}
global_batch_size_warmup_tokens = 0
total_steps = ${shape.totalSteps ?? 6}
waiting_for_members_extra_time = ${shape.waitingExtraTime ?? 1}
${shape.checkpointers ? `checkpointers = ${JSON.stringify(shape.checkpointers)}\n` : ''}
[model.LLM]
architecture = "HfLlama"
data_type = "Pretraining"
max_seq_len = ${shape.seqLen ?? 64}
cold_start_warmup_steps = 0
data_location = { Local = "${join(demoCorpusDir, 'train')}" }

[model.LLM.checkpoint.Local]
path = "model"

[model.LLM.lr_schedule.Constant]
base_lr = ${shape.lr ?? 3.0e-3}
warmup_steps = 0
warmup_init_lr = 0.0

${shape.sparseloco ? sparseLoCoTable(shape.sparseloco) : distroTable(shape)}`
  const path = join(dir, 'state.toml')
  writeFileSync(path, text)
  return path
}

function distroTable(shape: RunShape): string {
  return `[model.LLM.optimizer.Distro]
clip_grad_norm = 1.0
compression_decay = 0.999
compression_chunk = ${shape.compressionChunk ?? 32}
compression_topk = ${shape.compressionTopk ?? 8}
quantize_1bit = ${shape.quantize1bit ?? true}
`
}

function sparseLoCoTable(s: NonNullable<RunShape['sparseloco']>): string {
  return `[model.LLM.optimizer.SparseLoCo]
inner_steps = ${s.innerSteps}
chunk = ${s.chunk ?? 32}
topk = ${s.topk ?? 32}
outer_lr = ${s.outerLr ?? 0.7}
`
}

/** The size of every SparseLoCo result of the model at `config` (python/psyche_worker/sparseloco_codec.py). */
export async function sparseLoCoResultSize(config: string, chunk: number, topk: number, valueBits: number): Promise<number> {
  const script = [
    'import json, sys',
    'from psyche_worker import sparseloco_codec as c',
    'from psyche_worker.model import init_model',
    'm = init_model(json.load(open(sys.argv[1])), 0)',
    'ls = [c.layout_for(n, tuple(p.shape), int(sys.argv[2]), int(sys.argv[3])) for n, p in sorted(m.named_parameters())]',
    'print(c.result_size(ls, int(sys.argv[4])))',
  ].join('\n')
  const r = await execa(workerPython(), ['-c', script, config, String(chunk), String(topk), String(valueBits)], {env: pythonEnv()})
  return Number(r.stdout)
}

/** What a process under test prints, one JSON line each: a command's events (and the adversary's own, test/adversarial). */
export type Line = EventLine | {event: 'adversary'; attack: string; client_id: string}

/** A field of an event of any kind, for traces in failure messages ('' where the kind has none). */
export function fieldOf(e: Line, key: string): unknown {
  const fields: Record<string, unknown> = e
  return fields[key] ?? ''
}

/** A CLI child process whose stdout is JSON lines, collected as they arrive. */
export class JsonProcess {
  readonly events: Line[] = []
  /** When each event arrived (ms since the epoch), index for index. */
  readonly times: number[] = []
  readonly stderr: string[] = []
  readonly proc: ResultPromise
  private waiters: (() => void)[] = []
  /** Events whose keys break the `--json` convention (snake_case): every wait fails while there is one. */
  readonly camelCase: string[] = []

  /**
   * `entry`: what node runs (default the psyche CLI; the adversarial tests run their hostile client). `wrap`: a
   * command that runs it, e.g. ['ip', 'netns', 'exec', 'ns'] (test/net runs clients on other hosts).
   */
  constructor(
    readonly name: string,
    args: string[],
    entry: string[] = [cliPath],
    wrap: string[] = [],
  ) {
    const argv = [...wrap, process.execPath, ...entry, ...args]
    this.proc = execa(argv[0], argv.slice(1), {cwd: projectRoot, env: {NO_COLOR: '1', CI: '1'}, reject: false, stdin: 'ignore', buffer: false, cleanup: true})
    let partial = ''
    this.proc.stdout!.setEncoding('utf8')
    this.proc.stdout!.on('data', (chunk: string) => {
      partial += chunk
      const lines = partial.split('\n')
      partial = lines.pop()!
      for (const line of lines) {
        if (!line.trim()) continue
        try {
          const event = JSON.parse(line) as Line
          this.events.push(event)
          this.times.push(Date.now())
          const bad = nonSnakeKeys(event)
          if (bad.length > 0) this.camelCase.push(`${String(event.event)}: ${bad.join(', ')}`)
        } catch {
          this.stderr.push(`(stdout) ${line}`)
        }
      }
      for (const w of this.waiters.splice(0)) w()
    })
    this.proc.stderr!.setEncoding('utf8')
    this.proc.stderr!.on('data', (chunk: string) => {
      this.stderr.push(chunk)
      if (this.stderr.length > 200) this.stderr.splice(0, this.stderr.length - 200)
    })
    void this.proc.then(() => {
      for (const w of this.waiters.splice(0)) w()
    })
  }

  get exited(): boolean {
    return this.proc.exitCode !== undefined && this.proc.exitCode !== null
  }

  /** The first event satisfying `match` (waiting for it), or throws after `timeoutMs` naming what it waited for. */
  async waitFor<E extends Line>(match: (e: Line) => e is E, what: string, timeoutMs: number): Promise<E>
  async waitFor(match: (e: Line) => boolean, what: string, timeoutMs: number): Promise<Line>
  async waitFor(match: (e: Line) => boolean, what: string, timeoutMs: number): Promise<Line> {
    const deadline = Date.now() + timeoutMs
    for (;;) {
      if (this.camelCase.length > 0) throw new Error(`${this.name}: --json keys must be snake_case; found ${this.camelCase.join('; ')}`)
      const hit = this.events.find(match)
      if (hit) return hit
      const left = deadline - Date.now()
      if (left <= 0) {
        const last = this.events.slice(-8).map((e) => JSON.stringify(e).slice(0, 300))
        throw new Error(
          `${this.name}: timed out after ${timeoutMs} ms waiting for ${what}; its last events:\n${last.join('\n')}\nstderr tail: ${this.stderr.join('').slice(-1500)}`,
        )
      }
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, Math.min(left, 500))
        this.waiters.push(() => {
          clearTimeout(timer)
          resolve()
        })
      })
    }
  }

  rounds(): RoundEvent[] {
    return this.events.filter((e) => e.event === 'round')
  }

  kill(signal: NodeJS.Signals = 'SIGTERM'): void {
    this.proc.kill(signal)
  }

  async stop(): Promise<void> {
    if (this.exited) return
    this.proc.kill('SIGTERM')
    const timer = setTimeout(() => this.proc.kill('SIGKILL'), 5000)
    await this.proc
    clearTimeout(timer)
  }
}

/** `psyche server run` for a state.toml; resolves once it reports listening. */
export async function startServer(
  statePath: string,
  options: {port?: number; saveStateDir?: string; withdrawOnDisconnect?: boolean} = {},
): Promise<{server: JsonProcess; port: number}> {
  const args = ['server', 'run', '--state', statePath, '--host', '127.0.0.1', '--json']
  if (options.withdrawOnDisconnect === false) args.push('--withdraw-on-disconnect', 'false')
  if (options.port) args.push('--server-port', String(options.port))
  if (options.saveStateDir) args.push('--save-state-dir', options.saveStateDir)
  const server = new JsonProcess('server', args)
  const listening = await server.waitFor((e) => e.event === 'listening', 'the server to listen', 60_000)
  return {server, port: listening.port as number}
}

/** `psyche join --json` with one torch thread (a 2-core machine runs several of these). */
export function startClient(name: string, port: number, statePath: string, identityPath?: string): JsonProcess {
  // One machine: the libp2p node listens on loopback only (and so tells peers its loopback address).
  const args = ['join', '--server-addr', `127.0.0.1:${port}`, '--run-id', 'e2e', '--config', statePath, '--threads', '1', '--p2p-listen', '/ip4/127.0.0.1/tcp/0', '--json']
  if (identityPath) args.push('--identity', identityPath)
  return new JsonProcess(name, args)
}

/** Each client's parameter hash by step, and the steps every given client applied. */
export function hashesByStep(clients: JsonProcess[]): Map<number, Map<string, string>> {
  const out = new Map<number, Map<string, string>>()
  for (const c of clients) {
    for (const r of c.rounds()) {
      let m = out.get(r.step)
      if (!m) out.set(r.step, (m = new Map()))
      m.set(c.name, r.param_hash)
    }
  }
  return out
}
