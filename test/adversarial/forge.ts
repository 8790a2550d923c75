import {randomInt} from 'node:crypto'
import type {ResultFormat} from '../../src/core/verify/result.js'

/**
 * Hostile but well-formed DisTrO results, made from an honest one (test-only): they pass validateResult, so
 * only verification (scoring) can tell them from honest work.
 */

interface Section {
  indexOffset: number
  valueOffset: number
  n: number
  topk: number
  chunkElems: number
  bits: number
}

function sections(bytes: Uint8Array, format: ResultFormat): {fmt: number; tensors: Section[]} {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength)
  const fmt = bytes[5]
  let pos = 10
  const tensors: Section[] = []
  for (const spec of format.tensors) {
    const nameLen = view.getUint16(pos, true)
    pos += 2 + nameLen
    const ndim = bytes[pos++]
    pos += 8 * ndim
    const topk = view.getUint32(pos, true)
    pos += 4
    if (fmt === 1) pos += 1
    const nChunks = spec.shape.reduce((a, s, i) => a * Math.floor(s / spec.chunk[i]), 1)
    const chunkElems = spec.chunk.reduce((a, b) => a * b, 1)
    let bits = 1
    while (2 ** bits < chunkElems) bits++
    const n = nChunks * topk
    const indexOffset = pos
    pos += Math.ceil((n * bits) / 8)
    const valueOffset = pos
    pos += fmt === 0 ? Math.ceil(n / 8) : 2 * n
    tensors.push({indexOffset, valueOffset, n, topk, chunkElems, bits})
  }
  return {fmt, tensors}
}

/** The honest result with every value negated: the update pushes the model uphill. */
export function signFlipped(honest: Uint8Array, format: ResultFormat): Uint8Array {
  const out = Uint8Array.from(honest)
  const {fmt, tensors} = sections(out, format)
  for (const t of tensors) {
    if (fmt === 0) {
      for (let i = 0; i < t.n; i++) out[t.valueOffset + (i >>> 3)] ^= 1 << (i & 7)
    } else {
      for (let i = 0; i < t.n; i++) out[t.valueOffset + 2 * i + 1] ^= 0x80
    }
  }
  return out
}

/** Random distinct indices per chunk and random signs, in the honest result's layout. */
export function randomWellFormed(honest: Uint8Array, format: ResultFormat): Uint8Array {
  const out = Uint8Array.from(honest)
  const {fmt, tensors} = sections(out, format)
  for (const t of tensors) {
    out.fill(0, t.indexOffset, t.valueOffset)
    for (let i = 0; i < t.n; i += t.topk) {
      const chosen = new Set<number>()
      while (chosen.size < t.topk) chosen.add(randomInt(t.chunkElems))
      let k = 0
      for (const index of chosen) {
        const pos = (i + k++) * t.bits
        for (let b = 0; b < t.bits; b++) if ((index >>> b) & 1) out[t.indexOffset + ((pos + b) >>> 3)] |= 1 << ((pos + b) & 7)
      }
    }
    if (fmt === 0) {
      for (let i = 0; i < t.n; i++) {
        const at = t.valueOffset + (i >>> 3)
        if (randomInt(2)) out[at] |= 1 << (i & 7)
        else out[at] &= ~(1 << (i & 7))
      }
    } else {
      for (let i = 0; i < t.n; i++) if (randomInt(2)) out[t.valueOffset + 2 * i + 1] ^= 0x80
    }
  }
  return out
}

/** Another producer's result with the sign of the first value of every tensor flipped: other bytes, the same indices. */
export function nearCopy(theirs: Uint8Array, format: ResultFormat): Uint8Array {
  const out = Uint8Array.from(theirs)
  const {fmt, tensors} = sections(out, format)
  for (const t of tensors) {
    if (fmt === 0) out[t.valueOffset] ^= 1
    else out[t.valueOffset + 1] ^= 0x80
  }
  return out
}
