import {readFile} from 'node:fs/promises'
import {dirname, isAbsolute, resolve} from 'node:path'
import {parse} from 'smol-toml'
import {PsycheError} from '../errors.js'
import {type ShuffleSeed, parseShuffle} from './shuffle.js'
import {type TokenSize, parseTokenSize} from './token-file.js'

/** Psyche's data.toml for the TCP data server. */
export interface DataServerConfig {
  /** Token directory, resolved against the data.toml's own directory. */
  dir: string
  tokenSize: TokenSize
  seqLen: number
  shuffleSeed: ShuffleSeed | undefined
}

const FIELDS = new Set(['dir', 'token_size', 'seq_len', 'shuffle_seed'])

export async function loadDataServerConfig(path: string): Promise<DataServerConfig> {
  let table: Record<string, unknown>
  try {
    table = parse(await readFile(path, 'utf8')) as Record<string, unknown>
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code
    throw new PsycheError(`${path}: ${code ? `cannot read (${code})` : `not valid TOML: ${(error as Error).message.split('\n')[0]}`}`)
  }
  for (const key of Object.keys(table)) {
    if (!FIELDS.has(key)) throw new PsycheError(`${path}: ${key}: unknown field (expected dir, token_size, seq_len, shuffle_seed)`)
  }
  if (typeof table.dir !== 'string' || table.dir === '') throw new PsycheError(`${path}: dir: expected the path of the token directory`)
  const seqLen = table.seq_len
  if (typeof seqLen !== 'number' || !Number.isSafeInteger(seqLen) || seqLen <= 0) throw new PsycheError(`${path}: seq_len: expected a positive integer, got ${JSON.stringify(seqLen)}`)
  return {
    dir: isAbsolute(table.dir) ? table.dir : resolve(dirname(path), table.dir),
    tokenSize: parseTokenSize(table.token_size, `${path}: token_size`),
    seqLen,
    shuffleSeed: parseShuffle(table.shuffle_seed as never, `${path}: shuffle_seed`),
  }
}
