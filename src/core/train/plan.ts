import {existsSync, readFileSync} from 'node:fs'
import {dirname, join, resolve} from 'node:path'
import {exchangesResults, innerSteps, loadRunConfigFile} from '../config/index.js'
import type {LLMArchitecture, LLMConfig, LLMDataType, LrSchedule, OptimizerConfig, RunConfigFile, DataLocation} from '../config/index.js'
import {architectureMismatch} from '../config/architectures.js'
import {ARCHITECTURES, dataTypeProblem} from '../config/support.js'
import {demoCorpusDir} from '../corpus.js'
import {checkLossMasks, locatePreprocessed} from '../data/preprocessed.js'
import {PsycheError} from '../errors.js'
import {checkRepoId, checkRevision, downloadCheckpoint, type TransferProgress} from '../checkpoint/hub.js'
import {projectRoot} from '../worker/python.js'

const templatesDir = join(projectRoot, 'templates')
const DEFAULT_TEMPLATE = 'tiny-demo'

/** The worker's forward-pass precision: `auto` is bf16 on a CUDA device with bfloat16, fp32 otherwise. */
export type Precision = 'auto' | 'fp32' | 'bf16'

/**
 * Where the model's weights come from, and the run's architecture it must be (the worker refuses another; none: any
 * causal LM transformers builds).
 */
export type ModelSource = (
  | {kind: 'dir'; dir: string}
  /** Random initialisation from an HF config.json (a template's, or a checkpoint dir that has no weights yet). */
  | {kind: 'config'; configPath: string; config: Record<string, unknown>}
) & {architecture?: LLMArchitecture}

/** Everything a single-node run needs, resolved from a run config, a template and flags. */
export interface TrainPlan {
  runId: string
  configPath: string
  model: ModelSource
  data: DataLocation
  /** Finetuning: every batch must carry loss masks (Preprocessed data with a labels column). */
  dataType: LLMDataType
  /** Base directory against which relative data paths resolve. */
  dataBaseDir: string
  validation?: DataLocation
  seqLen: number
  steps: number
  totalBatch: number
  microBatch: number
  optimizer: Exclude<OptimizerConfig, 'Dummy'>
  lrSchedule: LrSchedule
  seed: number
  threads?: number
  /** One device, or one per data-parallel rank (cuda:0,cuda:1). */
  device: string
  /** Data-parallel ranks inside this client (python/psyche_worker/parallel.py); 1 = none. */
  dataParallel: number
  /** Ranks that hold one model in shards (FSDP2, python/psyche_worker/sharding.py); 1 = unsharded. */
  shard: number
  /** Forward-pass precision (python/psyche_worker/model.py resolve_precision): bf16 autocast, fp32 master weights. */
  precision: Precision
  evalEvery: number
  evalBatches: number
  simulatePeers: number
  /**
   * SparseLoCo's simulation with the network path's one-round delay: each simulated client's inner steps of round r+1
   * start before round r's results are applied, moved by its own result only (python/psyche_worker/optim/sparseloco.py).
   */
  simulateDelay: boolean
}

export interface TrainFlags {
  config?: string
  template?: string
  model?: string
  data?: string
  valData?: string
  steps?: number
  microBatch?: number
  totalBatch?: number
  seqLen?: number
  optimizer?: 'adamw' | 'distro' | 'sparseloco'
  lr?: number
  seed?: number
  threads?: number
  device?: string
  /** --devices cuda:0,cuda:1 (one rank each). */
  devices?: string
  /** --data-parallel N. */
  dataParallel?: number
  /** --shard N: the model in N shards, one per rank (FSDP2). */
  shard?: number
  /** --precision auto | fp32 | bf16 (default auto: bf16 on CUDA, fp32 on CPU). */
  precision?: Precision
  evalEvery?: number
  evalBatches?: number
  simulatePeers?: number
  /** --simulate-delay: SparseLoCo's simulated clients apply a round's results one round late, as clients on a network do. */
  simulateDelay?: boolean
  /** Where a `Hub` checkpoint or Preprocessed dataset is downloaded from and with which token (default: HF_ENDPOINT, HF_TOKEN) and into which cache. */
  hub?: {url?: string; token?: string; cacheDir?: string; onProgress?: (p: TransferProgress) => void}
}

export function templateStatePath(name: string): string {
  const path = join(templatesDir, name, 'state.toml')
  if (!existsSync(path)) throw new PsycheError(`--template ${name}: no such template (templates/${name}/state.toml)`)
  return path
}

export function templateModelConfigPath(name: string): string {
  const path = join(templatesDir, name, 'model', 'config.json')
  if (!existsSync(path)) throw new PsycheError(`--template ${name}: no such model template (templates/${name}/model/config.json)`)
  return path
}

export function readModelConfig(path: string): Record<string, unknown> {
  let text: string
  try {
    text = readFileSync(path, 'utf8')
  } catch {
    throw new PsycheError(`${path}: cannot read the model's config.json`)
  }
  try {
    const value = JSON.parse(text)
    if (typeof value !== 'object' || value === null || Array.isArray(value)) throw new Error('not an object')
    return value
  } catch (error) {
    throw new PsycheError(`${path}: not a valid JSON object (${(error as Error).message})`)
  }
}

/** A model directory: its config.json must exist; weights (one file or shards) are optional (random init from the config). */
function modelSourceFromDir(dir: string, where: string): ModelSource {
  const configPath = join(dir, 'config.json')
  if (!existsSync(dir)) throw new PsycheError(`${where}: model directory ${dir} does not exist`)
  if (!existsSync(configPath)) throw new PsycheError(`${where}: ${dir} is not a model directory (no config.json)`)
  // one safetensors file, or several with their index (Hugging Face's sharded layout)
  if (existsSync(join(dir, 'model.safetensors')) || existsSync(join(dir, 'model.safetensors.index.json'))) return {kind: 'dir', dir}
  return {kind: 'config', configPath, config: readModelConfig(configPath)}
}

async function modelFromCheckpoint(run: RunConfigFile, llm: LLMConfig, hub: TrainFlags['hub'] = {}): Promise<ModelSource> {
  const base = dirname(resolve(run.path))
  const checkpoint = llm.checkpoint
  if (typeof checkpoint === 'object' && 'Local' in checkpoint) {
    return modelSourceFromDir(resolve(base, checkpoint.Local.path), `${run.path}: model.LLM.checkpoint.Local.path`)
  }
  if (typeof checkpoint === 'object') {
    const [variant, repo] = Object.entries(checkpoint)[0] as [string, {repo_id?: string}]
    if (repo?.repo_id) {
      // from_pretrained semantics: a repo id that names a local directory is that directory
      const local = resolve(base, repo.repo_id)
      if (existsSync(join(local, 'config.json'))) return modelSourceFromDir(local, `${run.path}: model.LLM.checkpoint.${variant}.repo_id`)
      if (variant === 'Hub' || variant === 'P2P') {
        // a Hub repository: download it (resumable, hash-checked) into the Hub cache and use the snapshot
        const {repo_id, revision} = repo as {repo_id: string; revision?: string | null}
        const where = `${run.path}: model.LLM.checkpoint.${variant}`
        const got = await downloadCheckpoint({
          repo: checkRepoId(repo_id, `${where}.repo_id`),
          revision: revision == null ? undefined : checkRevision(revision, `${where}.revision`),
          hubUrl: hub.url ?? process.env.HF_ENDPOINT,
          token: hub.token ?? process.env.HF_TOKEN,
          cacheDir: hub.cacheDir,
          onProgress: hub.onProgress,
        })
        return modelSourceFromDir(got.dir, where)
      }
      throw new PsycheError(`${run.path}: model.LLM.checkpoint.${variant}.repo_id = "${repo.repo_id}": not a local model directory; pass --model DIR`)
    }
  }
  throw new PsycheError(`${run.path}: model.LLM.checkpoint = ${JSON.stringify(checkpoint)}: psyche train needs a model directory; pass --model DIR`)
}

/** Scales a schedule to a new base learning rate, keeping its shape (final/initial LRs scale with it). */
function withBaseLr(schedule: LrSchedule, lr: number): LrSchedule {
  const [name, params] = Object.entries(schedule)[0] as unknown as [string, Record<string, number>]
  const ratio = params.base_lr > 0 ? lr / params.base_lr : 0
  const scaled: Record<string, number> = {...params, base_lr: lr}
  for (const key of ['final_lr', 'cosine_decay_final_lr', 'linear_decay_final_lr', 'warmup_init_lr']) {
    if (key in params) scaled[key] = ratio ? params[key] * ratio : params[key]
  }
  return {[name]: scaled} as unknown as LrSchedule
}

function positive(value: number | undefined, name: string): void {
  if (value !== undefined && (!Number.isInteger(value) || value < 1)) throw new PsycheError(`${name} = ${value}: must be a positive integer`)
}

/** Optimizer settings used when --optimizer names the one the run config does not (the demo's tuned values). */
const DEFAULT_ADAMW: OptimizerConfig = {AdamW: {betas: [0.9, 0.95], weight_decay: 0.1, eps: 1e-8, clip_grad_norm: 1.0}}
const DEFAULT_DISTRO: OptimizerConfig = {Distro: {clip_grad_norm: 1.0, compression_decay: 0.96, compression_chunk: 64, compression_topk: 8, quantize_1bit: true}}
/** τemplar's settings (hparams/hparams.json) with H = 30 inner steps. */
const DEFAULT_SPARSELOCO: OptimizerConfig = {
  SparseLoCo: {
    inner_steps: 30,
    error_feedback_decay: 0.95,
    chunk: 64,
    topk: 64,
    value_bits: 2,
    outer_lr: 0.4,
    dct: false,
    inner: {betas: [0.9, 0.95], weight_decay: 0.1, eps: 1e-8, clip_grad_norm: 1.0},
  },
}

export async function resolveTrainPlan(flags: TrainFlags): Promise<TrainPlan> {
  for (const name of ['steps', 'microBatch', 'totalBatch', 'seqLen', 'evalBatches', 'simulatePeers'] as const)
    positive(flags[name], `--${name.replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)}`)
  if (flags.config && flags.template) throw new PsycheError('--config and --template are alternatives: give one')
  const configPath = flags.config ? resolve(flags.config) : templateStatePath(flags.template ?? DEFAULT_TEMPLATE)
  const run = await loadRunConfigFile(configPath)
  const llm = run.model.LLM
  const supported = ARCHITECTURES[llm.architecture]
  if (!supported.supported) throw new PsycheError(`${run.path}: model.LLM.architecture = "${llm.architecture}": ${supported.reason}`, {code: 'ECONFIG'})
  const source = flags.model ? modelSourceFromDir(resolve(flags.model), '--model') : await modelFromCheckpoint(run, llm, flags.hub)
  // --model alone (the default template's run): the model's own config.json says what it is
  const modelAlone = flags.model !== undefined && !flags.config && !flags.template
  const architecture: LLMArchitecture = modelAlone ? 'HfAuto' : llm.architecture
  const wrongModel = architectureMismatch(architecture, source.kind === 'config' ? source.config : readModelConfig(join(source.dir, 'config.json')))
  if (wrongModel) {
    throw new PsycheError(`${modelAlone ? `--model ${flags.model}` : `${run.path}: model.LLM.architecture = "${architecture}"`}: ${wrongModel}`, {code: 'ECONFIG'})
  }
  const model: ModelSource = {...source, architecture}

  let optimizer = llm.optimizer
  if (flags.optimizer === 'adamw' && !(typeof optimizer === 'object' && 'AdamW' in optimizer)) optimizer = DEFAULT_ADAMW
  if (flags.optimizer === 'distro' && !(typeof optimizer === 'object' && 'Distro' in optimizer)) optimizer = DEFAULT_DISTRO
  if (flags.optimizer === 'sparseloco' && !(typeof optimizer === 'object' && 'SparseLoCo' in optimizer)) optimizer = DEFAULT_SPARSELOCO
  if (optimizer === 'Dummy') throw new PsycheError(`${run.path}: model.LLM.optimizer = "Dummy" cannot train; use AdamW, Distro or SparseLoCo`)

  const seqLen = flags.seqLen ?? llm.max_seq_len
  // a round of an optimizer with inner steps (SparseLoCo's H) trains H global batches, as in a distributed run
  const totalBatch = flags.totalBatch ?? (run.config?.global_batch_size_start ?? 16) * innerSteps(optimizer)
  const microBatch = Math.min(flags.microBatch ?? 8, totalBatch)
  const scheduleSteps = Object.values(llm.lr_schedule)[0] as {total_steps?: number}
  // the schedule counts inner steps (SparseLoCo: H per round), a step here is a round
  const steps = flags.steps ?? (scheduleSteps.total_steps ? Math.ceil(scheduleSteps.total_steps / innerSteps(optimizer)) : (run.config?.total_steps ?? 100))
  const simulatePeers = flags.simulatePeers ?? 1
  if (simulatePeers > 1 && !exchangesResults(optimizer)) {
    throw new PsycheError('--simulate-peers needs an optimizer that exchanges results (Distro or SparseLoCo)')
  }

  const simulateDelay = flags.simulateDelay ?? false
  if (simulateDelay && !(typeof optimizer === 'object' && 'SparseLoCo' in optimizer)) {
    throw new PsycheError("--simulate-delay: only SparseLoCo's simulation applies a round's results one round late (use --optimizer sparseloco or a SparseLoCo run)")
  }

  if (totalBatch % simulatePeers !== 0) {
    throw new PsycheError(`--total-batch ${totalBatch} does not split evenly among ${simulatePeers} simulated peers`)
  }

  let data: DataLocation
  let dataBaseDir = dirname(resolve(run.path))
  if (flags.data) {
    data = {Local: resolve(flags.data)}
    dataBaseDir = process.cwd()
  } else {
    data = llm.data_location
  }
  const mismatch = dataTypeProblem(llm.data_type, data)
  if (mismatch) throw new PsycheError(`${run.path}: model.LLM.data_type = "${llm.data_type}"${flags.data ? ' with --data' : ''}: ${mismatch}`, {code: 'ECONFIG'})
  if (typeof data === 'object' && 'Preprocessed' in data) {
    // a Hub dataset repository is downloaded here, once, and the run reads the local copy
    const where = `${run.path}: model.LLM.data_location.Preprocessed`
    data = {Preprocessed: await locatePreprocessed(data.Preprocessed, dataBaseDir, where, flags.hub)}
    if (llm.data_type === 'Finetuning') await checkLossMasks(data.Preprocessed, where)
  }
  let validation: DataLocation | undefined = flags.valData ? {Local: resolve(flags.valData)} : undefined
  // the demo corpus carries its own held-out split
  if (!validation && typeof data === 'object' && 'Local' in data && resolve(dataBaseDir, data.Local).startsWith(demoCorpusDir)) {
    validation = {Local: join(demoCorpusDir, 'validation')}
  }

  return {
    runId: run.run_id ?? 'train',
    configPath: run.path,
    model,
    data,
    dataType: llm.data_type,
    dataBaseDir,
    validation,
    seqLen,
    steps,
    totalBatch,
    microBatch,
    optimizer,
    lrSchedule: flags.lr !== undefined ? withBaseLr(llm.lr_schedule, flags.lr) : llm.lr_schedule,
    seed: flags.seed ?? 0,
    threads: flags.threads,
    ...devicePlan(flags),
    precision: flags.precision ?? 'auto',
    evalEvery: flags.evalEvery ?? 0,
    evalBatches: flags.evalBatches ?? 8,
    simulatePeers,
    simulateDelay,
  }
}

/** --device / --devices / --data-parallel / --shard as the worker takes them: a device (list) and rank counts. */
export function devicePlan(flags: Pick<TrainFlags, 'device' | 'devices' | 'dataParallel' | 'shard'>): {device: string; dataParallel: number; shard: number} {
  const shard = flags.shard ?? 1
  if (!Number.isInteger(shard) || shard < 1) throw new PsycheError(`--shard ${flags.shard}: expected a whole number of ranks ≥ 1`)
  if (shard > 1) {
    if (flags.dataParallel !== undefined && flags.dataParallel > 1)
      throw new PsycheError(
        `--shard ${shard} and --data-parallel ${flags.dataParallel}: give one or the other (sharded replicas, HSDP, would add the gradients in another order than an unsharded client, so its results would not be that client's bytes)`,
      )
    const planned = devicePlan({device: flags.device, devices: flags.devices})
    const listed = planned.device.split(',').length
    if (listed > 1 && listed !== shard) throw new PsycheError(`--devices lists ${listed} devices but --shard is ${shard}: give one device per shard`)
    return {device: planned.device, dataParallel: 1, shard}
  }
  if (flags.devices !== undefined) {
    const list = flags.devices.split(',').map((d) => d.trim())
    if (list.some((d) => !/^(cpu|cuda(:\d+)?)$/.test(d))) throw new PsycheError(`--devices ${flags.devices}: expected a comma-separated list like cuda:0,cuda:1`)
    if (flags.dataParallel !== undefined && flags.dataParallel !== list.length)
      throw new PsycheError(`--devices lists ${list.length} devices but --data-parallel is ${flags.dataParallel}: give one or the other`)
    if (flags.device !== undefined && flags.device !== 'auto') throw new PsycheError('--devices and --device: give one or the other')
    return {device: list.join(','), dataParallel: 1, shard: 1}
  }
  return {device: flags.device ?? 'auto', dataParallel: flags.dataParallel ?? 1, shard: 1}
}
