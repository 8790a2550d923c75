import {sha256} from './hash.js'

/**
 * A bloom filter over byte strings, as witnesses use it to attest which results they saw. Positions
 * come from SHA-256 of the item (double hashing, Kirsch–Mitzenmacher, each position multiplied out over 64 bits), so every implementation — the
 * TCP coordinator, the Solana program, a client checking a proof — computes the same bits.
 */

export interface BloomParams {
  /** Number of bits; a multiple of 8. */
  bits: number
  /** Bit positions set per item. */
  hashes: number
}

const MIN_BITS = 64
const MAX_HASHES = 16

/** The smallest filter holding `items` items at about `falsePositiveRate` false positives. */
export function bloomParamsFor(items: number, falsePositiveRate = 0.01): BloomParams {
  if (!Number.isSafeInteger(items) || items < 0) throw new RangeError(`bloom capacity ${items} must be a non-negative integer`)
  if (!(falsePositiveRate > 0 && falsePositiveRate < 1)) throw new RangeError(`false positive rate ${falsePositiveRate} must be in (0, 1)`)
  const n = Math.max(items, 1)
  const ideal = Math.ceil((-n * Math.log(falsePositiveRate)) / (Math.LN2 * Math.LN2))
  const bits = Math.max(MIN_BITS, Math.ceil(ideal / 8) * 8)
  const hashes = Math.min(MAX_HASHES, Math.max(1, Math.round((bits / n) * Math.LN2)))
  return {bits, hashes}
}

function toBytes(item: Uint8Array | string): Uint8Array {
  return typeof item === 'string' ? Buffer.from(item, 'utf8') : item
}

/** The 64-bit golden-ratio multiplier (Fibonacci hashing). */
const K = 0x9e3779b97f4a7c15n
const MASK64 = (1n << 64n) - 1n

/**
 * Position i is fold(K · (h1 + i·h2) mod 2⁶⁴) mod bits, where fold(x) = x XOR (x >> 32) (programs/coordinator mirrors
 * it, in few instructions: the program checks every trainer of a proof). Plain double hashing, (h1 + i·h2) mod bits,
 * depends on h1 and h2 modulo the size only: at the 64-bit minimum that is 64 × 32 patterns, so two items set
 * exactly the same bits once in 2,048 pairs, and a filter holding one then vouches for the other. A witness bloom
 * holding one trainer named another nobody received, far above the designed rate, and every replica waited for a
 * result that did not exist and dropped its model. Multiplied out over 64 bits, every bit of h1 and h2 moves the
 * positions.
 */
function positionsOf(params: BloomParams, item: Uint8Array | string): number[] {
  const digest = sha256(toBytes(item))
  const h1 = BigInt(digest.readUInt32LE(0))
  const h2 = BigInt((digest.readUInt32LE(4) | 1) >>> 0)
  const bits = BigInt(params.bits)
  const out = new Array<number>(params.hashes)
  let g = h1
  for (let i = 0; i < params.hashes; i++, g += h2) {
    const x = (g * K) & MASK64
    out[i] = Number((x ^ (x >> 32n)) % bits)
  }
  return out
}

export class BloomFilter {
  readonly params: BloomParams
  /** The bit array, little-endian within each byte. */
  readonly bytes: Uint8Array

  constructor(params: BloomParams, bytes?: Uint8Array) {
    if (!Number.isSafeInteger(params.bits) || params.bits <= 0 || params.bits % 8 !== 0) throw new RangeError(`bloom size ${params.bits} must be a positive multiple of 8 bits`)
    if (!Number.isSafeInteger(params.hashes) || params.hashes < 1 || params.hashes > MAX_HASHES) throw new RangeError(`bloom hash count ${params.hashes} must be 1..${MAX_HASHES}`)
    if (bytes && bytes.length !== params.bits / 8) throw new RangeError(`bloom of ${params.bits} bits needs ${params.bits / 8} bytes, got ${bytes.length}`)
    this.params = {bits: params.bits, hashes: params.hashes}
    this.bytes = bytes ? Uint8Array.from(bytes) : new Uint8Array(params.bits / 8)
  }

  static forCapacity(items: number, falsePositiveRate = 0.01): BloomFilter {
    return new BloomFilter(bloomParamsFor(items, falsePositiveRate))
  }

  /** Reads a filter from base64; throws RangeError when the length does not match `params`. */
  static fromBase64(params: BloomParams, text: string): BloomFilter {
    return new BloomFilter(params, Buffer.from(text, 'base64'))
  }

  /** The bit positions of `item` in any filter with `params` (so callers testing one item against many filters hash it once). */
  static positionsFor(params: BloomParams, item: Uint8Array | string): number[] {
    return positionsOf(params, item)
  }

  /** contains() for positions from positionsFor with the same params. */
  containsPositions(positions: readonly number[]): boolean {
    for (const p of positions) if ((this.bytes[p >> 3] & (1 << (p & 7))) === 0) return false
    return true
  }

  private positions(item: Uint8Array | string): number[] {
    return positionsOf(this.params, item)
  }

  add(item: Uint8Array | string): this {
    for (const p of this.positions(item)) this.bytes[p >> 3] |= 1 << (p & 7)
    return this
  }

  /** True if the item was added, or (rarely, at the configured rate) a false positive. */
  contains(item: Uint8Array | string): boolean {
    for (const p of this.positions(item)) if ((this.bytes[p >> 3] & (1 << (p & 7))) === 0) return false
    return true
  }

  /** Fraction of bits set: a filter with (nearly) every bit set vouches for everything. */
  fillRatio(): number {
    let set = 0
    for (const byte of this.bytes) {
      let b = byte
      while (b) {
        set += b & 1
        b >>= 1
      }
    }
    return set / this.params.bits
  }

  toBase64(): string {
    return Buffer.from(this.bytes).toString('base64')
  }
}
