/**
 * DisTrO's result format (result.ts dispatches to it): validation of a peer's DisTrO result before it is counted
 * anywhere (witnessed, applied, scored).
 *
 * The format is defined once, by python/psyche_worker/distro_codec.py (its module docstring); this is a
 * reader of that format that allocates nothing per coefficient and never trusts a length from the wire.
 * It accepts exactly the byte strings the worker's decode_result accepts — test/verify/result.test.ts
 * checks that on valid results and on thousands of mutated and random ones against the Python decoder —
 * so a result that passes here cannot make the worker refuse an apply.
 *
 * The tensor specs come from the worker itself (its configure reply, `result_format`), derived from the
 * run's model and DisTrO settings: nothing here re-derives chunking or top-k.
 */

import {Invalid, paddingIsZero, readBits, readBitsSlow, validating, type Validation} from './bits.js'

export const RESULT_MAGIC = Buffer.from('PSDR', 'latin1')
export const RESULT_FORMAT_VERSION = 1
const VALUE_SIGN = 0
const VALUE_FP16 = 1
const VALUE_BF16 = 2
const VALUE_FORMAT_NAMES = ['sign', 'fp16', 'bf16'] as const
const MAX_NAME_BYTES = 1024

/** What the model expects of one tensor of a result (distro_codec.TensorSpec). */
export interface TensorSpec {
  name: string
  shape: number[]
  chunk: number[]
  topk: number
}

/** What a DisTrO result must look like for this run: the worker's configure reply `result_format`. */
export interface DistroResultFormat {
  /** Absent in the worker's reply: DisTrO's format was the first, and names itself by its fields. */
  format?: 'distro'
  /** The run's value format: 'sign' (quantize_1bit) or a full-value format ('fp16' and 'bf16' are both accepted then). */
  value_format: 'sign' | 'fp16' | 'bf16'
  tensors: TensorSpec[]
}

export type {Validation}

interface Layout {
  spec: TensorSpec
  name: Buffer
  n: number
  chunkElems: number
  bits: number
}

function indexBits(chunkElems: number): number {
  let bits = 1
  while (2 ** bits < chunkElems) bits++
  return bits
}

const layouts = new WeakMap<DistroResultFormat, Layout[]>()

function layoutOf(format: DistroResultFormat): Layout[] {
  let out = layouts.get(format)
  if (out) return out
  out = format.tensors.map((spec) => {
    const nChunks = spec.shape.reduce((acc, s, i) => acc * Math.floor(s / spec.chunk[i]), 1)
    const chunkElems = spec.chunk.reduce((a, b) => a * b, 1)
    return {spec, name: Buffer.from(spec.name, 'utf8'), n: nChunks * spec.topk, chunkElems, bits: indexBits(chunkElems)}
  })
  layouts.set(format, out)
  return out
}

function valueBytes(fmt: number, count: number): number {
  return fmt === VALUE_SIGN ? Math.ceil(count / 8) : 2 * count
}

/** The exact byte size of a valid result in value format `fmt` (the encoding is canonical: one size per format). */
export function resultSize(format: DistroResultFormat, fmt: 'sign' | 'fp16' | 'bf16' = format.value_format): number {
  const f = VALUE_FORMAT_NAMES.indexOf(fmt)
  let size = 4 + 1 + 1 + 4
  for (const l of layoutOf(format)) {
    size += 2 + l.name.length + 1 + 8 * l.spec.shape.length + 4 + (f === VALUE_FP16 ? 1 : 0)
    size += Math.ceil((l.n * l.bits) / 8) + valueBytes(f, l.n)
  }
  return size
}

/** The largest size a valid result can have in this run (fp16 carries one exponent byte per tensor more than bf16). */
export function maxResultSize(format: DistroResultFormat): number {
  return format.value_format === 'sign' ? resultSize(format, 'sign') : resultSize(format, 'fp16')
}

/**
 * Validates `data` as a result for this run: format, version, value format, tensor names, shapes, chunks
 * and top-k against the model, exact size, index ranges, no duplicate index within a chunk, canonical zero
 * padding, finite values. Never throws on any input.
 */
export function validateDistroResult(data: Uint8Array, format: DistroResultFormat): Validation {
  return validating(() => check(data, format))
}

function check(b: Uint8Array, format: DistroResultFormat): void {
  const view = new DataView(b.buffer, b.byteOffset, b.byteLength)
  if (b.length < 10) throw new Invalid(`truncated: ${b.length} bytes is shorter than a result header`)
  if (!RESULT_MAGIC.equals(b.subarray(0, 4))) throw new Invalid(`bad magic ${JSON.stringify(Buffer.from(b.subarray(0, 4)).toString('latin1'))}, expected "PSDR"`)
  const version = b[4]
  const fmt = b[5]
  const count = view.getUint32(6, true)
  if (version !== RESULT_FORMAT_VERSION) throw new Invalid(`unsupported version ${version}, expected ${RESULT_FORMAT_VERSION}`)
  if (fmt > VALUE_BF16) throw new Invalid(`unknown value format ${fmt}`)
  const wantSign = format.value_format === 'sign'
  if ((fmt === VALUE_SIGN) !== wantSign) throw new Invalid(`value format ${VALUE_FORMAT_NAMES[fmt]} does not match the run's ${wantSign ? '1-bit' : 'full-value'} configuration`)
  const layout = layoutOf(format)
  if (count !== layout.length) throw new Invalid(`result has ${count} tensors, the model has ${layout.length}`)
  const expected = resultSize(format, VALUE_FORMAT_NAMES[fmt])
  if (b.length !== expected) throw new Invalid(`result is ${b.length} bytes, a ${VALUE_FORMAT_NAMES[fmt]} result for this model is exactly ${expected}`)
  // From here on the size is exact, so every read below is in bounds.
  let pos = 10
  for (let t = 0; t < layout.length; t++) {
    const {spec, name, n, chunkElems, bits} = layout[t]
    const where = `tensor ${t} (${spec.name})`
    const nameLen = view.getUint16(pos, true)
    pos += 2
    if (nameLen > MAX_NAME_BYTES) throw new Invalid(`${where}: name length ${nameLen} exceeds ${MAX_NAME_BYTES}`)
    if (nameLen !== name.length || !name.equals(b.subarray(pos, pos + nameLen))) throw new Invalid(`tensor ${t}: name does not match the model's ${spec.name}`)
    pos += nameLen
    const ndim = b[pos++]
    if (ndim !== spec.shape.length) throw new Invalid(`${where}: ndim ${ndim} does not match the model's ${spec.shape.length}`)
    for (let d = 0; d < ndim; d++, pos += 4) {
      const s = view.getUint32(pos, true)
      if (s !== spec.shape[d]) throw new Invalid(`${where}: shape[${d}] ${s} does not match the model's ${spec.shape[d]}`)
    }
    for (let d = 0; d < ndim; d++, pos += 4) {
      const c = view.getUint32(pos, true)
      if (c !== spec.chunk[d]) throw new Invalid(`${where}: chunk[${d}] ${c} does not match the expected ${spec.chunk[d]}`)
    }
    const topk = view.getUint32(pos, true)
    pos += 4
    if (topk !== spec.topk) throw new Invalid(`${where}: topk ${topk} does not match the expected ${spec.topk}`)
    if (fmt === VALUE_FP16) pos += 1 // i8 exponent: any value is valid

    const idxBytes = Math.ceil((n * bits) / 8)
    if (!paddingIsZero(b, pos, n * bits, idxBytes)) throw new Invalid(`${where}: nonzero padding bits after the indices`)
    const read = bits <= 24 ? readBits : readBitsSlow
    const row = new Float64Array(topk)
    for (let c = 0, i = 0; i < n; c++) {
      for (let k = 0; k < topk; k++, i++) {
        const index = read(b, pos, i * bits, bits)
        if (index >= chunkElems) throw new Invalid(`${where}: index ${index} at chunk ${c} is out of range (chunk has ${chunkElems} elements)`)
        row[k] = index
      }
      if (topk > 1) {
        row.sort()
        for (let k = 1; k < topk; k++) if (row[k] === row[k - 1]) throw new Invalid(`${where}: duplicate index in chunk ${c}`)
      }
    }
    pos += idxBytes

    const vBytes = valueBytes(fmt, n)
    if (fmt === VALUE_SIGN) {
      if (!paddingIsZero(b, pos, n, vBytes)) throw new Invalid(`${where}: nonzero padding bits after the sign bits`)
    } else {
      // fp16: exponent bits 0x7c00 all set is inf/NaN; bf16: 0x7f80.
      const mask = fmt === VALUE_FP16 ? 0x7c00 : 0x7f80
      for (let i = 0; i < n; i++) {
        if ((view.getUint16(pos + 2 * i, true) & mask) === mask) throw new Invalid(`${where}: non-finite ${VALUE_FORMAT_NAMES[fmt]} value`)
      }
    }
    pos += vBytes
  }
}

/**
 * The (tensor, chunk, index) positions a valid result selects, as numbers: for copy detection by index overlap
 * (src/core/verify/copy.ts). `bytes` must have passed validateResult. With `stride` > 1, only every stride-th
 * chunk (counted across all tensors) is read: a fixed sample, the same for every result of the run's model.
 */
export function distroResultIndices(bytes: Uint8Array, format: DistroResultFormat, stride = 1): Set<number> {
  const fmt = bytes[5]
  const out = new Set<number>()
  let pos = 10
  let base = 0
  let first = 0
  for (const {spec, name, n, chunkElems, bits} of layoutOf(format)) {
    pos += 2 + name.length + 1 + 8 * spec.shape.length + 4 + (fmt === VALUE_FP16 ? 1 : 0)
    const read = bits <= 24 ? readBits : readBitsSlow
    const chunks = n / spec.topk
    for (let c = first; c < chunks; c += stride) {
      for (let k = 0; k < spec.topk; k++) out.add(base + c * chunkElems + read(bytes, pos, (c * spec.topk + k) * bits, bits))
    }
    // The next sampled chunk, counted across tensors.
    first = (((first - chunks) % stride) + stride) % stride
    base += chunks * chunkElems
    pos += Math.ceil((n * bits) / 8) + valueBytes(fmt, n)
  }
  return out
}

/** Checks a worker's DisTrO `result_format` reply (it is ours, but a wrong one would make us reject every peer). */
export function parseDistroResultFormat(raw: unknown): DistroResultFormat {
  const r = raw as {value_format?: unknown; tensors?: unknown}
  if (!r || typeof r !== 'object' || !['sign', 'fp16', 'bf16'].includes(r.value_format as string) || !Array.isArray(r.tensors)) {
    throw new TypeError('worker result_format: expected {value_format, tensors}')
  }
  const uint = (v: unknown): v is number => Number.isSafeInteger(v) && (v as number) >= 1
  const tensors = r.tensors.map((t: TensorSpec, i: number) => {
    const ok =
      typeof t?.name === 'string' &&
      Array.isArray(t.shape) &&
      Array.isArray(t.chunk) &&
      t.shape.length === t.chunk.length &&
      t.shape.every(uint) &&
      t.chunk.every(uint) &&
      uint(t.topk)
    if (!ok) throw new TypeError(`worker result_format: tensor ${i} is malformed`)
    return {name: t.name, shape: [...t.shape], chunk: [...t.chunk], topk: t.topk}
  })
  return {value_format: r.value_format as DistroResultFormat['value_format'], tensors}
}
