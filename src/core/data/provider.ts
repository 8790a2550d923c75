import {SampleLayout, checkVocab, type LayoutOptions, type SampleWindow} from './batches.js'
import type {TokenFile} from './token-file.js'

/**
 * Samples whose loss counts only some targets (fine-tuning examples: a chat's assistant replies). Row r of a batch of
 * rows of L ids has L - 1 targets (ids 1..L-1); `lossMask[r * (L - 1) + i]` is 1 when target i counts. It is a
 * Uint32Array of the token ids, so it goes wherever samples go; the worker client sends the mask with the ids
 * (python/psyche_worker/loss_mask.py). Arrays derived from it (slice, subarray) are plain ids without a mask.
 */
export class MaskedSamples extends Uint32Array {
  static get [Symbol.species](): Uint32ArrayConstructor {
    return Uint32Array
  }

  constructor(
    length: number,
    readonly lossMask: Uint8Array,
  ) {
    super(length)
  }
}

/** What a client asks of any data source: the samples for some batch ids, identical whichever provider serves them. */
export interface DataProvider {
  /** Where the data comes from, for logs and errors (a directory, a URL, host:port). */
  readonly description: string
  /** Number of distinct samples (batch ids before wrap-around), when known. */
  numSamples(): number | undefined
  /** Vocabulary size the data was tokenized with (from its manifest), when known. */
  vocabSize(): number | undefined
  /**
   * Samples for `batchIds`, row-major: shape [batchIds.length, seqLen + 1] for token streams, [batchIds.length,
   * max_seq_len] for Preprocessed examples (Psyche's rows), with their loss masks (MaskedSamples) when the data has them.
   */
  getSamples(batchIds: readonly number[]): Promise<Uint32Array>
  close(): Promise<void>
}

export interface TokenFilesOptions extends LayoutOptions {
  seqLen: number
  /** The model's vocabulary size: any id at or above it fails the batch. */
  vocabSize?: number
  /** Vocabulary size from the data's manifest, reported by vocabSize(). */
  dataVocabSize?: number
  /** Reads in flight at once (positional reads or HTTP range requests). */
  concurrency?: number
}

/** Runs `task(i)` for i in [0, count) with at most `limit` running at once; rejects with the first failure. */
export async function forEachLimited(count: number, limit: number, task: (index: number) => Promise<void>): Promise<void> {
  let next = 0
  const worker = async () => {
    while (next < count) await task(next++)
  }
  await Promise.all(Array.from({length: Math.min(limit, count)}, worker))
}

/** Groups rows whose windows follow each other in one file (as unshuffled consecutive batch ids do), in request order. */
function contiguousRuns(windows: readonly SampleWindow[], seqLen: number): number[][] {
  const runs: number[][] = []
  for (let row = 0; row < windows.length; row++) {
    const run = runs.at(-1)
    const last = run && windows[run.at(-1)!]
    if (run && last && windows[row].file === last.file && windows[row].start === last.start + seqLen && run.length < 64) run.push(row)
    else runs.push([row])
  }
  return runs
}

/**
 * A provider over a list of token files, local or remote: the layout picks (file, start) per batch id,
 * the files supply the bytes. The local and HTTP providers and the TCP data server are all this class.
 */
export class TokenFilesProvider implements DataProvider {
  readonly layout: SampleLayout

  constructor(
    readonly description: string,
    readonly files: readonly TokenFile[],
    private readonly options: TokenFilesOptions,
  ) {
    this.layout = new SampleLayout(
      files.map((f) => f.numTokens),
      options.seqLen,
      options,
    )
  }

  get seqLen(): number {
    return this.options.seqLen
  }

  numSamples(): number {
    return this.layout.numSamples
  }

  vocabSize(): number | undefined {
    return this.options.dataVocabSize
  }

  async getSamples(batchIds: readonly number[], options: {wrap?: boolean} = {}): Promise<Uint32Array> {
    const rowLength = this.options.seqLen + 1
    const out = new Uint32Array(batchIds.length * rowLength)
    // Resolve every id first: a bad batch fails the whole request before any read.
    const windows = batchIds.map((id) => this.layout.locate(id, this.description, options.wrap))
    const runs = contiguousRuns(windows, this.options.seqLen)
    await forEachLimited(runs.length, this.options.concurrency ?? 16, async (index) => {
      const rows = runs[index]
      const {file, start} = windows[rows[0]]
      const source = this.files[file]
      if (rows.length === 1) {
        await source.readInto(start, rowLength, out, rows[0] * rowLength)
      } else {
        // Consecutive windows overlap by one id: one read of n·seqLen + 1 ids serves them all.
        const span = new Uint32Array(rows.length * this.options.seqLen + 1)
        await source.readInto(start, span.length, span)
        rows.forEach((row, k) => out.set(span.subarray(k * this.options.seqLen, k * this.options.seqLen + rowLength), row * rowLength))
      }
      for (const row of rows) checkVocab(out, row * rowLength, rowLength, this.options.vocabSize, batchIds[row], source.path)
    })
    return out
  }

  async close(): Promise<void> {
    await Promise.all(this.files.map((f) => f.close()))
  }
}
