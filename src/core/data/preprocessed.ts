import {readdir, stat} from 'node:fs/promises'
import {basename, dirname, extname, isAbsolute, join, resolve} from 'node:path'
import {asyncBufferFromFile, parquetMetadataAsync, parquetReadObjects, parquetSchema} from 'hyparquet'
import {checkRepoId, downloadDataset, type TransferProgress} from '../checkpoint/hub.js'
import {PREPROCESSED_COLUMNS} from '../config/support.js'
import {PsycheError, errorMessage} from '../errors.js'
import {SampleOrder, checkVocab} from './batches.js'
import {MaskedSamples, type DataProvider} from './provider.js'
import type {ShuffleSeed} from './shuffle.js'

/**
 * Psyche's `Preprocessed` data location: pre-tokenized examples in Parquet files, one example a row, as Psyche's
 * PreprocessedDataProvider reads them (PsycheFoundation/psyche@0bdb13d94a05675da93d69ffa5d4c4e5a680736c,
 * shared/data-provider/src/preprocessed.rs and dataset.rs):
 *
 * - the directory's *.parquet files of the train split: all of them when the directory's name is `train` (or
 *   `train-…`), else those whose name starts with `train`; in the order of their names;
 * - column `inputs`: a list of exactly max_seq_len token ids; column `labels` (optional): a list of as many, where
 *   -100 marks a token that does not count toward the loss (Hugging Face's ignore index) and any other value must
 *   equal the input id at that position. The model predicts ids 1..L-1 of a row from the ids before them, so a row
 *   has L - 1 targets, and its loss mask says which count.
 *
 * Every row is read and checked when the location opens (row lengths, label values, the vocabulary), so nothing is
 * trained on bad bytes; batch id b is row b (through the run's shuffle, wrapping around with `wrap`). Psyche's packed
 * sequences (position_ids, sequence_lengths columns) are refused: see config/support.ts.
 */

/** The most token ids a Preprocessed dataset may hold in memory (ids and masks: 5 bytes each). */
const PREPROCESSED_MAX_TOKENS = 2 ** 28

const IGNORE_INDEX = -100

function isTrainSplit(dir: string): boolean {
  return basename(dir).split('-')[0].toLowerCase() === 'train'
}

/** The dataset's files, as Psyche picks the train split of a directory. */
async function trainFiles(dir: string, where: string): Promise<string[]> {
  let names: string[]
  try {
    names = await readdir(dir)
  } catch (error) {
    throw new PsycheError(`${where}: cannot read the dataset directory ${dir} (${(error as NodeJS.ErrnoException).code ?? errorMessage(error)})`, {code: 'EDATA_FILE'})
  }
  const parquet = names.filter((n) => extname(n).toLowerCase() === '.parquet')
  const chosen = isTrainSplit(dir) ? parquet : parquet.filter((n) => n.startsWith('train'))
  if (chosen.length === 0) {
    throw new PsycheError(
      `${where}: ${dir} holds no train split: no *.parquet files in a directory named train, nor files named train*.parquet (found ${parquet.length} other parquet files)`,
      {code: 'EDATA_FILE'},
    )
  }
  const stem = (n: string) => n.slice(0, n.length - extname(n).length)
  return chosen.sort((a, b) => (stem(a) < stem(b) ? -1 : stem(a) > stem(b) ? 1 : 0)).map((n) => join(dir, n))
}

function listOfIds(value: unknown, file: string, row: number, column: string, length: number): ArrayLike<number | bigint> {
  if (!Array.isArray(value) && !ArrayBuffer.isView(value)) throw new PsycheError(`${file}: row ${row}: ${column} is not a list of token ids`, {code: 'EDATA_FORMAT'})
  const list = value as unknown as ArrayLike<number | bigint>
  if (list.length !== length) throw new PsycheError(`${file}: row ${row}: ${column} has ${list.length} ids instead of max_seq_len ${length}`, {code: 'EDATA_FORMAT'})
  return list
}

function asInt(value: unknown, file: string, row: number, column: string, position: number): number {
  const n = typeof value === 'bigint' ? Number(value) : value
  if (typeof n !== 'number' || !Number.isSafeInteger(n))
    throw new PsycheError(`${file}: row ${row}: ${column}[${position}] = ${String(value)} is not an integer`, {code: 'EDATA_FORMAT'})
  return n
}

/** Where a Preprocessed dataset on the Hub is fetched from (default: HF_ENDPOINT, HF_TOKEN), into which cache. */
interface HubSource {
  url?: string
  token?: string
  cacheDir?: string
  onProgress?: (p: TransferProgress) => void
}

/**
 * The directory a `Preprocessed` location names, as Psyche reads the string: a path (relative to `baseDir`) when it
 * exists here, else the id (NS/NAME) of a Hub dataset repository, whose Parquet files are downloaded into the Hub
 * cache (resumable, each checked against the Hub's hash; see checkpoint/hub.ts) and whose train split's directory
 * is returned: the one holding train*.parquet files, or a directory named train.
 */
export async function locatePreprocessed(value: string, baseDir: string, where: string, hub: HubSource = {}): Promise<string> {
  const local = isAbsolute(value) ? value : resolve(baseDir, value)
  if (await stat(local).catch(() => undefined)) return local
  let repo: string
  try {
    repo = checkRepoId(value, where)
  } catch {
    throw new PsycheError(`${where} = ${JSON.stringify(value)}: no such directory (${local}), and not a Hub dataset repository id (NAMESPACE/NAME)`, {
      code: 'EDATA_FILE',
    })
  }
  const got = await downloadDataset({
    repo,
    hubUrl: hub.url ?? process.env.HF_ENDPOINT,
    token: hub.token ?? process.env.HF_TOKEN,
    cacheDir: hub.cacheDir,
    onProgress: hub.onProgress,
  })
  const train = got.files.map((f) => f.path).find((path) => basename(path).startsWith('train') || isTrainSplit(dirname(path)))
  if (!train) {
    throw new PsycheError(`${where}: the Hub dataset ${repo}@${got.commit} holds no train split (no train*.parquet file, nor a directory named train holding Parquet files)`, {
      code: 'EDATA_FILE',
    })
  }
  return join(got.dir, dirname(train))
}

/**
 * Checks, from the files' footers only, that the dataset in `dir` carries loss masks (a labels column in every train
 * file), as data_type Finetuning needs: `psyche train` and `psyche join` refuse a run without them before they start.
 */
export async function checkLossMasks(dir: string, where: string): Promise<void> {
  for (const file of await trainFiles(dir, where)) {
    let columns: string[]
    try {
      columns = parquetSchema(await parquetMetadataAsync(await asyncBufferFromFile(file))).children.map((c) => c.element.name)
    } catch (error) {
      throw new PsycheError(`${file}: not a readable Parquet file (${errorMessage(error)})`, {code: 'EDATA_FORMAT'})
    }
    if (!columns.includes('labels')) {
      throw new PsycheError(`${where}: data_type Finetuning needs loss masks, but ${file} has no labels column (every token would count: that is pretraining)`, {
        code: 'EDATA_FORMAT',
      })
    }
  }
}

export class PreprocessedProvider implements DataProvider {
  private readonly order: SampleOrder

  private constructor(
    readonly description: string,
    /** Every row's ids, row-major [rows, seqLen]. */
    private readonly ids: Uint32Array,
    /** Every row's loss mask [rows, seqLen - 1], or undefined when the dataset has no labels (every target counts). */
    private readonly mask: Uint8Array | undefined,
    readonly seqLen: number,
    readonly rows: number,
    private readonly vocab: number | undefined,
    options: {shuffleSeed?: ShuffleSeed; wrap?: boolean},
  ) {
    this.order = new SampleOrder(rows, options)
  }

  /** Whether the rows carry loss masks (a labels column). */
  get hasLossMasks(): boolean {
    return this.mask !== undefined
  }

  /**
   * Reads and checks every row of the dataset in `dir`. `seqLen` is the run's max_seq_len (each row's length);
   * `requireLossMasks` (Finetuning) refuses a dataset without labels. `where` names the config field in errors.
   */
  static async open(
    dir: string,
    where: string,
    options: {seqLen: number; vocabSize?: number; shuffleSeed?: ShuffleSeed; wrap?: boolean; requireLossMasks?: boolean},
  ): Promise<PreprocessedProvider> {
    const found = await stat(dir).catch(() => undefined)
    if (!found?.isDirectory()) {
      throw new PsycheError(
        `${where}: ${dir} is not a directory (a Preprocessed location is a directory of Parquet files, relative to the run config, or a Hub dataset repository)`,
        {code: 'EDATA_FILE'},
      )
    }
    const L = options.seqLen
    if (L < 2) throw new PsycheError(`${where}: max_seq_len ${L}: an example needs at least 2 tokens`)
    const files = await trainFiles(dir, where)
    // every Parquet codec (Snappy, gzip, Brotli, zstd, LZ4); loaded here, not when the CLI starts
    const {compressors} = await import('hyparquet-compressors')
    const parts: {ids: Uint32Array; mask?: Uint8Array; rows: number}[] = []
    let total = 0
    let labelled: boolean | undefined
    for (const file of files) {
      let buffer
      let metadata
      try {
        buffer = await asyncBufferFromFile(file)
        metadata = await parquetMetadataAsync(buffer)
      } catch (error) {
        throw new PsycheError(`${file}: not a readable Parquet file (${errorMessage(error)})`, {code: 'EDATA_FORMAT'})
      }
      const columns = parquetSchema(metadata).children.map((c) => c.element.name)
      for (const column of Object.keys(PREPROCESSED_COLUMNS) as (keyof typeof PREPROCESSED_COLUMNS)[]) {
        const support = PREPROCESSED_COLUMNS[column]
        if (columns.includes(column) && !support.supported) throw new PsycheError(`${file}: column ${column}: ${support.reason}`, {code: 'EDATA_FORMAT'})
      }
      if (!columns.includes('inputs')) throw new PsycheError(`${file}: no inputs column (columns: ${columns.join(', ')})`, {code: 'EDATA_FORMAT'})
      const hasLabels = columns.includes('labels')
      if (labelled !== undefined && hasLabels !== labelled)
        throw new PsycheError(`${file}: ${hasLabels ? 'has' : 'lacks'} a labels column, unlike ${files[0]}`, {code: 'EDATA_FORMAT'})
      labelled = hasLabels
      const rows = Number(metadata.num_rows)
      total += rows * L
      if (total > PREPROCESSED_MAX_TOKENS)
        throw new PsycheError(`${where}: ${dir} holds more than ${PREPROCESSED_MAX_TOKENS} tokens, more than a client keeps in memory`, {code: 'EDATA_TOO_LARGE'})
      let records: Record<string, unknown>[]
      try {
        records = await parquetReadObjects({file: buffer, metadata, columns: hasLabels ? ['inputs', 'labels'] : ['inputs'], utf8: false, compressors})
      } catch (error) {
        throw new PsycheError(`${file}: cannot be read (${errorMessage(error)}): truncated or corrupt`, {code: 'EDATA_FORMAT'})
      }
      if (records.length !== rows) throw new PsycheError(`${file}: the footer says ${rows} rows, ${records.length} were read (truncated?)`, {code: 'EDATA_FORMAT'})
      const ids = new Uint32Array(rows * L)
      const mask = hasLabels ? new Uint8Array(rows * (L - 1)) : undefined
      records.forEach((record, r) => {
        const inputs = listOfIds(record.inputs, file, r, 'inputs', L)
        for (let i = 0; i < L; i++) {
          const id = asInt(inputs[i], file, r, 'inputs', i)
          if (id < 0 || id > 0xffffffff) throw new PsycheError(`${file}: row ${r}: inputs[${i}] = ${id} is not a token id`, {code: 'EDATA_FORMAT'})
          ids[r * L + i] = id
        }
        if (!mask) return
        const labels = listOfIds(record.labels, file, r, 'labels', L)
        for (let i = 1; i < L; i++) {
          const label = asInt(labels[i], file, r, 'labels', i)
          if (label === IGNORE_INDEX) continue
          if (label !== ids[r * L + i]) {
            throw new PsycheError(`${file}: row ${r}: labels[${i}] = ${label} differs from inputs[${i}] = ${ids[r * L + i]}: a label is the input id or -100`, {
              code: 'EDATA_FORMAT',
            })
          }
          mask[r * (L - 1) + i - 1] = 1
        }
      })
      if (options.vocabSize !== undefined) checkVocab(ids, 0, ids.length, options.vocabSize, 0, file)
      parts.push({ids, mask, rows})
    }
    if (options.requireLossMasks && !labelled) {
      throw new PsycheError(`${where}: data_type Finetuning needs loss masks, but ${dir} has no labels column (every token would count: that is pretraining)`, {
        code: 'EDATA_FORMAT',
      })
    }
    const rows = parts.reduce((a, p) => a + p.rows, 0)
    const ids = new Uint32Array(rows * L)
    const mask = labelled ? new Uint8Array(rows * (L - 1)) : undefined
    let at = 0
    for (const p of parts) {
      ids.set(p.ids, at * L)
      if (mask) mask.set(p.mask!, at * (L - 1))
      at += p.rows
    }
    const description = `${dir} (${rows} examples of ${L} tokens${labelled ? ', with loss masks' : ''})`
    return new PreprocessedProvider(description, ids, mask, L, rows, options.vocabSize, {shuffleSeed: options.shuffleSeed, wrap: options.wrap})
  }

  numSamples(): number {
    return this.rows
  }

  vocabSize(): number | undefined {
    return undefined
  }

  async getSamples(batchIds: readonly number[]): Promise<Uint32Array> {
    const L = this.seqLen
    const rows = batchIds.map((id) => this.order.index(id, this.description, this.order.wrap, 'the dataset has no examples'))
    const mask = this.mask ? new Uint8Array(rows.length * (L - 1)) : undefined
    const out = mask ? new MaskedSamples(rows.length * L, mask) : new Uint32Array(rows.length * L)
    rows.forEach((row, j) => {
      out.set(this.ids.subarray(row * L, (row + 1) * L), j * L)
      if (mask) mask.set(this.mask!.subarray(row * (L - 1), (row + 1) * (L - 1)), j * (L - 1))
      checkVocab(out, j * L, L, this.vocab, batchIds[j], this.description)
    })
    return out
  }

  async close(): Promise<void> {}
}
