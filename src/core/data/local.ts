import {readdir, readFile} from 'node:fs/promises'
import {join} from 'node:path'
import {PsycheError} from '../errors.js'
import {numWindows, windowForBatch} from './batches.js'
import {TokenFile, type TokenSize, parseTokenSize} from './token-file.js'

/** What `manifest.json` in a token directory says about the tokens (written by corpus/tokenize tools). */
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

const TOKEN_FILE = /\.(bin|ds)$/

/**
 * A directory of token files read as one stream of ids (files in name order), served as fixed windows.
 * The token size comes from manifest.json when present, otherwise from the caller.
 */
export class LocalTokenDataset {
  private constructor(
    readonly dir: string,
    readonly files: TokenFile[],
    readonly manifest: TokenManifest | undefined,
    private readonly offsets: number[],
    readonly numTokens: number,
  ) {}

  get tokenSize(): TokenSize {
    return this.files[0].tokenSize
  }

  get vocabSize(): number | undefined {
    return this.manifest?.vocab_size
  }

  static async open(dir: string, options: {tokenSize?: TokenSize} = {}): Promise<LocalTokenDataset> {
    let names: string[]
    try {
      names = (await readdir(dir)).sort()
    } catch (error) {
      throw new PsycheError(`${dir}: cannot read data directory (${(error as NodeJS.ErrnoException).code ?? error})`)
    }
    let manifest: TokenManifest | undefined
    if (names.includes('manifest.json')) {
      const path = join(dir, 'manifest.json')
      try {
        manifest = JSON.parse(await readFile(path, 'utf8')) as TokenManifest
      } catch (error) {
        throw new PsycheError(`${path}: not valid JSON (${(error as Error).message})`)
      }
      if (manifest.format !== 'psyche-tokens/1') throw new PsycheError(`${path}: format ${JSON.stringify(manifest.format)}: expected "psyche-tokens/1"`)
      parseTokenSize(manifest.token_size, `${path}: token_size`)
      if (!Number.isInteger(manifest.vocab_size) || manifest.vocab_size <= 0) throw new PsycheError(`${path}: vocab_size must be a positive integer`)
    }
    const tokenSize = manifest?.token_size ?? options.tokenSize ?? 2
    const fileNames = manifest?.files ?? names.filter((n) => TOKEN_FILE.test(n))
    if (fileNames.length === 0) throw new PsycheError(`${dir}: no token files (*.bin, *.ds) in the data directory`)
    const files: TokenFile[] = []
    const offsets: number[] = []
    let total = 0
    for (const name of fileNames) {
      const file = await TokenFile.open(join(dir, name), tokenSize)
      files.push(file)
      offsets.push(total)
      total += file.numTokens
    }
    if (manifest && manifest.tokens !== total) {
      throw new PsycheError(`${join(dir, 'manifest.json')}: says ${manifest.tokens} tokens but the files hold ${total}`)
    }
    return new LocalTokenDataset(dir, files, manifest, offsets, total)
  }

  numSamples(seqLen: number): number {
    return numWindows(this.numTokens, seqLen)
  }

  /** Reads token range [start, start+count) across file boundaries. */
  async readTokens(start: number, count: number, out: Uint32Array, outOffset = 0): Promise<void> {
    let position = start
    let remaining = count
    let at = outOffset
    let index = this.offsets.findLastIndex((o) => o <= position)
    while (remaining > 0) {
      const file = this.files[index]
      if (!file) throw new PsycheError(`${this.dir}: read of tokens [${start}, ${start + count}) is past the end (${this.numTokens} tokens)`)
      const local = position - this.offsets[index]
      const take = Math.min(remaining, file.numTokens - local)
      if (take > 0) await file.readInto(local, take, out, at)
      position += take
      remaining -= take
      at += take
      index++
    }
  }

  /** The samples for `batchIds`, each seqLen + 1 ids, concatenated row-major: shape [batchIds.length, seqLen + 1]. */
  async getSamples(batchIds: readonly number[], seqLen: number): Promise<Uint32Array> {
    const out = new Uint32Array(batchIds.length * (seqLen + 1))
    for (const [row, id] of batchIds.entries()) {
      const {start, length} = windowForBatch(id, this.numTokens, seqLen)
      await this.readTokens(start, length, out, row * length)
    }
    return out
  }

  async close(): Promise<void> {
    await Promise.all(this.files.map((f) => f.close()))
  }
}
