/**
 * SparseLoCo's result format (result.ts dispatches to it): validation of a peer's SparseLoCo result before it is
 * counted anywhere (witnessed, applied, scored), and the positions it selects (copy detection).
 *
 * The format is defined once, by python/psyche_worker/sparseloco_codec.py (its module docstring): a 16-byte header
 * (magic "PSSL", version, value_bits, flags, the run's 8-byte layout id), 2^value_bits float32 levels per tensor,
 * then per tensor byte-aligned sections: the Elias-Fano high parts of each chunk's k ascending indices (uppers), their
 * low bits (lows) and the codes; a tensor whose chunks keep every element (dense) sends its codes only. This reader
 * accepts exactly the byte strings the worker's decoder accepts — test/verify/sparseloco-result.test.ts compares them
 * on valid, mutated and random results — and never trusts a length from the wire: the size is exact, derived from
 * the layout the worker reports (its configure reply, `result_format`).
 */

import {Invalid, paddingIsZero, readBits, readBitsSlow, validating, type Validation} from './bits.js'
import type {TensorSpec} from './distro-result.js'

const MAGIC = Buffer.from('PSSL', 'latin1')
const VERSION = 1
const HEADER = 16
const FLAG_DCT = 1

/** What a SparseLoCo result must look like for this run: the worker's configure reply `result_format`. */
export interface SparseLoCoResultFormat {
  format: 'sparseloco'
  value_bits: number
  dct: boolean
  /** The 8-byte layout id of the header, as 16 hex digits. */
  layout_id: string
  tensors: TensorSpec[]
}

interface Layout {
  spec: TensorSpec
  /** Chunks, elements per chunk, values kept per chunk. */
  n: number
  elems: number
  k: number
  dense: boolean
  /** Elias-Fano low bits per index and upper bits per chunk. */
  low: number
  upper: number
  /** Bytes of the uppers, lows and codes sections. */
  upperBytes: number
  lowBytes: number
  codeBytes: number
}

const layouts = new WeakMap<SparseLoCoResultFormat, {tensors: Layout[]; size: number; id: Buffer}>()

function layoutOf(format: SparseLoCoResultFormat): {tensors: Layout[]; size: number; id: Buffer} {
  const hit = layouts.get(format)
  if (hit) return hit
  const b = format.value_bits
  const tensors = format.tensors.map((spec): Layout => {
    const n = spec.shape.reduce((acc, s, i) => acc * Math.floor(s / spec.chunk[i]), 1)
    const elems = spec.chunk.reduce((a, c) => a * c, 1)
    const k = spec.topk
    const dense = k === elems
    let low = 0 // floor(log2(floor(elems / k))), in integers
    while (!dense && 2 ** (low + 1) <= Math.floor(elems / k)) low++
    const upper = dense ? 0 : k + Math.floor((elems - 1) / 2 ** low)
    const numel = spec.shape.reduce((a, s) => a * s, 1)
    return {
      spec,
      n,
      elems,
      k,
      dense,
      low,
      upper,
      upperBytes: Math.ceil((n * upper) / 8),
      lowBytes: Math.ceil((n * k * low) / 8),
      codeBytes: Math.ceil(((dense ? numel : n * k) * b) / 8),
    }
  })
  const size = HEADER + 4 * 2 ** b * tensors.length + tensors.reduce((a, t) => a + t.upperBytes + t.lowBytes + t.codeBytes, 0)
  const out = {tensors, size, id: Buffer.from(format.layout_id, 'hex')}
  layouts.set(format, out)
  return out
}

/** The exact size of every valid result of this run. */
export function sparseLoCoResultSize(format: SparseLoCoResultFormat): number {
  return layoutOf(format).size
}

/** Chunks that carry a selection (sparse tensors' chunks): what copy detection samples. */
export function sparseLoCoSelectionChunks(format: SparseLoCoResultFormat): number {
  return layoutOf(format).tensors.reduce((a, t) => a + (t.dense ? 0 : t.n), 0)
}

/**
 * Validates `data` as a SparseLoCo result for this run: header (magic, version, value_bits, flags, layout id), exact
 * size, finite levels, exactly k indices per chunk, strictly increasing and in range, zero padding. Never throws.
 */
export function validateSparseLoCoResult(data: Uint8Array, format: SparseLoCoResultFormat): Validation {
  return validating(() => check(data, format))
}

function check(b: Uint8Array, format: SparseLoCoResultFormat): void {
  const {tensors, size, id} = layoutOf(format)
  if (b.length < HEADER) throw new Invalid(`truncated: ${b.length} bytes is shorter than the ${HEADER}-byte header`)
  if (!MAGIC.equals(b.subarray(0, 4))) throw new Invalid(`bad magic ${JSON.stringify(Buffer.from(b.subarray(0, 4)).toString('latin1'))}, expected "PSSL"`)
  if (b[4] !== VERSION) throw new Invalid(`unsupported version ${b[4]}, expected ${VERSION}`)
  if (b[5] !== format.value_bits) throw new Invalid(`value_bits ${b[5]} does not match the run's ${format.value_bits}`)
  if (b[6] !== (format.dct ? FLAG_DCT : 0) || b[7] !== 0) throw new Invalid(`flags ${b[6]}, ${b[7]} do not match the run's (dct ${format.dct ? 'on' : 'off'})`)
  if (!id.equals(b.subarray(8, 16)))
    throw new Invalid(`layout id ${Buffer.from(b.subarray(8, 16)).toString('hex')} is not this run's ${format.layout_id} (another model or configuration)`)
  if (b.length !== size) throw new Invalid(`result is ${b.length} bytes, a result for this model is exactly ${size}`)
  // From here on the size is exact, so every read below is in bounds.
  const view = new DataView(b.buffer, b.byteOffset, b.byteLength)
  const levels = 2 ** format.value_bits * tensors.length
  for (let i = 0; i < levels; i++) if ((view.getUint32(HEADER + 4 * i, true) & 0x7f800000) === 0x7f800000) throw new Invalid('non-finite level')
  let pos = HEADER + 4 * levels
  for (const [t, l] of tensors.entries()) {
    const where = `tensor ${t} (${l.spec.name})`
    if (!l.dense) {
      const uppers = pos
      const lows = pos + l.upperBytes
      if (!paddingIsZero(b, uppers, l.n * l.upper, l.upperBytes)) throw new Invalid(`${where}: nonzero padding bits after the index high parts`)
      if (!paddingIsZero(b, lows, l.n * l.k * l.low, l.lowBytes)) throw new Invalid(`${where}: nonzero padding bits after the index low parts`)
      for (let c = 0; c < l.n; c++) {
        let found = 0
        let previous = -1
        for (let p = 0; p < l.upper; p++) {
          const bit = c * l.upper + p
          if (((b[uppers + (bit >>> 3)] >>> (bit & 7)) & 1) === 0) continue
          if (found === l.k) throw new Invalid(`${where}: a chunk does not hold exactly ${l.k} indices`)
          const index = (p - found) * 2 ** l.low + (l.low ? readBits(b, lows, (c * l.k + found) * l.low, l.low) : 0)
          if (index >= l.elems) throw new Invalid(`${where}: an index is out of range (chunk has ${l.elems} elements)`)
          if (index <= previous) throw new Invalid(`${where}: indices of a chunk are not strictly increasing`)
          previous = index
          found++
        }
        if (found !== l.k) throw new Invalid(`${where}: a chunk does not hold exactly ${l.k} indices`)
      }
      pos = lows + l.lowBytes
    }
    const used = (l.dense ? l.spec.shape.reduce((a, s) => a * s, 1) : l.n * l.k) * format.value_bits
    if (!paddingIsZero(b, pos, used, l.codeBytes)) throw new Invalid(`${where}: nonzero padding bits after the codes`)
    pos += l.codeBytes
  }
}

/**
 * The (tensor, chunk, index) positions a valid result selects, as numbers, for copy detection by index overlap
 * (copy.ts); `bytes` must have passed validateSparseLoCoResult. Dense tensors select everything in every result and
 * are left out. With `stride` > 1, only every stride-th chunk (counted across the sparse tensors) is read.
 */
export function sparseLoCoResultIndices(bytes: Uint8Array, format: SparseLoCoResultFormat, stride = 1): Set<number> {
  const {tensors} = layoutOf(format)
  const out = new Set<number>()
  let pos = HEADER + 4 * 2 ** format.value_bits * tensors.length
  let base = 0
  let first = 0
  for (const l of tensors) {
    if (l.dense) {
      pos += l.codeBytes
      continue
    }
    const lows = pos + l.upperBytes
    const read = l.low <= 24 ? readBits : readBitsSlow
    for (let c = first; c < l.n; c += stride) {
      let found = 0
      for (let p = 0; p < l.upper && found < l.k; p++) {
        const bit = c * l.upper + p
        if (((bytes[pos + (bit >>> 3)] >>> (bit & 7)) & 1) === 0) continue
        const index = (p - found) * 2 ** l.low + (l.low ? read(bytes, lows, (c * l.k + found) * l.low, l.low) : 0)
        out.add(base + c * l.elems + index)
        found++
      }
    }
    first = (((first - l.n) % stride) + stride) % stride
    base += l.n * l.elems
    pos = lows + l.lowBytes + l.codeBytes
  }
  return out
}

/** Checks a worker's SparseLoCo `result_format` reply (it is ours, but a wrong one would make us reject every peer). */
export function parseSparseLoCoResultFormat(raw: unknown): SparseLoCoResultFormat {
  const r = raw as Partial<SparseLoCoResultFormat>
  const uint = (v: unknown): v is number => Number.isSafeInteger(v) && (v as number) >= 1
  if (
    !r ||
    r.format !== 'sparseloco' ||
    !uint(r.value_bits) ||
    r.value_bits > 8 ||
    typeof r.dct !== 'boolean' ||
    typeof r.layout_id !== 'string' ||
    !/^[0-9a-f]{16}$/.test(r.layout_id) ||
    !Array.isArray(r.tensors)
  ) {
    throw new TypeError('worker result_format: expected {format: sparseloco, value_bits, dct, layout_id, tensors}')
  }
  const tensors = r.tensors.map((t: TensorSpec, i: number) => {
    const ok =
      typeof t?.name === 'string' &&
      Array.isArray(t.shape) &&
      Array.isArray(t.chunk) &&
      t.shape.length === t.chunk.length &&
      t.shape.every(uint) &&
      t.chunk.every(uint) &&
      t.shape.every((s, d) => s % t.chunk[d] === 0) &&
      uint(t.topk) &&
      t.topk <= t.chunk.reduce((a, c) => a * c, 1)
    if (!ok) throw new TypeError(`worker result_format: tensor ${i} is malformed`)
    return {name: t.name, shape: [...t.shape], chunk: [...t.chunk], topk: t.topk}
  })
  return {format: 'sparseloco', value_bits: r.value_bits, dct: r.dct, layout_id: r.layout_id, tensors}
}
