import {readdir, readFile, stat} from 'node:fs/promises'
import {join} from 'node:path'
import {PsycheError} from '../errors.js'
import {SampleLayout} from './batches.js'
import {TokenFilesProvider, type TokenFilesOptions} from './provider.js'
import {TOKEN_FILE_PATTERN, TokenFile, type TokenSize, parseTokenSize} from './token-file.js'

/** What `manifest.json` in a token directory says about the tokens (written by `psyche data tokenize` and the demo corpus). */
export interface TokenManifest {
  format: 'psyche-tokens/1'
  token_size: TokenSize
  vocab_size: number
  tokens: number
  files: string[]
  tokenizer?: string
  tokenizer_sha256?: string
  source?: string
}

const MANIFEST_FILE = 'manifest.json'

async function isDirectory(path: string): Promise<boolean> {
  return (await stat(path).catch(() => undefined))?.isDirectory() ?? false
}

async function readManifest(path: string): Promise<TokenManifest> {
  let manifest: TokenManifest
  try {
    manifest = JSON.parse(await readFile(path, 'utf8')) as TokenManifest
  } catch (error) {
    throw new PsycheError(`${path}: not valid JSON (${(error as Error).message})`)
  }
  if (manifest?.format !== 'psyche-tokens/1') throw new PsycheError(`${path}: format ${JSON.stringify(manifest?.format)}: expected "psyche-tokens/1"`)
  parseTokenSize(manifest.token_size, `${path}: token_size`)
  if (!Number.isSafeInteger(manifest.vocab_size) || manifest.vocab_size <= 0) throw new PsycheError(`${path}: vocab_size must be a positive integer`)
  if (!Number.isSafeInteger(manifest.tokens) || manifest.tokens < 0) throw new PsycheError(`${path}: tokens must be a non-negative integer`)
  if (
    !Array.isArray(manifest.files) ||
    manifest.files.length === 0 ||
    !manifest.files.every((f) => typeof f === 'string' && TOKEN_FILE_PATTERN.test(f) && !f.includes('/') && !f.includes('\\'))
  ) {
    throw new PsycheError(`${path}: files must be a non-empty list of token file names (*.bin, *.ds, *.npy) in the same directory`)
  }
  return manifest
}

/**
 * A directory of token files (*.bin, *.ds, *.npy; in manifest order, else in name order), with an
 * optional manifest.json whose token size, token count and vocabulary are checked against the files.
 * A directory with no token files but a `train/` subdirectory (the demo corpus layout) means `train/`.
 */
export class LocalTokenDataset {
  private constructor(
    readonly dir: string,
    readonly files: TokenFile[],
    readonly manifest: TokenManifest | undefined,
    readonly numTokens: number,
  ) {}

  get tokenSize(): TokenSize {
    return this.files[0].tokenSize
  }

  get vocabSize(): number | undefined {
    return this.manifest?.vocab_size
  }

  static async open(dir: string, options: {tokenSize?: TokenSize; tokenizerSha256?: string} = {}): Promise<LocalTokenDataset> {
    let names: string[]
    try {
      names = (await readdir(dir)).sort()
    } catch (error) {
      throw new PsycheError(`${dir}: cannot read data directory (${(error as NodeJS.ErrnoException).code ?? error})`)
    }
    if (!names.includes(MANIFEST_FILE) && !names.some((n) => TOKEN_FILE_PATTERN.test(n)) && names.includes('train') && (await isDirectory(join(dir, 'train')))) {
      return LocalTokenDataset.open(join(dir, 'train'), options)
    }
    let manifest: TokenManifest | undefined
    const manifestPath = join(dir, MANIFEST_FILE)
    if (names.includes(MANIFEST_FILE)) {
      manifest = await readManifest(manifestPath)
      if (options.tokenSize !== undefined && options.tokenSize !== manifest.token_size) {
        throw new PsycheError(`${manifestPath}: token_size ${manifest.token_size} but ${options.tokenSize} was configured`)
      }
      if (options.tokenizerSha256 !== undefined && manifest.tokenizer_sha256 !== options.tokenizerSha256) {
        throw new PsycheError(
          `${manifestPath}: tokenized with tokenizer sha256 ${manifest.tokenizer_sha256 ?? '(not recorded)'}, but the model's tokenizer is ${options.tokenizerSha256}`,
        )
      }
    }
    const tokenSize = manifest?.token_size ?? options.tokenSize ?? 2
    const fileNames = manifest?.files ?? names.filter((n) => TOKEN_FILE_PATTERN.test(n))
    if (fileNames.length === 0) throw new PsycheError(`${dir}: no token files (*.bin, *.ds, *.npy) in the data directory`)
    const files: TokenFile[] = []
    try {
      for (const name of fileNames) files.push(await TokenFile.open(join(dir, name), tokenSize))
    } catch (error) {
      await Promise.all(files.map((f) => f.close()))
      throw error
    }
    const total = files.reduce((sum, f) => sum + f.numTokens, 0)
    if (manifest && manifest.tokens !== total) {
      await Promise.all(files.map((f) => f.close()))
      throw new PsycheError(`${manifestPath}: says ${manifest.tokens} tokens but the files hold ${total} (truncated or replaced files?)`)
    }
    return new LocalTokenDataset(dir, files, manifest, total)
  }

  /** A provider over these files; closing either the provider or the dataset closes the files. */
  provider(options: Omit<TokenFilesOptions, 'dataVocabSize'>): TokenFilesProvider {
    if (options.vocabSize !== undefined && this.manifest && this.manifest.vocab_size > options.vocabSize) {
      throw new PsycheError(`${join(this.dir, MANIFEST_FILE)}: data tokenized with a vocabulary of ${this.manifest.vocab_size} ids, larger than the model's ${options.vocabSize}`)
    }
    return new TokenFilesProvider(this.dir, this.files, {...options, dataVocabSize: this.manifest?.vocab_size})
  }

  /** Number of samples of seqLen + 1 ids (the batch ids before wrap-around). */
  numSamples(seqLen: number): number {
    return new SampleLayout(
      this.files.map((f) => f.numTokens),
      seqLen,
    ).numSamples
  }

  /** Samples for `batchIds` (unshuffled, wrapping around), concatenated row-major: shape [batchIds.length, seqLen + 1]. */
  async getSamples(batchIds: readonly number[], seqLen: number): Promise<Uint32Array> {
    const provider = new TokenFilesProvider(this.dir, this.files, {seqLen, wrap: true})
    return provider.getSamples(batchIds)
  }

  async close(): Promise<void> {
    await Promise.all(this.files.map((f) => f.close()))
  }
}
