import {open, type FileHandle} from 'node:fs/promises'
import {endianness} from 'node:os'
import {PsycheError} from '../errors.js'

/** Psyche's token sizes: flat little-endian uint16 ("TwoBytes") or uint32 ("FourBytes") ids. */
export type TokenSize = 2 | 4

export function parseTokenSize(value: unknown, where: string): TokenSize {
  if (value === 2 || value === '2' || value === 'TwoBytes') return 2
  if (value === 4 || value === '4' || value === 'FourBytes') return 4
  throw new PsycheError(`${where}: token size ${JSON.stringify(value)}: expected "TwoBytes" (2) or "FourBytes" (4)`)
}

/** File name endings Psyche reads as token files (its DATA_FILE_EXTENSIONS). */
export const TOKEN_FILE_PATTERN = /\.(bin|ds|npy)$/

/** Random access to the bytes of one file, local or remote. `name` is the path or URL used in errors. */
export interface ByteSource {
  readonly name: string
  readonly size: number
  /** Exactly `length` bytes from `offset`, or a PsycheError naming the source. */
  read(offset: number, length: number): Promise<Uint8Array>
  close(): Promise<void>
}

/** A local file read with positional reads: a dataset of any size never has to fit in memory. */
class LocalByteSource implements ByteSource {
  private constructor(
    readonly name: string,
    readonly size: number,
    private readonly handle: FileHandle,
  ) {}

  static async open(path: string): Promise<LocalByteSource> {
    let handle: FileHandle
    try {
      handle = await open(path, 'r')
    } catch (error) {
      throw new PsycheError(`${path}: cannot read token file (${(error as NodeJS.ErrnoException).code ?? error})`, {code: 'EDATA_FILE'})
    }
    const {size} = await handle.stat()
    return new LocalByteSource(path, size, handle)
  }

  async read(offset: number, length: number): Promise<Uint8Array> {
    // A fresh ArrayBuffer (not Buffer's shared pool) so the bytes can be viewed as aligned uint16/uint32.
    const bytes = new Uint8Array(length)
    let done = 0
    while (done < length) {
      const {bytesRead} = await this.handle.read(bytes, done, length - done, offset + done)
      if (bytesRead === 0)
        throw new PsycheError(`${this.name}: file is shorter than expected: no bytes at offset ${offset + done} (truncated while in use?)`, {code: 'EDATA_SHORT'})
      done += bytesRead
    }
    return bytes
  }

  async close(): Promise<void> {
    await this.handle.close()
  }
}

const NPY_MAGIC = '\x93NUMPY'
/** Enough for any sane .npy header (numpy pads headers to 64 bytes; long shapes stay far below this). */
const NPY_HEADER_READ = 4096

/** Where the ids start in a .npy file and their size, from its header (1-D or C-ordered uint16/uint32). */
async function readNpyHeader(source: ByteSource): Promise<{dataOffset: number; tokenSize: TokenSize; numTokens: number}> {
  const bad = (why: string) => new PsycheError(`${source.name}: not a token .npy file: ${why}`, {code: 'EDATA_FILE'})
  if (source.size < 10) throw bad(`only ${source.size} bytes`)
  const head = Buffer.from(await source.read(0, Math.min(NPY_HEADER_READ, source.size)))
  if (head.toString('latin1', 0, 6) !== NPY_MAGIC) throw bad('missing the \\x93NUMPY magic')
  const major = head[6]
  const lengthBytes = major === 1 ? 2 : 4
  const headerLength = major === 1 ? head.readUInt16LE(8) : head.readUInt32LE(8)
  const dataOffset = 8 + lengthBytes + headerLength
  if (dataOffset > head.length) throw bad(`header of ${headerLength} bytes is longer than the file or ${NPY_HEADER_READ} bytes`)
  const header = head.toString('latin1', 8 + lengthBytes, dataOffset)
  const descr = /'descr':\s*'([^']*)'/.exec(header)?.[1]
  const fortran = /'fortran_order':\s*(True|False)/.exec(header)?.[1]
  const shapeText = /'shape':\s*\(([^)]*)\)/.exec(header)?.[1]
  if (descr === undefined || fortran === undefined || shapeText === undefined) throw bad(`unreadable header ${JSON.stringify(header.trim())}`)
  const tokenSize = ({'<u2': 2, '=u2': 2, '<u4': 4, '=u4': 4} as Record<string, TokenSize>)[descr]
  if (tokenSize === undefined) throw bad(`dtype ${descr}: expected little-endian uint16 (<u2) or uint32 (<u4)`)
  const shape = shapeText
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean)
    .map(Number)
  if (shape.some((n) => !Number.isSafeInteger(n) || n < 0)) throw bad(`shape (${shapeText})`)
  if (fortran === 'True' && shape.length > 1) throw bad('Fortran-ordered arrays are not a flat token stream')
  const numTokens = shape.reduce((a, b) => a * b, 1)
  const available = source.size - dataOffset
  if (available !== numTokens * tokenSize) {
    throw new PsycheError(`${source.name}: header says ${numTokens} ids of ${tokenSize} bytes but the file holds ${available} data bytes (truncated?)`, {code: 'EDATA_SHORT'})
  }
  return {dataOffset, tokenSize, numTokens}
}

const littleEndianHost = endianness() === 'LE'

/** Widens little-endian ids in `bytes` into `out` at `outOffset`. */
export function decodeTokens(bytes: Uint8Array, tokenSize: TokenSize, out: Uint32Array, outOffset: number): void {
  const count = bytes.length / tokenSize
  if (littleEndianHost && bytes.byteOffset % tokenSize === 0) {
    const view = tokenSize === 2 ? new Uint16Array(bytes.buffer, bytes.byteOffset, count) : new Uint32Array(bytes.buffer, bytes.byteOffset, count)
    out.set(view, outOffset)
    return
  }
  const data = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  for (let i = 0; i < count; i++) out[outOffset + i] = tokenSize === 2 ? data.getUint16(i * 2, true) : data.getUint32(i * 4, true)
}

/**
 * One token file (flat .bin/.ds, or .npy with its header skipped) over any byte source. Ids come back
 * widened to uint32, the one dtype the worker accepts.
 */
export class TokenFile {
  private constructor(
    readonly source: ByteSource,
    readonly tokenSize: TokenSize,
    readonly dataOffset: number,
    readonly numTokens: number,
  ) {}

  get path(): string {
    return this.source.name
  }

  /** Opens a local file. */
  static async open(path: string, tokenSize: TokenSize): Promise<TokenFile> {
    const source = await LocalByteSource.open(path)
    try {
      return await TokenFile.fromSource(source, tokenSize)
    } catch (error) {
      await source.close()
      throw error
    }
  }

  /** Checks the file's layout against the configured token size; a .npy file's dtype must agree with it. */
  static async fromSource(source: ByteSource, tokenSize: TokenSize): Promise<TokenFile> {
    const path = /^https?:\/\//.test(source.name) ? new URL(source.name).pathname : source.name
    if (/\.npy$/i.test(path)) {
      const npy = await readNpyHeader(source)
      if (npy.tokenSize !== tokenSize) {
        throw new PsycheError(`${source.name}: holds ${npy.tokenSize}-byte ids but the token size is ${tokenSize} bytes`, {code: 'EDATA_FILE'})
      }
      return new TokenFile(source, tokenSize, npy.dataOffset, npy.numTokens)
    }
    if (source.size % tokenSize !== 0) {
      throw new PsycheError(`${source.name}: size ${source.size} bytes is not a multiple of the token size (${tokenSize} bytes); wrong token size or a truncated file`, {
        code: 'EDATA_FILE',
      })
    }
    return new TokenFile(source, tokenSize, 0, source.size / tokenSize)
  }

  /** Reads `count` ids starting at token index `start` into `out` (at `outOffset`). */
  async readInto(start: number, count: number, out: Uint32Array, outOffset = 0): Promise<void> {
    if (start < 0 || count < 0 || start + count > this.numTokens) {
      throw new PsycheError(`${this.path}: read of tokens [${start}, ${start + count}) is past the end (${this.numTokens} tokens)`, {code: 'EDATA_SHORT'})
    }
    const bytes = await this.source.read(this.dataOffset + start * this.tokenSize, count * this.tokenSize)
    decodeTokens(bytes, this.tokenSize, out, outOffset)
  }

  async close(): Promise<void> {
    await this.source.close()
  }
}
