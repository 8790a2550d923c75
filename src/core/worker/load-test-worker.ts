import {createCipheriv, createHash} from 'node:crypto'
import {systemClock, type Clock} from '../primitives/clock.js'
import {resultSize, RESULT_FORMAT_VERSION, RESULT_MAGIC, type DistroResultFormat, type ResultFormat} from '../verify/result.js'
import {sparseLoCoResultSize, type SparseLoCoResultFormat} from '../verify/sparseloco-result.js'
import type {Frame} from './client.js'
import type {ModelInfo, StepResult, TrainingSetup} from './model-worker.js'

/**
 * LOAD-TEST COMPUTE STAND-IN — not a model, never a training result.
 *
 * A ClientWorker for measuring the coordination layers (coordinator, P2P, verification, witnessing) at scale
 * without PyTorch: it "trains" by waiting `computeMs`, and returns a well-formed DisTrO result (the PSDR format of
 * python/psyche_worker/distro_codec.py, checked by verify/result.ts) of about `resultBytes` bytes, with random
 * distinct indices and sign bits drawn from (parameters, step, tokens). Its "parameters" are a 32-byte hash that
 * every apply folds the applied results into (sorted by hash, as the real worker orders them), so replicas that
 * apply the same results agree and replicas that do not differ: runs with it can assert that every result was
 * applied, and nothing about losses or convergence.
 *
 * It is excluded from scoring on purpose: it has no `scoreResults` (it has no loss to measure), so a load-test client
 * that is a verifier of a round scores nothing and reports no scores (client/verification.ts skips a worker without
 * it), and in a load-test run with verifiers nobody earns points (coordinator/rewards.ts: unscored clients earn
 * nothing there); a run without verifiers pays per accepted batch as any other.
 *
 * It cannot stand in for a real worker by accident: no command constructs it (only bench/scale.bench.ts,
 * bench/utilization.bench.ts and the scale tests do), it must be given `{purpose: 'load-test'}`, and its results
 * describe one tensor named `LOAD_TEST_TENSOR`, which no real model has, so a real client refuses them (and a
 * load-test client refuses real results) by the same format validation that refuses any malformed result.
 *
 * A run whose optimizer is SparseLoCo gets SparseLoCo results instead (the PSSL format of
 * python/psyche_worker/sparseloco_codec.py, checked by verify/sparseloco-result.ts): the same one tensor, chunks of
 * 4,096 with 64 distinct random indices each and 2-bit codes, and a layout id derived from LOAD_TEST_TENSOR and the
 * shape, which no real model's layout id equals, so the same refusal holds both ways. Applying them folds their
 * hashes as above. A SparseLoCo round trains H global batches, so a client's round has H times the batches of a
 * DisTrO step: with `computeMsPerBatch` the stand-in's compute grows with them, as a GPU's would.
 */

export const LOAD_TEST_TENSOR = 'psyche.load_test.not_a_model'
/**
 * Elements per chunk (12-bit indices) and indices per chunk, as a real DisTrO run's 64×64 chunks with top-8: honest
 * pairs share about 8/4096 of their positions, far below the copy threshold.
 */
const CHUNK = 4096
const INDEX_BITS = 12
const TOPK = 8

interface LoadTestWorkerOptions {
  /** Required, so that no caller gets this worker without naming it. */
  purpose: 'load-test'
  /** Target size of one result in bytes (the result is the nearest valid size at or above it; minimum about 40). */
  resultBytes: number
  /** How long a round's "forward/backward" takes (beginRound), in milliseconds of `clock`. */
  computeMs: number
  /** Added to computeMs for each batch (row) of the round: compute that grows with the tokens trained. Default 0. */
  computeMsPerBatch?: number
  /** Default: the system clock. The in-process simulation passes its manual clock. */
  clock?: Clock
}

/** The result format of a load-test run whose results are about `resultBytes` bytes (one sign-valued tensor). */
export function loadTestResultFormat(resultBytes: number): DistroResultFormat {
  const perChunk = (TOPK * (INDEX_BITS + 1)) / 8 // 12-bit indices and 1 sign bit per selected value
  const header = resultSize({value_format: 'sign', tensors: [{name: LOAD_TEST_TENSOR, shape: [1, CHUNK], chunk: [1, CHUNK], topk: TOPK}]}) - perChunk
  const rows = Math.max(1, Math.ceil((resultBytes - header) / perChunk))
  return {value_format: 'sign', tensors: [{name: LOAD_TEST_TENSOR, shape: [rows, CHUNK], chunk: [1, CHUNK], topk: TOPK}]}
}

/** SparseLoCo's chunk, top-k and value bits in a load-test result (τemplar's settings: 64 of 4,096, 2 bits). */
const SL_TOPK = 64
const SL_VALUE_BITS = 2

/** The SparseLoCo result format of a load-test run whose results are about `resultBytes` bytes. */
export function loadTestSparseLoCoResultFormat(resultBytes: number): SparseLoCoResultFormat {
  const at = (rows: number): SparseLoCoResultFormat => {
    const shape = [rows, CHUNK]
    const layout_id = sha256('load-test sparseloco layout', LOAD_TEST_TENSOR, JSON.stringify(shape)).subarray(0, 8).toString('hex')
    return {format: 'sparseloco', value_bits: SL_VALUE_BITS, dct: false, layout_id, tensors: [{name: LOAD_TEST_TENSOR, shape, chunk: [1, CHUNK], topk: SL_TOPK}]}
  }
  const one = sparseLoCoResultSize(at(1))
  const perChunk = sparseLoCoResultSize(at(2)) - one
  let rows = Math.max(1, Math.ceil((resultBytes - one) / perChunk) + 1)
  while (rows > 1 && sparseLoCoResultSize(at(rows - 1)) >= resultBytes) rows--
  while (sparseLoCoResultSize(at(rows)) < resultBytes) rows++
  return at(rows)
}

function sha256(...parts: (string | Uint8Array)[]): Buffer {
  const h = createHash('sha256')
  for (const p of parts) h.update(p)
  return h.digest()
}

/** A deterministic byte stream (SHA-256 in counter mode) from a seed. */
class Stream {
  private block: Buffer = Buffer.alloc(0)
  private pos = 0
  private counter = 0
  constructor(private readonly seed: Buffer) {}
  byte(): number {
    if (this.pos >= this.block.length) {
      this.block = sha256(this.seed, String(this.counter++))
      this.pos = 0
    }
    return this.block[this.pos++]
  }
}

/** Encodes a valid PSDR sign result for `format` (as loadTestResultFormat builds it) from `seed`. */
function encodeLoadTestResult(format: DistroResultFormat, seed: Buffer): Uint8Array {
  const spec = format.tensors[0]
  const rows = spec.shape[0]
  const out = Buffer.alloc(resultSize(format))
  let pos = 0
  RESULT_MAGIC.copy(out, pos)
  pos += 4
  out[pos++] = RESULT_FORMAT_VERSION
  out[pos++] = 0 // sign
  out.writeUInt32LE(1, pos)
  pos += 4
  const name = Buffer.from(spec.name, 'utf8')
  out.writeUInt16LE(name.length, pos)
  pos += 2
  name.copy(out, pos)
  pos += name.length
  out[pos++] = 2
  for (const v of [...spec.shape, ...spec.chunk, spec.topk]) {
    out.writeUInt32LE(v, pos)
    pos += 4
  }
  const n = rows * TOPK
  const idxStart = pos
  const signStart = idxStart + Math.ceil((n * INDEX_BITS) / 8)
  const rnd = new Stream(seed)
  let bit = 0
  const taken: number[] = []
  for (let r = 0; r < rows; r++) {
    taken.length = 0
    for (let k = 0; k < TOPK; k++) {
      let index: number
      do index = ((rnd.byte() << 8) | rnd.byte()) & (CHUNK - 1)
      while (taken.includes(index))
      taken.push(index)
      for (let b = 0; b < INDEX_BITS; b++, bit++) if ((index >> b) & 1) out[idxStart + (bit >>> 3)] |= 1 << (bit & 7)
    }
  }
  for (let i = 0; i < n; i += 8) out[signStart + (i >>> 3)] = rnd.byte() & (n - i >= 8 ? 0xff : (1 << (n - i)) - 1)
  return out
}

/** A fast deterministic keystream (AES-256-CTR of zeros) of `n` bytes from a 32-byte seed. */
function keystream(seed: Buffer, n: number): Buffer {
  return createCipheriv('aes-256-ctr', seed, Buffer.alloc(16)).update(Buffer.alloc(n))
}

/** Sets `bits` bits (≤ 24) of `value` at bit offset `pos` from byte `start`, LSB-first (bits.ts readBits' order). */
function writeBits(out: Uint8Array, start: number, pos: number, bits: number, value: number): void {
  for (let k = 0; k < bits; k++, pos++) if ((value >>> k) & 1) out[start + (pos >>> 3)] |= 1 << (pos & 7)
}

/**
 * Encodes a valid PSSL result for `format` (as loadTestSparseLoCoResultFormat builds it) from `seed`: levels -1.5,
 * -0.5, 0.5, 1.5, then per chunk the Elias-Fano uppers and lows of 64 distinct random indices, then random 2-bit codes.
 */
function encodeLoadTestSparseLoCoResult(format: SparseLoCoResultFormat, seed: Buffer): Uint8Array {
  const spec = format.tensors[0]
  const n = spec.shape[0]
  const k = spec.topk
  let low = 0
  while (2 ** (low + 1) <= Math.floor(CHUNK / k)) low++
  const upper = k + Math.floor((CHUNK - 1) / 2 ** low)
  const out = Buffer.alloc(sparseLoCoResultSize(format))
  Buffer.from('PSSL', 'latin1').copy(out, 0)
  out[4] = 1
  out[5] = format.value_bits
  Buffer.from(format.layout_id, 'hex').copy(out, 8)
  const levels = 2 ** format.value_bits
  for (let i = 0; i < levels; i++) out.writeFloatLE(i - (levels - 1) / 2, 16 + 4 * i)
  const uppers = 16 + 4 * levels
  const lows = uppers + Math.ceil((n * upper) / 8)
  const codes = lows + Math.ceil((n * k * low) / 8)
  // Two bytes per index draw, a few percent more for the draws a chunk refuses (already taken); wraps if ever short.
  const rnd = keystream(seed, Math.ceil(n * k * 2.1) + 64)
  const taken = new Uint8Array(CHUNK)
  const chosen: number[] = []
  let r = 0
  for (let c = 0; c < n; c++) {
    chosen.length = 0
    while (chosen.length < k) {
      const index = ((rnd[r++ % rnd.length] << 8) | rnd[r++ % rnd.length]) & (CHUNK - 1)
      if (taken[index]) continue
      taken[index] = 1
      chosen.push(index)
    }
    chosen.sort((a, b) => a - b)
    for (let j = 0; j < k; j++) {
      const index = chosen[j]
      taken[index] = 0
      const bit = c * upper + (index >>> low) + j
      out[uppers + (bit >>> 3)] |= 1 << (bit & 7)
      if (low) writeBits(out, lows, (c * k + j) * low, low, index & ((1 << low) - 1))
    }
  }
  // The codes: random bytes, the last one's padding bits cleared.
  const codeBits = n * k * format.value_bits
  keystream(sha256('codes', seed), Math.ceil(codeBits / 8)).copy(out, codes)
  if (codeBits % 8) out[codes + Math.ceil(codeBits / 8) - 1] &= (1 << (codeBits % 8)) - 1
  return out
}

/** The load-test compute stand-in (see the module comment): a ClientWorker with no model. */
// Satisfies the client's ClientWorker port structurally (worker/ sits below client/; test/scale passes it as one).
export class LoadTestWorker {
  readonly pid = undefined
  readonly exited: Promise<void>
  /** Every apply: the step and how many results it folded in. */
  readonly applies: {step: number; results: number}[] = []
  /**
   * Every round's compute: its step, batches, and start and end (ms since the epoch, Date.now()); `speculative` when
   * begun on predicted batches, `discarded` once that was undone (its compute was wasted).
   */
  readonly computed: {step: number; batches: number; start: number; end: number; speculative?: boolean; discarded?: boolean}[] = []
  /** The compute under way, if any (it enters `computed` when it ends): a measurement window may close during it. */
  running: {step: number; batches: number; start: number; speculative?: boolean} | undefined
  private params: Buffer = Buffer.alloc(32)
  private format: ResultFormat
  private readonly clock: Clock
  private begun: {step: number; seed: Buffer; tokens: number; speculative: boolean} | undefined
  private exit!: () => void
  private down = false

  constructor(private readonly o: LoadTestWorkerOptions) {
    if (o?.purpose !== 'load-test') throw new Error("LoadTestWorker is a load-test tool: construct it with {purpose: 'load-test'}")
    if (!Number.isSafeInteger(o.resultBytes) || o.resultBytes < 1) throw new RangeError(`load-test resultBytes must be a positive integer, not ${o.resultBytes}`)
    if (!(o.computeMs >= 0)) throw new RangeError(`load-test computeMs must be >= 0, not ${o.computeMs}`)
    if (!((o.computeMsPerBatch ?? 0) >= 0)) throw new RangeError(`load-test computeMsPerBatch must be >= 0, not ${o.computeMsPerBatch}`)
    this.format = loadTestResultFormat(o.resultBytes)
    this.clock = o.clock ?? systemClock
    this.exited = new Promise((resolve) => (this.exit = resolve))
  }

  /** The exact size of every result this worker produces. */
  get resultSize(): number {
    return this.format.format === 'sparseloco' ? sparseLoCoResultSize(this.format) : resultSize(this.format)
  }

  get paramHash(): string {
    return this.params.toString('hex')
  }

  private alive(): void {
    if (this.down) throw new Error('load-test worker is shut down')
  }

  private info(): ModelInfo {
    return {parameters: 0, vocab_size: 256, max_position_embeddings: 1 << 20, param_hash: this.paramHash}
  }

  async load(modelDir: string, seed = 0): Promise<ModelInfo> {
    this.alive()
    this.params = sha256('load-test init', modelDir, String(seed))
    return this.info()
  }

  async initFromConfig(config: Record<string, unknown>, seed: number): Promise<ModelInfo> {
    this.alive()
    this.params = sha256('load-test init', JSON.stringify(config), String(seed))
    return this.info()
  }

  /** DisTrO results, or SparseLoCo's when the run's optimizer is SparseLoCo. */
  async configure(setup: TrainingSetup): Promise<{resultFormat: ResultFormat}> {
    this.alive()
    this.format = 'SparseLoCo' in (setup.optimizer ?? {}) ? loadTestSparseLoCoResultFormat(this.o.resultBytes) : loadTestResultFormat(this.o.resultBytes)
    return {resultFormat: this.format}
  }

  /** As the real worker: the result is drawn from the parameters the compute began at, whether or not `speculative`. */
  async beginRound(tokens: Uint32Array, rows: number, step: number, options: {speculative?: boolean} = {}): Promise<{loss: number; grad_norm: number}> {
    this.alive()
    const seed = sha256('load-test result', this.params, String(step), new Uint8Array(tokens.buffer, tokens.byteOffset, tokens.byteLength))
    const ms = this.o.computeMs + (this.o.computeMsPerBatch ?? 0) * rows
    const start = Date.now()
    const speculative = options.speculative === true
    this.running = {step, batches: rows, start, ...(speculative ? {speculative} : {})}
    if (ms > 0) await this.clock.sleep(ms)
    this.running = undefined
    this.computed.push({step, batches: rows, start, end: Date.now(), ...(speculative ? {speculative} : {})})
    this.alive()
    this.begun = {step, seed, tokens: tokens.length - rows, speculative}
    return {loss: Number.NaN, grad_norm: Number.NaN}
  }

  /** Undoes a speculative beginRound of `step` (the real worker's discard_round): its compute is marked discarded. */
  async discardRound(step: number): Promise<void> {
    this.alive()
    if (this.begun?.step !== step || !this.begun.speculative) throw new Error(`load-test worker: discard_round for step ${step}, which is not begun speculative`)
    this.begun = undefined
    for (const c of this.computed) if (c.step === step && c.speculative) c.discarded = true
  }

  async finishRound(step: number, previous?: {applyStep: number; results: Uint8Array[]}): Promise<StepResult & {result: Uint8Array; paramHash: string; applied: number}> {
    this.alive()
    if (this.begun?.step !== step) throw new Error(`load-test worker: finish_round for step ${step} without its begin_round`)
    const {seed, tokens} = this.begun
    this.begun = undefined
    if (previous) this.apply(previous.applyStep, previous.results)
    const result = this.format.format === 'sparseloco' ? encodeLoadTestSparseLoCoResult(this.format, seed) : encodeLoadTestResult(this.format, seed)
    return {loss: Number.NaN, grad_norm: Number.NaN, lr: 0, tokens, result_bytes: result.length, result, paramHash: this.paramHash, applied: previous?.results.length ?? 0}
  }

  async applyResults(step: number, results: Uint8Array[]): Promise<string> {
    this.alive()
    this.apply(step, results)
    return this.paramHash
  }

  async evaluate(tokens: Uint32Array, rows: number): Promise<{loss: number; tokens: number}> {
    this.alive()
    return {loss: Number.NaN, tokens: tokens.length - rows}
  }

  async exportParams(): Promise<{frames: Frame[]; paramHash: string}> {
    this.alive()
    return {frames: [{name: 'load_test_params', dtype: 'uint8', shape: [32], data: new Uint8Array(this.params)}], paramHash: this.paramHash}
  }

  async importParams(frames: Frame[]): Promise<string> {
    this.alive()
    const f = frames[0]
    if (!f || f.data.byteLength !== 32) throw new Error('load-test worker: a snapshot is one 32-byte frame')
    this.params = Buffer.from(new Uint8Array(f.data.buffer, f.data.byteOffset, f.data.byteLength))
    return this.paramHash
  }

  async shutdown(): Promise<void> {
    this.down = true
    this.exit()
  }

  /** Folds the results in, in hash order (arrival order never matters), each by its SHA-256. */
  private apply(step: number, results: Uint8Array[]): void {
    const hashes = results.map((r) => sha256(r)).sort(Buffer.compare)
    this.params = sha256('load-test apply', this.params, String(step), ...hashes)
    this.applies.push({step, results: results.length})
  }
}
