import {sha256} from './hash.js'

/** SHA-256 of the concatenated parts (hash.ts). Pure: the only "randomness" the coordinator has. */
export {sha256}

export function u32le(n: number): Buffer {
  const b = Buffer.alloc(4)
  b.writeUInt32LE(n >>> 0)
  return b
}

export function u64le(n: number): Buffer {
  const b = Buffer.alloc(8)
  b.writeBigUInt64LE(BigInt(n))
  return b
}

export function fromHex(hex: string, what = 'seed'): Buffer {
  if (!/^[0-9a-f]{64}$/.test(hex)) throw new RangeError(`${what} must be 64 lowercase hex digits, got ${JSON.stringify(hex)}`)
  return Buffer.from(hex, 'hex')
}

/** A labelled sub-seed, so data assignment and witness selection draw independent shuffles from one round seed. */
export function subSeed(seedHex: string, label: string): Buffer {
  return sha256(fromHex(seedHex), Buffer.from(label, 'utf8'))
}
