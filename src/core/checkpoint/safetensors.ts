import {openAsBlob} from 'node:fs'
import {open} from 'node:fs/promises'
import {PsycheError} from '../errors.js'

/** One tensor of a safetensors file: its header entry and where its bytes lie in the file. */
interface SafetensorsEntry {
  name: string
  dtype: string
  shape: number[]
  /** byte offsets in the file (not in the data section) */
  start: number
  end: number
}

interface SafetensorsHeader {
  metadata: Record<string, string> | undefined
  tensors: SafetensorsEntry[]
  dataStart: number
  size: number
}

const MAX_HEADER = 100 * 1024 * 1024

/** Reads and checks the header of a safetensors file (8-byte little-endian length, then JSON). */
export async function readSafetensorsHeader(path: string): Promise<SafetensorsHeader> {
  const handle = await open(path, 'r')
  try {
    const {size} = await handle.stat()
    const lengthBytes = Buffer.alloc(8)
    await handle.read(lengthBytes, 0, 8, 0)
    const length = Number(lengthBytes.readBigUInt64LE(0))
    if (size < 8 || length > MAX_HEADER || 8 + length > size) throw new PsycheError(`${path}: not a safetensors file (bad header length)`)
    const headerBytes = Buffer.alloc(length)
    await handle.read(headerBytes, 0, length, 8)
    let header: Record<string, {dtype?: unknown; shape?: unknown; data_offsets?: unknown}>
    try {
      header = JSON.parse(headerBytes.toString('utf8'))
    } catch {
      throw new PsycheError(`${path}: not a safetensors file (header is not JSON)`)
    }
    const dataStart = 8 + length
    const tensors: SafetensorsEntry[] = []
    for (const [name, entry] of Object.entries(header)) {
      if (name === '__metadata__') continue
      const offsets = entry.data_offsets
      if (typeof entry.dtype !== 'string' || !Array.isArray(entry.shape) || !Array.isArray(offsets) || offsets.length !== 2)
        throw new PsycheError(`${path}: tensor ${name} has a malformed header entry`)
      const [a, b] = offsets as number[]
      if (!Number.isSafeInteger(a) || !Number.isSafeInteger(b) || a > b || dataStart + b > size) throw new PsycheError(`${path}: tensor ${name} lies outside the file`)
      tensors.push({name, dtype: entry.dtype, shape: entry.shape as number[], start: dataStart + a, end: dataStart + b})
    }
    tensors.sort((x, y) => x.start - y.start)
    return {metadata: header.__metadata__ as Record<string, string> | undefined, tensors, dataStart, size}
  } finally {
    await handle.close()
  }
}

interface Shard {
  path: string
  content: Blob
  size: number
}

/**
 * Splits a safetensors file into shards of at most `maxShardBytes` of tensor data (a tensor bigger than that gets
 * a shard of its own), named as transformers names them (model-00001-of-00003.safetensors), plus the
 * model.safetensors.index.json weight map. The shards are Blobs over slices of the original file: nothing is
 * copied into memory or onto disk.
 */
export async function shardSafetensors(
  path: string,
  maxShardBytes: number,
  baseName = 'model',
): Promise<{shards: Shard[]; index: {metadata: {total_size: number}; weight_map: Record<string, string>}}> {
  const header = await readSafetensorsHeader(path)
  const file = await openAsBlob(path)
  const groups: SafetensorsEntry[][] = []
  let current: SafetensorsEntry[] = []
  let currentBytes = 0
  for (const t of header.tensors) {
    const bytes = t.end - t.start
    if (current.length > 0 && currentBytes + bytes > maxShardBytes) {
      groups.push(current)
      current = []
      currentBytes = 0
    }
    current.push(t)
    currentBytes += bytes
  }
  if (current.length > 0) groups.push(current)
  const total = groups.length
  const weightMap: Record<string, string> = {}
  let totalSize = 0
  const shards: Shard[] = groups.map((group, i) => {
    const name = `${baseName}-${String(i + 1).padStart(5, '0')}-of-${String(total).padStart(5, '0')}.safetensors`
    const json: Record<string, unknown> = {__metadata__: {...header.metadata, format: header.metadata?.format ?? 'pt'}}
    let offset = 0
    for (const t of group) {
      json[t.name] = {dtype: t.dtype, shape: t.shape, data_offsets: [offset, offset + (t.end - t.start)]}
      offset += t.end - t.start
      weightMap[t.name] = name
    }
    totalSize += offset
    let headerText = JSON.stringify(json)
    headerText += ' '.repeat((8 - (Buffer.byteLength(headerText) % 8)) % 8) // keep the data 8-byte aligned
    const headerBytes = Buffer.from(headerText)
    const length = Buffer.alloc(8)
    length.writeBigUInt64LE(BigInt(headerBytes.length))
    const content = new Blob([length, headerBytes, ...group.map((t) => file.slice(t.start, t.end))])
    return {path: name, content, size: content.size}
  })
  return {shards, index: {metadata: {total_size: totalSize}, weight_map: weightMap}}
}
