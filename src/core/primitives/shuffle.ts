import {sha256, u32le} from './seed.js'

/**
 * Swap-or-not shuffle over SHA-256 (the construction Ethereum uses for committees): a permutation of
 * [0, n) that anyone can recompute from the seed, one index at a time (O(rounds) hashes) or for the
 * whole list (O(rounds · n/256) hashes). Each round is an involution, so running the rounds backwards
 * inverts it — which lets us find "who holds position p" without shuffling everyone.
 */
const SHUFFLE_ROUNDS = 90

const TWO_32 = 2 ** 32

interface RoundKeys {
  pivots: Int32Array
  /** seed ‖ round byte, the prefix of every source hash of that round. */
  prefixes: Buffer[]
}

const keyCache = new Map<string, RoundKeys>()

function roundKeys(seed: Buffer, n: number): RoundKeys {
  const cacheKey = `${seed.toString('hex')}:${n}`
  const hit = keyCache.get(cacheKey)
  if (hit) return hit
  const pivots = new Int32Array(SHUFFLE_ROUNDS)
  const prefixes: Buffer[] = []
  for (let r = 0; r < SHUFFLE_ROUNDS; r++) {
    const prefix = Buffer.concat([seed, Buffer.from([r])])
    prefixes.push(prefix)
    const h = sha256(prefix)
    // (hi · 2^32 + lo) mod n without BigInt: n < 2^31 keeps every product below 2^53.
    pivots[r] = ((((h.readUInt32LE(4) % n) * (TWO_32 % n)) % n) + (h.readUInt32LE(0) % n)) % n
  }
  const keys = {pivots, prefixes}
  if (keyCache.size > 64) keyCache.clear() // a memo, not state: bounded, and results never depend on it
  keyCache.set(cacheKey, keys)
  return keys
}

function checkArgs(index: number, n: number, seed: Buffer): void {
  if (!Number.isSafeInteger(n) || n < 1 || n >= 2 ** 31) throw new RangeError(`shuffle size ${n} must be in [1, 2^31)`)
  if (!Number.isSafeInteger(index) || index < 0 || index >= n) throw new RangeError(`index ${index} is outside [0, ${n})`)
  if (seed.length !== 32) throw new RangeError('shuffle seed must be 32 bytes')
}

function swapRound(index: number, n: number, r: number, keys: RoundKeys): number {
  const flip = (keys.pivots[r] + n - index) % n
  const position = Math.max(index, flip)
  const source = sha256(keys.prefixes[r], u32le(Math.floor(position / 256)))
  const bit = (source[(position % 256) >> 3] >> (position % 8)) & 1
  return bit ? flip : index
}

/** Where `index` lands in the shuffled order. */
export function shuffledIndex(index: number, n: number, seed: Buffer): number {
  checkArgs(index, n, seed)
  const keys = roundKeys(seed, n)
  for (let r = 0; r < SHUFFLE_ROUNDS; r++) index = swapRound(index, n, r, keys)
  return index
}

/** The index that lands at `position`: the inverse of shuffledIndex. */
export function unshuffledIndex(position: number, n: number, seed: Buffer): number {
  checkArgs(position, n, seed)
  const keys = roundKeys(seed, n)
  for (let r = SHUFFLE_ROUNDS - 1; r >= 0; r--) position = swapRound(position, n, r, keys)
  return position
}

/** shuffledIndex for every index at once: out[i] = shuffledIndex(i, n, seed), sharing source hashes. */
export function shuffleAll(n: number, seed: Buffer): Int32Array {
  if (n === 0) return new Int32Array(0)
  checkArgs(0, n, seed)
  const keys = roundKeys(seed, n)
  const out = new Int32Array(n)
  for (let i = 0; i < n; i++) out[i] = i
  const chunks = Math.ceil(n / 256)
  for (let r = 0; r < SHUFFLE_ROUNDS; r++) {
    const sources: (Buffer | undefined)[] = new Array(chunks)
    const pivot = keys.pivots[r]
    for (let i = 0; i < n; i++) {
      const index = out[i]
      const flip = (pivot + n - index) % n
      const position = index > flip ? index : flip
      const chunk = position >> 8
      const source = (sources[chunk] ??= sha256(keys.prefixes[r], u32le(chunk)))
      if ((source[(position & 255) >> 3] >> (position & 7)) & 1) out[i] = flip
    }
  }
  return out
}
