import type {LLMArchitecture} from '../config/types.js'
import {parseResultFormat, type ResultFormat} from '../verify/result.js'
import {type Frame, WorkerClient, type WorkerCrashedError, type WorkerOptions} from './client.js'

export interface ModelInfo {
  parameters: number
  vocab_size: number
  max_position_embeddings: number
  param_hash: string
}

export interface StepResult {
  loss: number
  grad_norm: number
  lr: number
  tokens: number
  /** DisTrO: mean size of one peer's compressed result for this step. */
  result_bytes?: number
}

export interface TrainingSetup {
  /** Psyche's externally tagged optimizer config, e.g. {AdamW: {betas: [0.9, 0.95], ...}} */
  optimizer: Record<string, unknown>
  /** Psyche's externally tagged schedule, e.g. {Cosine: {base_lr, warmup_steps, ...}} */
  lr_schedule?: Record<string, unknown>
  micro_batch: number
  /** DisTrO only: split each step's batch among N simulated clients, each with its own momentum. */
  simulate_peers?: number
  /**
   * DisTrO network path: results of step t are applied during step t+1 (train_round / apply_results). SparseLoCo's
   * simulation (simulate_peers): each client's next inner steps start before the round's results are applied.
   */
  delay_correction?: boolean
}

/**
 * The loss mask of samples that carry one (data/provider.ts MaskedSamples), known by its shape: the worker imports
 * nothing of data/, which runs the worker's Python to tokenize (no folder cycle between them).
 */
function lossMaskOf(tokens: Uint32Array): Uint8Array | undefined {
  const mask = (tokens as {lossMask?: unknown}).lossMask
  return mask instanceof Uint8Array ? mask : undefined
}

/** A batch's frames: its token ids, then its loss mask when it has one (python/psyche_worker/loss_mask.py). */
function tokenFrames(tokens: Uint32Array, rows: number): Frame[] {
  const length = tokens.length / rows
  const frames: Frame[] = [{name: 'tokens', dtype: 'uint32', shape: [rows, length], data: tokens}]
  const mask = lossMaskOf(tokens)
  if (mask) frames.push({name: 'loss_mask', dtype: 'uint8', shape: [rows, length - 1], data: mask})
  return frames
}

/** The header field that says each tokens frame is followed by its mask; all of a request's batches must agree. */
function maskHeader(...batches: Uint32Array[]): {loss_mask?: true} {
  const masked = batches.filter((b) => lossMaskOf(b) !== undefined).length
  if (masked > 0 && masked < batches.length) throw new RangeError(`${masked} of ${batches.length} batches have loss masks: all or none must`)
  return masked > 0 ? {loss_mask: true} : {}
}

/** Typed operations of the PyTorch worker (python/psyche_worker/server.py). */
export class ModelWorker {
  private constructor(readonly client: WorkerClient) {}

  static async start(options: WorkerOptions = {}): Promise<ModelWorker> {
    return new ModelWorker(await WorkerClient.start(options))
  }

  get pid(): number {
    return this.client.pid
  }

  /** Settles when the worker process has exited, with why. */
  get exited(): Promise<WorkerCrashedError> {
    return this.client.exited
  }

  /** A random initialisation of the config (AutoModelForCausalLM.from_config); `architecture`: what it must be (none: any causal LM). */
  async initFromConfig(config: Record<string, unknown>, seed: number, architecture?: LLMArchitecture): Promise<ModelInfo> {
    return (await this.client.call<ModelInfo & Record<string, unknown>>('init_model', {config, seed, ...(architecture ? {architecture} : {})})).reply
  }

  /** A model directory in Hugging Face layout (AutoModelForCausalLM.from_pretrained); `architecture` as for initFromConfig. */
  async load(modelDir: string, seed = 0, architecture?: LLMArchitecture): Promise<ModelInfo> {
    return (await this.client.call<ModelInfo & Record<string, unknown>>('init_model', {model_dir: modelDir, seed, ...(architecture ? {architecture} : {})})).reply
  }

  /** Configures training; with DisTrO, returns the format peers' results must have (for validateResult). */
  async configure(setup: TrainingSetup): Promise<{resultFormat?: ResultFormat}> {
    const {reply} = await this.client.call<{result_format?: unknown}>('configure', {...setup})
    return reply.result_format === undefined ? {} : {resultFormat: parseResultFormat(reply.result_format)}
  }

  async trainStep(tokens: Uint32Array, rows: number, step: number): Promise<StepResult> {
    return (await this.client.call<StepResult & Record<string, unknown>>('train_step', {step, ...maskHeader(tokens)}, tokenFrames(tokens, rows))).reply
  }

  /**
   * The network path's round (DisTrO, one peer, delay_correction): forward/backward on `tokens`, then apply
   * `previous` (the results accepted for step `applyStep`), then produce this step's result. `paramHash` is
   * the committed parameters after the apply (speculation excluded), so replicas can be compared.
   */
  async trainRound(
    tokens: Uint32Array,
    rows: number,
    step: number,
    previous?: {applyStep: number; results: Uint8Array[]},
  ): Promise<StepResult & {result: Uint8Array; paramHash: string; applied: number}> {
    const resultFrames: Frame[] = (previous?.results ?? []).map((r, i) => ({name: `result${i}`, dtype: 'uint8', shape: [r.length], data: r}))
    const header = {...(previous ? {step, apply_step: previous.applyStep} : {step}), ...maskHeader(tokens)}
    const {reply, frames} = await this.client.call<StepResult & {param_hash: string; applied: number} & Record<string, unknown>>('train_round', header, [
      ...tokenFrames(tokens, rows),
      ...resultFrames,
    ])
    return {...reply, result: new Uint8Array(frames[0]), paramHash: reply.param_hash, applied: reply.applied}
  }

  /**
   * trainRound in two requests, so the client can download `previous` meanwhile: beginRound runs the
   * forward/backward of `step`, finishRound applies `previous` and produces the result (same outcome, bit for bit).
   */
  async beginRound(tokens: Uint32Array, rows: number, step: number, options: {speculative?: boolean} = {}): Promise<{loss: number; grad_norm: number}> {
    const header = {step, ...(options.speculative ? {speculative: true} : {}), ...maskHeader(tokens)}
    return (await this.client.call<{loss: number; grad_norm: number} & Record<string, unknown>>('begin_round', header, tokenFrames(tokens, rows))).reply
  }

  /** Undoes a speculative beginRound of `step` (its round gave this client other batches): the optimizer's state is restored. */
  async discardRound(step: number): Promise<void> {
    await this.client.call('discard_round', {step}, [])
  }

  async finishRound(step: number, previous?: {applyStep: number; results: Uint8Array[]}): Promise<StepResult & {result: Uint8Array; paramHash: string; applied: number}> {
    const resultFrames: Frame[] = (previous?.results ?? []).map((r, i) => ({name: `result${i}`, dtype: 'uint8', shape: [r.length], data: r}))
    const header = previous ? {step, apply_step: previous.applyStep} : {step}
    const {reply, frames} = await this.client.call<StepResult & {param_hash: string; applied: number} & Record<string, unknown>>('finish_round', header, resultFrames)
    return {...reply, result: new Uint8Array(frames[0]), paramHash: reply.param_hash, applied: reply.applied}
  }

  /** Applies the results accepted for `step` (network path). Returns the committed parameters' hash. */
  async applyResults(step: number, results: Uint8Array[]): Promise<string> {
    const frames: Frame[] = results.map((r, i) => ({name: `result${i}`, dtype: 'uint8', shape: [r.length], data: r}))
    return (await this.client.call<{param_hash: string}>('apply_results', {step}, frames)).reply.param_hash
  }

  /**
   * Verification: `batches` holds each result's producer's assigned batch, then one shared comparison batch. Returns the
   * loss on each batch at the committed parameters (`before`), and after applying each result alone at `step`'s learning
   * rate, on its own batch and on the shared one (`after[j] = [own, shared]`; null for a result that does not decode):
   * 2 evaluations per result. Changes nothing.
   */
  async scoreResults(step: number, results: Uint8Array[], batches: {tokens: Uint32Array; rows: number}[]): Promise<{before: number[]; after: ([number, number] | null)[]}> {
    if (batches.length !== results.length + 1) throw new RangeError(`scoreResults: ${results.length} results need ${results.length + 1} batches, not ${batches.length}`)
    const frames: Frame[] = [
      ...results.map((r, i) => ({name: `result${i}`, dtype: 'uint8' as const, shape: [r.length], data: r})),
      ...batches.flatMap((b) => tokenFrames(b.tokens, b.rows)),
    ]
    const header = {step, results: results.length, own_batches: true, ...maskHeader(...batches.map((b) => b.tokens))}
    return (await this.client.call<{before: number[]; after: ([number, number] | null)[]}>('score_results', header, frames)).reply
  }

  async evaluate(tokens: Uint32Array, rows: number): Promise<{loss: number; tokens: number}> {
    return (await this.client.call<{loss: number; tokens: number}>('evaluate', {...maskHeader(tokens)}, tokenFrames(tokens, rows))).reply
  }

  async paramHash(): Promise<string> {
    return (await this.client.call<{param_hash: string}>('param_hash')).reply.param_hash
  }

  async exportParams(): Promise<{frames: Frame[]; paramHash: string}> {
    const {reply, frames} = await this.client.call<{frames: Omit<Frame, 'data'>[]; param_hash: string}>('export_params')
    return {frames: reply.frames.map((spec, i) => ({...spec, data: frames[i]})), paramHash: reply.param_hash}
  }

  async importParams(frames: Frame[]): Promise<string> {
    return (await this.client.call<{param_hash: string}>('import_params', {}, frames)).reply.param_hash
  }

  /**
   * Writes the model directory (config, weights, tokenizer, model card) atomically. The tokenizer is `tokenizer`
   * (a tokenizer.json or a model directory), else the loaded model's own, else a byte-level one; `card` adds rows
   * (step, run id, ...) to the model card. Weights go in safetensors files of at most `maxShardBytes` (default 5 GB),
   * with model.safetensors.index.json when there are several (Hugging Face's layout).
   */
  async save(dir: string, options: {tokenizer?: string; card?: Record<string, string | number>; maxShardBytes?: number} = {}): Promise<void> {
    await this.client.call('save_model', {
      dir,
      ...(options.tokenizer ? {tokenizer: options.tokenizer} : {}),
      ...(options.card ? {card: options.card} : {}),
      ...(options.maxShardBytes ? {max_shard_size: options.maxShardBytes} : {}),
    })
  }

  async shutdown(): Promise<void> {
    await this.client.shutdown()
  }
}
