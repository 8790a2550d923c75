import {lpStream, type LengthPrefixedStream} from '@libp2p/utils'
import type {AbortOptions, Stream} from '@libp2p/interface'

/** Bulk bytes travel as length-prefixed chunks of at most this size, so no single read buffers a whole blob. */
export const CHUNK_BYTES = 1 << 20

/** Length-prefixed reader/writer whose frames may be at most maxFrameBytes (a larger prefix aborts the read). */
export function framed(stream: Stream, maxFrameBytes: number): LengthPrefixedStream<Stream> {
  // The read buffer must hold a frame plus what arrives while we copy it out; yamux's window bounds the rest.
  return lpStream(stream, {maxDataLength: maxFrameBytes, maxBufferSize: Math.max(4 * CHUNK_BYTES, 2 * maxFrameBytes)})
}

export async function writeJson(lp: LengthPrefixedStream<Stream>, value: unknown, options?: AbortOptions): Promise<void> {
  await lp.write(Buffer.from(JSON.stringify(value), 'utf8'), options)
}

/** Reads one length-prefixed JSON object (the frame bound is the stream's maxFrameBytes). */
export async function readJsonObject(lp: LengthPrefixedStream<Stream>, what: string, options?: AbortOptions): Promise<Record<string, unknown>> {
  const frame = await lp.read(options)
  let value: unknown
  try {
    value = JSON.parse(Buffer.from(frame.subarray()).toString('utf8'))
  } catch {
    throw new Error(`${what} is not JSON`)
  }
  if (typeof value !== 'object' || value === null || Array.isArray(value)) throw new Error(`${what} is not a JSON object`)
  return value as Record<string, unknown>
}

/** Writes bytes as CHUNK_BYTES frames (waiting for the stream to drain between them). */
export async function writeChunks(lp: LengthPrefixedStream<Stream>, bytes: Uint8Array, options?: AbortOptions & {pace?: (bytes: number) => Promise<void>}): Promise<void> {
  for (let offset = 0; offset < bytes.length; offset += CHUNK_BYTES) {
    const chunk = bytes.subarray(offset, Math.min(offset + CHUNK_BYTES, bytes.length))
    await options?.pace?.(chunk.length)
    await lp.write(chunk, options)
  }
}

/** The sender sent more bytes than it declared. */
export class OverrunError extends Error {}

/**
 * Reads exactly `size` bytes sent as chunks into `into` (at `offset`). A chunk that would overrun the declared
 * size is an error: the sender lied about the size.
 */
export async function readChunksInto(lp: LengthPrefixedStream<Stream>, into: Uint8Array, offset: number, size: number, options?: AbortOptions): Promise<void> {
  let filled = 0
  while (filled < size) {
    const chunk = await lp.read(options)
    if (chunk.byteLength === 0) throw new Error('empty chunk')
    if (filled + chunk.byteLength > size) throw new OverrunError(`sender sent more than the declared ${size} bytes`)
    let at = offset + filled
    for (const part of chunk) {
      into.set(part, at)
      at += part.byteLength
    }
    filled += chunk.byteLength
  }
}
