/** One named tensor of a model, raw little-endian bytes (as the worker exports them). */
export interface ModelFrame {
  name: string
  dtype: string
  shape: number[]
  data: Uint8Array
}

/** A model as shared peer to peer: the step it is at, the worker's parameter hash, and every tensor. */
export interface ModelSnapshot {
  step: number
  paramHash: string
  frames: ModelFrame[]
}

/** Bytes per element of the dtypes a worker may export (torch names, with or without the "torch." prefix). */
export const DTYPE_BYTES: Record<string, number> = {
  float64: 8,
  float32: 4,
  float16: 2,
  bfloat16: 2,
  int64: 8,
  int32: 4,
  int16: 2,
  int8: 1,
  uint32: 4,
  uint16: 2,
  uint8: 1,
  bool: 1,
}

const MAX_FRAMES = 100_000
const MAX_NAME_LENGTH = 512
const MAX_RANK = 8

export function dtypeBytes(dtype: string): number | undefined {
  return DTYPE_BYTES[dtype.startsWith('torch.') ? dtype.slice(6) : dtype]
}

/**
 * Checks a model response header from the wire: every frame's size must equal its shape times its dtype's width,
 * and the total must fit maxModelBytes. Throws with the reason.
 */
export function validateModelHeader(
  header: Record<string, unknown>,
  maxModelBytes: number,
): {step: number; paramHash: string; frames: {name: string; dtype: string; shape: number[]; size: number}[]; totalBytes: number} {
  const {step, paramHash, frames} = header
  if (typeof step !== 'number' || !Number.isSafeInteger(step) || step < 0) throw new Error('model header: step is not a non-negative integer')
  if (typeof paramHash !== 'string' || paramHash.length === 0 || paramHash.length > 256) throw new Error('model header: paramHash is not a short string')
  if (!Array.isArray(frames) || frames.length === 0 || frames.length > MAX_FRAMES) throw new Error(`model header: frames is not a list of 1..${MAX_FRAMES}`)
  const seen = new Set<string>()
  let totalBytes = 0
  const out = []
  for (const [i, raw] of frames.entries()) {
    if (typeof raw !== 'object' || raw === null) throw new Error(`model header: frame ${i} is not an object`)
    const f = raw as Record<string, unknown>
    if (typeof f.name !== 'string' || f.name.length === 0 || f.name.length > MAX_NAME_LENGTH) throw new Error(`model header: frame ${i} has no valid name`)
    if (seen.has(f.name)) throw new Error(`model header: frame name ${f.name} repeats`)
    seen.add(f.name)
    const width = typeof f.dtype === 'string' ? dtypeBytes(f.dtype) : undefined
    if (width === undefined) throw new Error(`model header: frame ${f.name} has unsupported dtype ${String(f.dtype).slice(0, 40)}`)
    if (!Array.isArray(f.shape) || f.shape.length > MAX_RANK || !f.shape.every((d) => Number.isSafeInteger(d) && d >= 0)) {
      throw new Error(`model header: frame ${f.name} has an invalid shape`)
    }
    const shape = f.shape as number[]
    const elements = shape.reduce((a, b) => a * b, 1)
    const size = elements * width
    if (!Number.isSafeInteger(size) || f.size !== size) throw new Error(`model header: frame ${f.name} declares ${String(f.size)} bytes, its shape and dtype need ${size}`)
    totalBytes += size
    if (totalBytes > maxModelBytes) throw new Error(`model header: model exceeds the ${maxModelBytes}-byte maximum`)
    out.push({name: f.name, dtype: f.dtype as string, shape, size})
  }
  return {step, paramHash, frames: out, totalBytes}
}
