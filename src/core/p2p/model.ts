import {sha256Hex} from '../primitives/hash.js'
import {signBytes, verifyBytes, type Identity} from '../primitives/identity.js'

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
const DTYPE_BYTES: Record<string, number> = {
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

function dtypeBytes(dtype: string): number | undefined {
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

// ---- Attested model sharing (/psyche/model/2) -------------------------------------------------------------
//
// A serving peer signs a manifest of its model: the step, the worker's parameter hash, and every tensor's name,
// dtype, shape, size and sha256. The manifest's root hash binds all of it. A joining client asks every peer for its
// manifest, takes the root that a strict majority of the answering peers sign, and then downloads the tensors from
// those peers, each checked against the manifest's sha256 before it is kept.

/** One tensor as a manifest lists it. */
export interface ManifestTensor {
  name: string
  dtype: string
  shape: number[]
  size: number
  /** sha256 hex of the tensor's raw bytes */
  sha256: string
}

export interface ModelManifest {
  run_id: string
  step: number
  param_hash: string
  tensors: ManifestTensor[]
  /** the signer's client id (hex ed25519 public key) */
  signer: string
  /** hex ed25519 signature over manifestSigningBytes(root) */
  signature: string
}

type UnsignedManifest = Omit<ModelManifest, 'signer' | 'signature'>

const MANIFEST_DOMAIN = 'psyche/model-manifest/1\n'
const HEX_32 = /^[0-9a-f]{64}$/
const HEX_SIG = /^[0-9a-f]{128}$/

/** The manifest's root hash: sha256 over every field but the signature, in a fixed order. */
export function manifestRoot(m: UnsignedManifest): string {
  const tensors = m.tensors.map((t) => [t.name, t.dtype, t.shape, t.size, t.sha256])
  return sha256Hex(MANIFEST_DOMAIN, JSON.stringify([m.run_id, m.step, m.param_hash, tensors]))
}

function manifestSigningBytes(root: string): Uint8Array {
  return Buffer.from(`${MANIFEST_DOMAIN}root ${root}`, 'utf8')
}

/** The manifest of a snapshot (hashes every tensor), signed by `identity`. */
export function signManifest(identity: Identity, runId: string, snapshot: ModelSnapshot): ModelManifest {
  const unsigned: UnsignedManifest = {
    run_id: runId,
    step: snapshot.step,
    param_hash: snapshot.paramHash,
    tensors: snapshot.frames.map((f) => ({name: f.name, dtype: f.dtype, shape: f.shape, size: f.data.length, sha256: sha256Hex(f.data)})),
  }
  const signature = Buffer.from(signBytes(identity, manifestSigningBytes(manifestRoot(unsigned)))).toString('hex')
  return {...unsigned, signer: identity.id, signature}
}

/**
 * Checks a manifest from the wire: its shape and bounds (validateModelHeader's rules for the tensors), the run id,
 * and the signature against `signer`. Returns the manifest and its root, or throws with the reason.
 */
export function parseManifest(raw: unknown, runId: string, maxModelBytes: number): {manifest: ModelManifest; root: string; totalBytes: number} {
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) throw new Error('manifest is not an object')
  const r = raw as Record<string, unknown>
  if (typeof r.run_id !== 'string' || r.run_id !== runId) throw new Error(`manifest run_id ${JSON.stringify(r.run_id)?.slice(0, 80)} is not this run (${runId})`)
  if (typeof r.signer !== 'string' || !HEX_32.test(r.signer)) throw new Error('manifest signer is not a 32-byte lowercase hex public key')
  if (typeof r.signature !== 'string' || !HEX_SIG.test(r.signature)) throw new Error('manifest signature is not 64 bytes of lowercase hex')
  if (!Array.isArray(r.tensors)) throw new Error('manifest tensors is not a list')
  const {step, paramHash, frames, totalBytes} = validateModelHeader({step: r.step, paramHash: r.param_hash, frames: r.tensors}, maxModelBytes)
  const tensors: ManifestTensor[] = frames.map((f, i) => {
    const sha = (r.tensors as Record<string, unknown>[])[i].sha256
    if (typeof sha !== 'string' || !HEX_32.test(sha)) throw new Error(`manifest tensor ${f.name} has no sha256 hex digest`)
    return {name: f.name, dtype: f.dtype, shape: f.shape, size: f.size, sha256: sha}
  })
  const manifest: ModelManifest = {run_id: r.run_id, step, param_hash: paramHash, tensors, signer: r.signer, signature: r.signature}
  const root = manifestRoot(manifest)
  if (!verifyBytes(manifest.signer, manifestSigningBytes(root), Buffer.from(manifest.signature, 'hex')))
    throw new Error(`manifest signature does not verify against signer ${manifest.signer.slice(0, 16)}…`)
  return {manifest, root, totalBytes}
}

/** Bounds of a tensor request (the server parses it from the wire). */
export const MAX_TENSORS_PER_REQUEST = 64

export function parseTensorRequest(raw: Record<string, unknown>): {step: number; indices: number[]} {
  const {step, indices} = raw
  if (typeof step !== 'number' || !Number.isSafeInteger(step) || step < 0) throw new Error('tensor request: step is not a non-negative integer')
  if (!Array.isArray(indices) || indices.length === 0 || indices.length > MAX_TENSORS_PER_REQUEST)
    throw new Error(`tensor request: indices is not a list of 1..${MAX_TENSORS_PER_REQUEST}`)
  if (!indices.every((i) => Number.isSafeInteger(i) && i >= 0 && i < MAX_FRAMES)) throw new Error('tensor request: an index is not a valid tensor index')
  if (new Set(indices).size !== indices.length) throw new Error('tensor request: an index repeats')
  return {step, indices: indices as number[]}
}
