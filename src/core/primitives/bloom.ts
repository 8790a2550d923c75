import {sha256} from './hash.js'

/**
 * A bloom filter over byte strings, as witnesses use it to attest which results they saw. Positions
 * come from SHA-256 of the item (double hashing, Kirsch–Mitzenmacher), so every implementation — the
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

function positionsOf(params: BloomParams, item: Uint8Array | string): number[] {
  const digest = sha256(toBytes(item))
  const h1 = digest.readUInt32LE(0)
  // Odd, so the stride visits distinct positions whenever the size is a power of two.
  const h2 = (digest.readUInt32LE(4) | 1) >>> 0
  const out = new Array<number>(params.hashes)
  for (let i = 0; i < params.hashes; i++) out[i] = (h1 + i * h2) % params.bits
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
