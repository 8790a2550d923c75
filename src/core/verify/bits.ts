/** Bit fields packed LSB-first, as the worker's result formats pack them (distro_codec.py, sparseloco_codec.py). */

/** Reads `bits` bits (≤ 24) at bit offset `pos` of `b` from byte `start`, LSB-first. */
export function readBits(b: Uint8Array, start: number, pos: number, bits: number): number {
  const byte = start + (pos >>> 3)
  const shift = pos & 7
  const word = b[byte] | ((b[byte + 1] ?? 0) << 8) | ((b[byte + 2] ?? 0) << 16) | ((b[byte + 3] ?? 0) << 24)
  return (word >>> shift) & ((1 << bits) - 1)
}

/** readBits for any width up to 53 bits. */
export function readBitsSlow(b: Uint8Array, start: number, pos: number, bits: number): number {
  let v = 0
  for (let k = 0; k < bits; k++) {
    const p = pos + k
    if ((b[start + (p >>> 3)] >>> (p & 7)) & 1) v += 2 ** k
  }
  return v
}

/** Whether the bits after the first `usedBits` of the `bytes` bytes at `start` are all zero (canonical padding). */
export function paddingIsZero(b: Uint8Array, start: number, usedBits: number, bytes: number): boolean {
  if (usedBits % 8 === 0) return true
  return b[start + bytes - 1] >>> (usedBits % 8) === 0
}

/** What a result reader says of untrusted bytes: valid, or why not. */
export type Validation = {ok: true} | {ok: false; reason: string}

/** A result's bytes break its format; `validating` turns it into a Validation. */
export class Invalid extends Error {}

/** Runs a reader's checks over untrusted bytes: `Invalid` becomes {ok: false, reason}; anything else is a bug and throws. */
export function validating(check: () => void): Validation {
  try {
    check()
    return {ok: true}
  } catch (error) {
    if (error instanceof Invalid) return {ok: false, reason: error.message}
    throw error
  }
}
