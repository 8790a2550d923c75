import {open, stat, type FileHandle} from 'node:fs/promises'
import {PsycheError} from '../errors.js'

/** Psyche's token sizes: flat little-endian uint16 ("TwoBytes") or uint32 ("FourBytes") ids. */
export type TokenSize = 2 | 4

export function parseTokenSize(value: string | number, where: string): TokenSize {
  if (value === 2 || value === '2' || value === 'TwoBytes') return 2
  if (value === 4 || value === '4' || value === 'FourBytes') return 4
  throw new PsycheError(`${where}: token size ${JSON.stringify(value)}: expected "TwoBytes" (2) or "FourBytes" (4)`)
}

/**
 * One flat token file, read with positional reads so a dataset of any size never has to fit in memory.
 * Ids come back widened to uint32, the one dtype the worker accepts.
 */
export class TokenFile {
  private constructor(
    readonly path: string,
    readonly tokenSize: TokenSize,
    readonly numTokens: number,
    private readonly handle: FileHandle,
  ) {}

  static async open(path: string, tokenSize: TokenSize): Promise<TokenFile> {
    let size: number
    try {
      size = (await stat(path)).size
    } catch (error) {
      throw new PsycheError(`${path}: cannot read token file (${(error as NodeJS.ErrnoException).code ?? error})`)
    }
    if (size % tokenSize !== 0) {
      throw new PsycheError(`${path}: size ${size} bytes is not a multiple of the token size (${tokenSize} bytes); wrong token_size or a truncated file`)
    }
    const handle = await open(path, 'r')
    return new TokenFile(path, tokenSize, size / tokenSize, handle)
  }

  /** Reads `count` ids starting at token index `start` into `out` (at `outOffset`). */
  async readInto(start: number, count: number, out: Uint32Array, outOffset = 0): Promise<void> {
    if (start < 0 || count < 0 || start + count > this.numTokens) {
      throw new PsycheError(`${this.path}: read of tokens [${start}, ${start + count}) is past the end (${this.numTokens} tokens)`)
    }
    const bytes = Buffer.allocUnsafe(count * this.tokenSize)
    let done = 0
    while (done < bytes.length) {
      const {bytesRead} = await this.handle.read(bytes, done, bytes.length - done, start * this.tokenSize + done)
      if (bytesRead === 0) throw new PsycheError(`${this.path}: file shrank while reading tokens at ${start}`)
      done += bytesRead
    }
    if (this.tokenSize === 2) {
      for (let i = 0; i < count; i++) out[outOffset + i] = bytes.readUInt16LE(i * 2)
    } else {
      for (let i = 0; i < count; i++) out[outOffset + i] = bytes.readUInt32LE(i * 4)
    }
  }

  async close(): Promise<void> {
    await this.handle.close()
  }
}
