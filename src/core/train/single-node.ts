import {manifestTokenizer} from '../model.js'
import {closeSync, existsSync, mkdirSync, openSync, writeSync} from 'node:fs'
import {dirname, join, resolve} from 'node:path'
import {ensureDemoCorpus, demoCorpusDir} from '../corpus.js'
import {type DataProvider, openDataProvider} from '../data/index.js'
import {PsycheError} from '../errors.js'
import {sha256} from '../primitives/hash.js'
import {ModelWorker} from '../worker/model-worker.js'
import {loadModel} from './load-model.js'
import type {TrainPlan} from './plan.js'

// the config's DataLocation also names variants no provider serves (Dummy): openDataProvider rejects those by name (config/support.ts)
type ProviderLocation = Parameters<typeof openDataProvider>[0]

interface StepMetrics {
  step: number
  loss: number
  lr: number
  grad_norm: number
  tokens: number
  step_seconds: number
  tokens_per_second: number
  elapsed_seconds: number
  val_loss?: number
  result_bytes?: number
}

export interface TrainSummary {
  steps: number
  tokens: number
  wallSeconds: number
  tokensPerSecond: number
  firstLoss: number
  lastLoss: number
  paramHash: string
  parameters: number
  firstValLoss?: number
  valLoss?: number
  metricsPath?: string
  savedTo?: string
  /** DisTrO runs: simulated peers, mean bytes of one peer's result per step, and dense fp32 gradient bytes. */
  distro?: {peers: number; resultBytes: number; denseBytes: number; compression: number}
}

interface TrainEvents {
  onStatus?(message: string): void
  onStep?(metrics: StepMetrics, plan: TrainPlan): void
}

/** The 32-byte data shuffle seed of a run seed: every party derives the same order from it. */
export function shuffleSeedFor(seed: number): Uint8Array {
  return sha256(`psyche/train-shuffle/${seed}`)
}

function isInDemoCorpus(plan: TrainPlan): boolean {
  const d = plan.data
  return typeof d === 'object' && 'Local' in d && resolve(plan.dataBaseDir, d.Local).startsWith(demoCorpusDir)
}

/** Writes one JSON object per line, flushed per step, so a crash keeps every finished step. */
class JsonlWriter {
  private readonly fd: number
  constructor(readonly path: string) {
    mkdirSync(dirname(path), {recursive: true})
    this.fd = openSync(path, 'w')
  }
  write(record: object): void {
    writeSync(this.fd, JSON.stringify(record) + '\n')
  }
  close(): void {
    closeSync(this.fd)
  }
}

/** Files of a model directory's own tokenizer: a tokenizer.json, or what AutoTokenizer reads without one (python/psyche_worker/model.py). */
const TOKENIZER_FILES = ['tokenizer.json', 'vocab.json', 'tokenizer.model', 'spiece.model', 'vocab.txt']

/**
 * The tokenizer to save with a trained model: the model directory's own (the worker keeps a loaded model's; a
 * directory with a config.json and no weights yet names its own), else the tokenizer.json a Local data directory's
 * manifest names (the one its tokens were made with), if any.
 */
async function dataTokenizer(plan: TrainPlan): Promise<string | undefined> {
  const dir = plan.model.kind === 'dir' ? plan.model.dir : dirname(plan.model.configPath)
  if (TOKENIZER_FILES.some((name) => existsSync(join(dir, name)))) return plan.model.kind === 'dir' ? undefined : dir
  const location = plan.data as {Local?: unknown}
  if (typeof location?.Local !== 'string') return undefined
  return manifestTokenizer(resolve(plan.dataBaseDir, location.Local))
}

/**
 * Single-node training (Psyche's `train` example): one worker, batches from a data provider, the
 * configured optimizer and schedule. Step s trains on batch ids [s·B, (s+1)·B) of the (seed-shuffled)
 * data; the next batch is fetched while the worker computes the current one.
 */
export async function runSingleNode(plan: TrainPlan, options: {metricsPath?: string; savePath?: string; events?: TrainEvents} = {}): Promise<TrainSummary> {
  const events = options.events ?? {}
  if (isInDemoCorpus(plan)) await ensureDemoCorpus(events.onStatus)

  events.onStatus?.('starting the PyTorch worker')
  const worker = await ModelWorker.start({threads: plan.threads, device: plan.device, dataParallel: plan.dataParallel, shard: plan.shard, precision: plan.precision})
  let train: DataProvider | undefined
  let validation: DataProvider | undefined
  let metrics: JsonlWriter | undefined
  try {
    const info = await loadModel(worker, plan.model, plan.seed, plan.seqLen)
    train = await openDataProvider(plan.data as ProviderLocation, {
      seqLen: plan.seqLen,
      baseDir: plan.dataBaseDir,
      vocabSize: info.vocab_size,
      shuffleSeed: shuffleSeedFor(plan.seed),
      wrap: true,
      requireLossMasks: plan.dataType === 'Finetuning',
    })
    checkVocab(train, info.vocab_size)
    if (plan.validation) {
      validation = await openDataProvider(plan.validation as ProviderLocation, {seqLen: plan.seqLen, baseDir: plan.dataBaseDir, vocabSize: info.vocab_size, wrap: true})
      checkVocab(validation, info.vocab_size)
    }
    await worker.configure({
      optimizer: plan.optimizer as Record<string, unknown>,
      lr_schedule: plan.lrSchedule as Record<string, unknown>,
      micro_batch: plan.microBatch,
      simulate_peers: plan.simulatePeers,
      delay_correction: plan.simulateDelay || undefined,
    })
    events.onStatus?.(`model: ${info.parameters.toLocaleString('en-US')} parameters; data: ${train.description}`)

    const valIds = Array.from({length: plan.evalBatches}, (_, i) => i)
    const evaluate = async () => (validation ? (await worker.evaluate(await validation.getSamples(valIds), valIds.length)).loss : undefined)
    const firstValLoss = await evaluate()
    metrics = options.metricsPath ? new JsonlWriter(options.metricsPath) : undefined

    const B = plan.totalBatch
    const batchIds = (step: number) => Array.from({length: B}, (_, i) => step * B + i)
    let next = train.getSamples(batchIds(0))
    let firstLoss = NaN
    let lastLoss = NaN
    let tokens = 0
    let valLoss = firstValLoss
    let resultBytes = 0
    const started = performance.now()
    for (let step = 0; step < plan.steps; step++) {
      const samples = await next
      if (step + 1 < plan.steps) next = train.getSamples(batchIds(step + 1))
      const stepStarted = performance.now()
      const result = await worker.trainStep(samples, B, step)
      const now = performance.now()
      tokens += result.tokens
      if (step === 0) firstLoss = result.loss
      lastLoss = result.loss
      const record: StepMetrics = {
        step,
        loss: result.loss,
        lr: result.lr,
        grad_norm: result.grad_norm,
        tokens: result.tokens,
        step_seconds: (now - stepStarted) / 1000,
        tokens_per_second: tokens / ((now - started) / 1000),
        elapsed_seconds: (now - started) / 1000,
      }
      if (result.result_bytes !== undefined) {
        record.result_bytes = result.result_bytes
        resultBytes += result.result_bytes
      }
      if (plan.evalEvery > 0 && (step + 1) % plan.evalEvery === 0 && step + 1 < plan.steps) record.val_loss = valLoss = await evaluate()
      metrics?.write(record)
      events.onStep?.(record, plan)
    }
    const wallSeconds = (performance.now() - started) / 1000
    if (validation) valLoss = await evaluate()
    const paramHash = await worker.paramHash()
    if (options.savePath) {
      events.onStatus?.(`saving the model to ${options.savePath}`)
      await worker.save(resolve(options.savePath), {tokenizer: await dataTokenizer(plan), card: {steps: plan.steps, tokens}})
    }
    return {
      steps: plan.steps,
      tokens,
      wallSeconds,
      tokensPerSecond: tokens / wallSeconds,
      firstLoss,
      lastLoss,
      paramHash,
      parameters: info.parameters,
      ...(firstValLoss !== undefined ? {firstValLoss, valLoss} : {}),
      ...(options.metricsPath ? {metricsPath: options.metricsPath} : {}),
      ...(options.savePath ? {savedTo: resolve(options.savePath)} : {}),
      ...(resultBytes > 0
        ? {
            distro: {
              peers: plan.simulatePeers,
              resultBytes: resultBytes / plan.steps,
              denseBytes: 4 * info.parameters,
              compression: (4 * info.parameters) / (resultBytes / plan.steps),
            },
          }
        : {}),
    }
  } finally {
    metrics?.close()
    await train?.close()
    await validation?.close()
    await worker.shutdown()
  }
}

function checkVocab(provider: DataProvider, modelVocab: number): void {
  const dataVocab = provider.vocabSize()
  if (dataVocab !== undefined && dataVocab > modelVocab) {
    throw new PsycheError(`${provider.description}: the data was tokenized with a vocabulary of ${dataVocab} but the model's vocab_size is ${modelVocab}`)
  }
}
