import {PsycheError} from '../errors.js'

/** Psyche's `shuffle_seed` / `Shuffle::Seeded`: 32 bytes. */
export type ShuffleSeed = Uint8Array

/** Psyche's `shuffle` field: `"DontShuffle"` or `{Seeded = [32 bytes]}`; a bare byte array is accepted too (data.toml's `shuffle_seed`). */
export type ShuffleSpec = 'DontShuffle' | {Seeded: readonly number[]} | readonly number[] | Uint8Array

/** Normalises any accepted shuffle spelling to 32 seed bytes, or undefined for no shuffle. */
export function parseShuffle(spec: ShuffleSpec | undefined | null, where: string): ShuffleSeed | undefined {
  if (spec === undefined || spec === null || spec === 'DontShuffle') return undefined
  const bytes = spec instanceof Uint8Array ? [...spec] : Array.isArray(spec) ? spec : typeof spec === 'object' && 'Seeded' in spec ? spec.Seeded : undefined
  if (!Array.isArray(bytes)) throw new PsycheError(`${where}: expected "DontShuffle", {Seeded = [32 bytes]} or an array of 32 bytes, got ${JSON.stringify(spec)}`)
  if (bytes.length !== 32 || !bytes.every((b) => Number.isInteger(b) && b >= 0 && b <= 255)) {
    throw new PsycheError(`${where}: a shuffle seed is exactly 32 integers in 0..255 (got ${bytes.length} values)`)
  }
  return Uint8Array.from(bytes)
}

const ROUNDS = 8

/** murmur3's 32-bit finaliser: a cheap, well-mixing function of 32 bits. */
function mix32(x: number): number {
  x ^= x >>> 16
  x = Math.imul(x, 0x85ebca6b)
  x ^= x >>> 13
  x = Math.imul(x, 0xc2b2ae35)
  x ^= x >>> 16
  return x >>> 0
}

/**
 * A seeded permutation of [0, n) computed per index (a balanced Feistel network with cycle walking), so
 * shuffling millions of windows costs no memory and no start-up pass, and every party computes the same
 * order from the seed. Not bit-compatible with Psyche's ChaCha8 shuffle; only DontShuffle orders match Psyche.
 */
export class SeededPermutation {
  private readonly halfBits: number
  private readonly mask: number
  private readonly keys: Uint32Array

  constructor(
    readonly size: number,
    seed: ShuffleSeed,
  ) {
    if (!Number.isSafeInteger(size) || size < 0 || size > 2 ** 32) throw new RangeError(`cannot shuffle ${size} windows (at most 2^32)`)
    let bits = 2
    while (2 ** bits < size) bits += 2
    this.halfBits = bits / 2
    this.mask = 2 ** this.halfBits - 1
    const view = new DataView(seed.buffer, seed.byteOffset, seed.byteLength)
    this.keys = new Uint32Array(ROUNDS)
    for (let r = 0; r < ROUNDS; r++) this.keys[r] = view.getUint32(r * 4, true)
  }

  private encrypt(x: number): number {
    let left = Math.floor(x / 2 ** this.halfBits)
    let right = x % 2 ** this.halfBits
    for (let r = 0; r < ROUNDS; r++) {
      const f = mix32((right ^ this.keys[r]) + Math.imul(r + 1, 0x9e3779b9)) & this.mask
      const next = (left ^ f) >>> 0
      left = right
      right = next & this.mask
    }
    return left * 2 ** this.halfBits + right
  }

  /** The position in the shuffled order of index i; a bijection on [0, size). */
  apply(index: number): number {
    if (index < 0 || index >= this.size) throw new RangeError(`index ${index} outside [0, ${this.size})`)
    let x = this.encrypt(index)
    // The Feistel domain is < 4·size, so this walk takes under 4 steps on average and always ends.
    while (x >= this.size) x = this.encrypt(x)
    return x
  }
}
