import {PsycheError} from '../errors.js'
import {SeededPermutation, type ShuffleSeed} from './shuffle.js'

/**
 * THE mapping from a batch id to tokens, used by every data provider (local, HTTP, the TCP data server),
 * the client and verifiers. It follows Psyche's data provider exactly for unshuffled data:
 *
 * - each token file is cut on its own (windows never span two files) into windows starting at token
 *   0, seqLen, 2·seqLen, ... while `start < numTokens - (seqLen + 1)` (Psyche's bound, which leaves the
 *   last exactly-fitting window out); a sample is the `seqLen + 1` ids from a window start: inputs and
 *   next-token targets in one;
 * - windows are numbered file by file, in file order; with a shuffle seed, batch id b is window
 *   `permutation(b)` (a seeded per-index permutation, see shuffle.ts), otherwise window b;
 * - a batch id at or past the number of windows is an error, or with `wrap` taken modulo that number.
 */
export interface SampleWindow {
  /** Index of the file in the provider's file list. */
  file: number
  /** Token index inside that file where the sample starts. */
  start: number
  /** Number of ids in the sample: seqLen + 1. */
  length: number
}

/** Number of samples Psyche cuts from a file of `numTokens` ids. */
export function windowsInFile(numTokens: number, seqLen: number): number {
  const span = numTokens - (seqLen + 1)
  return span > 0 ? Math.ceil(span / seqLen) : 0
}

export interface LayoutOptions {
  shuffleSeed?: ShuffleSeed
  /** Past the last window, start again from window 0 instead of failing. */
  wrap?: boolean
}

/**
 * The order in which batch ids take a dataset's samples: id b is sample b (past the end: an error, or with `wrap`
 * b mod the number of samples), through the seeded permutation when there is a shuffle seed. Token files (SampleLayout)
 * and mixtures (weighted.ts) both number their samples through it.
 */
export class SampleOrder {
  private readonly permutation: SeededPermutation | undefined
  readonly wrap: boolean

  constructor(
    readonly numSamples: number,
    options: LayoutOptions = {},
  ) {
    this.wrap = options.wrap ?? false
    this.permutation = options.shuffleSeed && numSamples > 0 ? new SeededPermutation(numSamples, options.shuffleSeed) : undefined
  }

  /** The sample index of a batch id; throws naming `where` and the batch when there is none. `empty` says why there are no samples. */
  index(batchId: number, where: string, wrap: boolean, empty: string): number {
    if (!Number.isSafeInteger(batchId) || batchId < 0) throw new PsycheError(`${where}: batch ${batchId}: a batch id is a non-negative integer`, {code: 'EDATA_BATCH'})
    if (this.numSamples === 0) throw new PsycheError(`${where}: batch ${batchId}: ${empty}`, {code: 'EDATA_BATCH'})
    let index = batchId
    if (index >= this.numSamples) {
      if (!wrap) throw new PsycheError(`${where}: batch ${batchId} is past the end of the data (${this.numSamples} samples; wrap-around is off)`, {code: 'EDATA_BATCH'})
      index %= this.numSamples
    }
    return this.permutation ? this.permutation.apply(index) : index
  }
}

export class SampleLayout {
  readonly numSamples: number
  /** First window index of each file; ascending. */
  private readonly firstWindow: number[]
  private readonly order: SampleOrder
  readonly wrap: boolean

  constructor(
    readonly fileTokenCounts: readonly number[],
    readonly seqLen: number,
    options: LayoutOptions = {},
  ) {
    if (!Number.isSafeInteger(seqLen) || seqLen <= 0) throw new PsycheError(`sequence length ${seqLen} must be a positive integer`)
    let total = 0
    this.firstWindow = fileTokenCounts.map((count) => {
      const first = total
      total += windowsInFile(count, seqLen)
      return first
    })
    this.numSamples = total
    this.wrap = options.wrap ?? false
    this.order = new SampleOrder(total, options)
  }

  /** Window index of a batch id, applying wrap-around and the shuffle; throws naming the batch when it is past the end. */
  windowIndex(batchId: number, where: string, wrap = this.wrap): number {
    return this.order.index(batchId, where, wrap, `no file holds a whole sample of ${this.seqLen + 1} tokens`)
  }

  /** Where the sample for `batchId` lives. `where` names the data (dir, URL, server) in errors. */
  locate(batchId: number, where: string, wrap = this.wrap): SampleWindow {
    const window = this.windowIndex(batchId, where, wrap)
    // The last file whose first window is <= window (a file with no windows shares its start with the next).
    let lo = 0
    let hi = this.firstWindow.length - 1
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1
      if (this.firstWindow[mid] <= window) lo = mid
      else hi = mid - 1
    }
    return {file: lo, start: (window - this.firstWindow[lo]) * this.seqLen, length: this.seqLen + 1}
  }
}

/** Rejects ids at or beyond the model's vocabulary, naming the batch and where it came from. */
export function checkVocab(ids: Uint32Array, offset: number, length: number, vocabSize: number | undefined, batchId: number, where: string): void {
  if (vocabSize === undefined) return
  for (let i = offset; i < offset + length; i++) {
    if (ids[i] >= vocabSize) {
      throw new PsycheError(`${where}: batch ${batchId}: token id ${ids[i]} at position ${i - offset} is beyond the model's vocabulary (${vocabSize})`, {code: 'EDATA_VOCAB'})
    }
  }
}
