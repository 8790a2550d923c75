import {endianness} from 'node:os'
import {FrameReader} from '../protocol/frames.js'
import {decodeTokens} from './token-file.js'

const littleEndianHost = endianness() === 'LE'

/**
 * The TCP data server's wire format. Every frame is `u32 LE body length` then the body: `u8 type` and a
 * payload. All integers are little-endian; token ids travel as raw uint32 bytes, never as JSON numbers.
 *
 * client → server  HELLO    'PSDS' u16 version u32 seqLen
 *                  GET      u32 requestId u8 flags(bit 0: wrap) u32 count, count × u64 batchId
 * server → client  INFO     u16 version u32 seqLen u64 numSamples u32 vocabSize (0: unknown)
 *                  SAMPLES  u32 requestId u32 rows u32 rowLength, rows × rowLength × u32 id
 *                  ERROR    u32 requestId (NO_REQUEST: about the connection) utf8 message
 */
export const WIRE_VERSION = 1
const MAGIC = 'PSDS'
export const NO_REQUEST = 0xffffffff

const enum FrameType {
  Hello = 0x01,
  Get = 0x02,
  Info = 0x81,
  Samples = 0x82,
  Error = 0xff,
}

/** Bounds: a request frame (GET of MAX_BATCH_IDS ids fits), a response frame, an error message. */
export const MAX_BATCH_IDS = 4096
export const MAX_REQUEST_BYTES = 64 * 1024
export const MAX_RESPONSE_BYTES = 256 * 1024 * 1024
const MAX_ERROR_BYTES = 2048

/** A malformed or oversized frame. */
class WireError extends Error {}

type ClientMessage = {type: 'hello'; version: number; seqLen: number} | {type: 'get'; requestId: number; wrap: boolean; batchIds: number[]}

export type ServerMessage =
  | {type: 'info'; version: number; seqLen: number; numSamples: number; vocabSize: number | undefined}
  | {type: 'samples'; requestId: number; rows: number; rowLength: number; ids: Uint32Array}
  | {type: 'error'; requestId: number; message: string}

/**
 * Splits a byte stream into frame bodies (the protocol's one u32-LE frame reader, protocol/frames.ts), refusing
 * any frame longer than `maxBody` before buffering it. An empty or oversized frame throws a WireError, then and
 * on every later push: the stream cannot be re-synchronised.
 */
export class FrameDecoder {
  private readonly reader: FrameReader
  private failed: WireError | undefined

  constructor(private readonly maxBody: number) {
    this.reader = new FrameReader(maxBody)
  }

  /** Bytes received but not yet forming a whole frame, and the size of the frame they start (if known). */
  get partial(): {have: number; need: number | undefined} {
    return {have: this.reader.pending, need: this.reader.nextFrameBytes}
  }

  push(chunk: Buffer): Buffer[] {
    if (this.failed) throw this.failed
    const frames: Buffer[] = []
    for (const frame of this.reader.push(chunk)) {
      if (!frame.ok) throw (this.failed = new WireError(`frame of ${frame.length} bytes (allowed: 1 to ${this.maxBody})`))
      frames.push(frame.body)
    }
    return frames
  }
}

function frame(type: FrameType, payloadLength: number, write: (body: Buffer) => void): Buffer {
  const out = Buffer.alloc(5 + payloadLength)
  out.writeUInt32LE(1 + payloadLength, 0)
  out[4] = type
  write(out.subarray(5))
  return out
}

export function encodeHello(seqLen: number): Buffer {
  return frame(FrameType.Hello, 10, (p) => {
    p.write(MAGIC, 0, 'latin1')
    p.writeUInt16LE(WIRE_VERSION, 4)
    p.writeUInt32LE(seqLen, 6)
  })
}

export function encodeGet(requestId: number, batchIds: readonly number[], wrap: boolean): Buffer {
  return frame(FrameType.Get, 9 + 8 * batchIds.length, (p) => {
    p.writeUInt32LE(requestId, 0)
    p[4] = wrap ? 1 : 0
    p.writeUInt32LE(batchIds.length, 5)
    batchIds.forEach((id, i) => p.writeBigUInt64LE(BigInt(id), 9 + 8 * i))
  })
}

export function encodeInfo(seqLen: number, numSamples: number, vocabSize: number | undefined): Buffer {
  return frame(FrameType.Info, 18, (p) => {
    p.writeUInt16LE(WIRE_VERSION, 0)
    p.writeUInt32LE(seqLen, 2)
    p.writeBigUInt64LE(BigInt(numSamples), 6)
    p.writeUInt32LE(vocabSize ?? 0, 14)
  })
}

export function encodeSamples(requestId: number, rowLength: number, ids: Uint32Array): Buffer {
  return frame(FrameType.Samples, 12 + ids.byteLength, (p) => {
    p.writeUInt32LE(requestId, 0)
    p.writeUInt32LE(ids.length / rowLength, 4)
    p.writeUInt32LE(rowLength, 8)
    if (littleEndianHost) {
      Buffer.from(ids.buffer, ids.byteOffset, ids.byteLength).copy(p, 12)
    } else {
      for (let i = 0; i < ids.length; i++) p.writeUInt32LE(ids[i], 12 + i * 4)
    }
  })
}

export function encodeError(requestId: number, message: string): Buffer {
  const text = Buffer.from(message, 'utf8').subarray(0, MAX_ERROR_BYTES)
  return frame(FrameType.Error, 4 + text.length, (p) => {
    p.writeUInt32LE(requestId, 0)
    text.copy(p, 4)
  })
}

function need(body: Buffer, length: number, what: string): void {
  if (body.length !== length) throw new WireError(`${what} frame of ${body.length} bytes, expected ${length}`)
}

export function decodeClientMessage(body: Buffer): ClientMessage {
  switch (body[0]) {
    case FrameType.Hello: {
      need(body, 11, 'HELLO')
      if (body.toString('latin1', 1, 5) !== MAGIC) throw new WireError('HELLO without the PSDS magic')
      return {type: 'hello', version: body.readUInt16LE(5), seqLen: body.readUInt32LE(7)}
    }
    case FrameType.Get: {
      if (body.length < 10) throw new WireError(`GET frame of ${body.length} bytes is too short`)
      const count = body.readUInt32LE(6)
      if (count === 0 || count > MAX_BATCH_IDS) throw new WireError(`GET of ${count} batch ids (allowed: 1 to ${MAX_BATCH_IDS})`)
      need(body, 10 + 8 * count, 'GET')
      const flags = body[5]
      if (flags > 1) throw new WireError(`GET with unknown flags ${flags}`)
      const batchIds: number[] = []
      for (let i = 0; i < count; i++) {
        const id = body.readBigUInt64LE(10 + 8 * i)
        if (id > BigInt(Number.MAX_SAFE_INTEGER)) throw new WireError(`batch id ${id} is too large`)
        batchIds.push(Number(id))
      }
      return {type: 'get', requestId: body.readUInt32LE(1), wrap: flags === 1, batchIds}
    }
    default:
      throw new WireError(`unknown client frame type ${body[0]}`)
  }
}

export function decodeServerMessage(body: Buffer): ServerMessage {
  switch (body[0]) {
    case FrameType.Info: {
      need(body, 19, 'INFO')
      const numSamples = body.readBigUInt64LE(7)
      if (numSamples > BigInt(Number.MAX_SAFE_INTEGER)) throw new WireError(`INFO with ${numSamples} samples`)
      const vocabSize = body.readUInt32LE(15)
      return {type: 'info', version: body.readUInt16LE(1), seqLen: body.readUInt32LE(3), numSamples: Number(numSamples), vocabSize: vocabSize || undefined}
    }
    case FrameType.Samples: {
      if (body.length < 13) throw new WireError(`SAMPLES frame of ${body.length} bytes is too short`)
      const rows = body.readUInt32LE(5)
      const rowLength = body.readUInt32LE(9)
      if (rows * rowLength * 4 !== body.length - 13) throw new WireError(`SAMPLES says ${rows}×${rowLength} ids but carries ${body.length - 13} bytes`)
      const ids = new Uint32Array(rows * rowLength)
      decodeTokens(body.subarray(13), 4, ids, 0)
      return {type: 'samples', requestId: body.readUInt32LE(1), rows, rowLength, ids}
    }
    case FrameType.Error: {
      if (body.length < 5) throw new WireError(`ERROR frame of ${body.length} bytes is too short`)
      return {type: 'error', requestId: body.readUInt32LE(1), message: body.toString('utf8', 5)}
    }
    default:
      throw new WireError(`unknown server frame type ${body[0]}`)
  }
}
