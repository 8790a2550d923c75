/**
 * Framing of the coordinator protocol over a byte stream: each frame is `u32 LE length` then that
 * many bytes. The length is checked against a maximum before anything is buffered, so a peer cannot
 * make us hold more than one frame's worth of memory.
 */
export const DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024
export const FRAME_HEADER_BYTES = 4

export function encodeFrame(body: Uint8Array): Buffer {
  const head = Buffer.allocUnsafe(FRAME_HEADER_BYTES)
  head.writeUInt32LE(body.length, 0)
  return Buffer.concat([head, body])
}

type FrameEvent =
  | {ok: true; body: Buffer}
  /** `fatal`: the stream cannot be resynchronised (its length prefix is unusable); close the connection. */
  | {ok: false; reason: 'oversized' | 'empty'; detail: string; fatal: boolean; length: number}

/** Splits a byte stream into frames. After a fatal event it ignores everything that follows. */
export class FrameReader {
  private chunks: Buffer[] = []
  private buffered = 0
  private dead = false

  /** May be raised mid-stream (e.g. once a peer has identified itself); checked as each frame starts. */
  constructor(public maxFrameBytes = DEFAULT_MAX_FRAME_BYTES) {}

  /** Bytes held that do not yet form a whole frame. */
  get pending(): number {
    return this.buffered
  }

  /** Size (header included) of the frame the held bytes start, once its length prefix is here. */
  get nextFrameBytes(): number | undefined {
    return this.buffered >= FRAME_HEADER_BYTES ? FRAME_HEADER_BYTES + this.peekLength() : undefined
  }

  push(chunk: Uint8Array): FrameEvent[] {
    if (this.dead || chunk.length === 0) return []
    this.chunks.push(Buffer.from(chunk.buffer, chunk.byteOffset, chunk.length))
    this.buffered += chunk.length
    const out: FrameEvent[] = []
    while (this.buffered >= FRAME_HEADER_BYTES) {
      const length = this.peekLength()
      if (length > this.maxFrameBytes) {
        this.dead = true
        this.chunks = []
        this.buffered = 0
        out.push({ok: false, reason: 'oversized', detail: `frame of ${length} bytes exceeds the ${this.maxFrameBytes}-byte limit`, fatal: true, length})
        break
      }
      if (this.buffered < FRAME_HEADER_BYTES + length) break
      const frame = this.take(FRAME_HEADER_BYTES + length).subarray(FRAME_HEADER_BYTES)
      out.push(length === 0 ? {ok: false, reason: 'empty', detail: 'empty frame', fatal: false, length} : {ok: true, body: frame})
    }
    return out
  }

  private peekLength(): number {
    if (this.chunks[0].length < FRAME_HEADER_BYTES) this.chunks = [Buffer.concat(this.chunks)]
    return this.chunks[0].readUInt32LE(0)
  }

  private take(n: number): Buffer {
    let out: Buffer
    if (this.chunks[0].length >= n) {
      out = this.chunks[0].subarray(0, n)
      if (this.chunks[0].length === n) this.chunks.shift()
      else this.chunks[0] = this.chunks[0].subarray(n)
    } else {
      const all = Buffer.concat(this.chunks)
      out = all.subarray(0, n)
      this.chunks = all.length > n ? [all.subarray(n)] : []
    }
    this.buffered -= n
    return out
  }
}
