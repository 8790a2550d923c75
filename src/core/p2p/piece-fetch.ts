import type {Stream} from '@libp2p/interface'
import type {LengthPrefixedStream} from '@libp2p/utils'
import {badBlockIn, BLOCK_BYTES, BLOCK_HASH_BYTES, blockCount, blocksRange, MAX_PIECE_BYTES, parseBlockList, type BlockList} from '../primitives/pieces.js'
import {OverrunError, readChunksInto, writeChunks} from './framing.js'
import {abortStream, deadline} from './util.js'

/**
 * Swarmed result downloads, piece by piece (the owner of pieces on the wire; the hash list and the commitment are
 * primitives/pieces.ts). A piece is a run of the hash list's blocks, `pieceBytes` long (join --piece-bytes). A
 * fetcher opens a session with each of up to `maxSources` holders at once, gets the hash list from the first (checked
 * against the commitment), and asks each holder for pieces, `perSource` at a time on one stream (pipelined: requests
 * go ahead, answers come back in order). Each piece is checked on arrival, block by block: a bad one is blamed on the
 * holder that sent it (its session ends, it is not asked again) and fetched from another. What arrived is kept in the
 * PieceDownload, so a download that failed resumes from the pieces already held.
 *
 * The session on the wire (after the result exchange's request and `ok` header, and the hash list if asked,
 * result-exchange.ts): the fetcher writes a piece request per piece (u32 big-endian first block, u32 block count); the
 * holder answers each, in order, with those blocks' bytes as CHUNK_BYTES frames. A holder serves each block at most
 * once per session, at most MAX_PIECE_BYTES per request; the fetcher ends the session by closing its side.
 */

/** Holders one download takes pieces from at once. */
export const MAX_SOURCES_PER_FETCH = 4
/** Piece requests outstanding on one holder's session (what one peer can keep us waiting on). */
export const PIECES_IN_FLIGHT_PER_PEER = 2
const PIECE_REQUEST_BYTES = 8
const MAX_BLOCKS_PER_REQUEST = MAX_PIECE_BYTES / BLOCK_BYTES

/** A holder's session: its hash list (unchecked; when asked for), and its pieces. */
export interface PieceSession {
  list?: Uint8Array
  /** Reads blocks first .. first + count - 1 into `into` (their exact length). Calls may overlap: they are answered in the order made. */
  piece(first: number, count: number, into: Uint8Array): Promise<void>
  /** Ends the session (we want nothing more from it). */
  close(): void
  abort(error: Error): void
}

/** A holder to fetch from: `open` throws when it does not hold the result, is busy, or cannot be reached. */
export interface PieceSource {
  id: string
  open(wantList: boolean): Promise<PieceSession>
}

/** The holder sent something that cannot be right (a bad piece or hash list, a wrong size): it is not asked again. */
export class BadSourceError extends Error {}

/** What one holder did in one run: pieces it sent that checked, and why it stopped (bad: blamed). */
interface SourceOutcome {
  id: string
  pieces: number
  bytes: number
  error?: unknown
  bad?: string
}

/** Wakes the lanes waiting for a piece to be released or finished. */
class Changed {
  private waiters: (() => void)[] = []
  wait(): Promise<void> {
    return new Promise((resolve) => this.waiters.push(resolve))
  }
  notify(): void {
    const waiters = this.waiters
    this.waiters = []
    for (const w of waiters) w()
  }
}

/**
 * One result being fetched in pieces: its bytes so far, which pieces are held and which are being fetched. Kept
 * across `run`s (a failed one, with every holder that was tried, is resumed by the next).
 */
export class PieceDownload {
  readonly bytes: Uint8Array
  list: BlockList | undefined
  private readonly held: Uint8Array
  private heldCount = 0
  private readonly blocksPerPiece: number
  private readonly blocks: number
  private readonly taken = new Set<number>()
  private readonly changed = new Changed()
  /** Pieces that arrived and checked, per holder, over every run. */
  readonly piecesFrom = new Map<string, number>()
  badPieces = 0

  /** `pieceBytes`: whole blocks (primitives/pieces.ts validPieceBytes). */
  constructor(
    readonly size: number,
    readonly commitment: string,
    pieceBytes: number,
  ) {
    this.bytes = new Uint8Array(size)
    this.blocksPerPiece = Math.max(1, Math.min(MAX_BLOCKS_PER_REQUEST, Math.floor(pieceBytes / BLOCK_BYTES)))
    this.blocks = blockCount(size)
    this.held = new Uint8Array(Math.ceil(this.blocks / this.blocksPerPiece))
  }

  complete(): boolean {
    return this.list !== undefined && this.heldCount === this.held.length
  }

  /** Pieces held so far. */
  heldPieces(): number {
    return this.heldCount
  }

  /** The lowest piece neither held nor being fetched, now taken; undefined if none. */
  private take(): number | undefined {
    for (let i = 0; i < this.held.length; i++)
      if (!this.held[i] && !this.taken.has(i)) {
        this.taken.add(i)
        return i
      }
    return undefined
  }

  private release(index: number, got: boolean): void {
    this.taken.delete(index)
    if (got && !this.held[index]) {
      this.held[index] = 1
      this.heldCount++
    }
    this.changed.notify()
  }

  /**
   * Fetches the missing pieces from these holders, in their order, at most `maxSources` at once (the next is opened
   * when one stops), each with `perSource` requests outstanding. Resolves when the result is complete or every holder
   * stopped; never rejects. Returns what each holder asked did.
   */
  async run(sources: readonly PieceSource[], o: {maxSources: number; perSource: number; stopped?: () => boolean}): Promise<SourceOutcome[]> {
    const outcomes: SourceOutcome[] = []
    let next = 0
    const worker = async () => {
      while (!this.complete() && next < sources.length && !o.stopped?.()) {
        const source = sources[next++]
        const outcome: SourceOutcome = {id: source.id, pieces: 0, bytes: 0}
        outcomes.push(outcome)
        try {
          await this.useSource(source, Math.max(1, o.perSource), outcome)
        } catch (error) {
          outcome.error = error
          if (error instanceof BadSourceError) outcome.bad = error.message
        }
      }
    }
    await Promise.all(Array.from({length: Math.max(1, Math.min(o.maxSources, sources.length))}, worker))
    return outcomes
  }

  private async useSource(source: PieceSource, perSource: number, outcome: SourceOutcome): Promise<void> {
    const session = await source.open(this.list === undefined)
    let failure: Error | undefined
    try {
      if (session.list !== undefined || this.list === undefined) {
        if (session.list === undefined) throw new BadSourceError('sent no hash list')
        const parsed = parseBlockList(session.list, {size: this.size, commitment: this.commitment})
        if (!parsed.ok) throw new BadSourceError(parsed.reason)
        this.list ??= parsed.list
      }
      const list = this.list
      const lane = async () => {
        while (failure === undefined) {
          const index = this.take()
          if (index === undefined) {
            // Nothing left to ask for: done, unless a piece another holder is fetching comes back unfetched.
            if (this.complete() || this.taken.size === 0) return
            await this.changed.wait()
            continue
          }
          const first = index * this.blocksPerPiece
          const count = Math.min(this.blocksPerPiece, this.blocks - first)
          const {start, end} = blocksRange(this.size, first, count)
          const into = this.bytes.subarray(start, end)
          let got = false
          try {
            await session.piece(first, count, into)
            const bad = badBlockIn(list, first, count, into)
            if (bad >= 0) {
              this.badPieces++
              throw new BadSourceError(`block ${bad} does not match its hash in the hash list`)
            }
            got = true
            outcome.pieces++
            outcome.bytes += into.length
            this.piecesFrom.set(source.id, (this.piecesFrom.get(source.id) ?? 0) + 1)
          } finally {
            this.release(index, got)
          }
        }
      }
      await Promise.all(
        Array.from({length: perSource}, () =>
          lane().catch((error: unknown) => {
            if (failure === undefined) {
              failure = error instanceof Error ? error : new Error(String(error))
              session.abort(failure)
            }
          }),
        ),
      )
      if (failure !== undefined) throw failure
      session.close()
    } catch (error) {
      if (failure === undefined) session.abort(error instanceof Error ? error : new Error(String(error)))
      throw error
    }
  }
}

export function encodePieceRequest(first: number, count: number): Uint8Array {
  const out = Buffer.alloc(PIECE_REQUEST_BYTES)
  out.writeUInt32BE(first, 0)
  out.writeUInt32BE(count, 4)
  return out
}

/**
 * Parses a piece request from a fetcher: a run of 1 to MAX_PIECE_BYTES / BLOCK_BYTES blocks within a result of
 * `blocks` blocks. Never throws.
 */
export function parsePieceRequest(bytes: Uint8Array, blocks: number): {ok: true; first: number; count: number} | {ok: false; reason: string} {
  if (bytes.length !== PIECE_REQUEST_BYTES) return {ok: false, reason: `piece request of ${bytes.length} bytes, not ${PIECE_REQUEST_BYTES}`}
  const buf = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length)
  const first = buf.readUInt32BE(0)
  const count = buf.readUInt32BE(4)
  if (count < 1 || count > MAX_BLOCKS_PER_REQUEST) return {ok: false, reason: `piece of ${count} blocks, not 1..${MAX_BLOCKS_PER_REQUEST}`}
  if (first >= blocks || count > blocks - first) return {ok: false, reason: `blocks ${first}..${first + count - 1} of a result of ${blocks} blocks`}
  return {ok: true, first, count}
}

/** The hash list's length for a result of `size` bytes: the frame bound for reading one. */
export function blockListBytes(size: number): number {
  return blockCount(size) * BLOCK_HASH_BYTES
}

/** The fetcher's side of a session on a stream (after the `ok` header and the hash list, if asked). */
export class WirePieceSession implements PieceSession {
  private reading: Promise<void> = Promise.resolve()
  private writing: Promise<void> = Promise.resolve()
  private broken: Error | undefined

  constructor(
    private readonly stream: Stream,
    private readonly lp: LengthPrefixedStream<Stream>,
    readonly list: Uint8Array | undefined,
    private readonly o: {timeoutMs: number; onBytes: (bytes: number) => void},
  ) {}

  piece(first: number, count: number, into: Uint8Array): Promise<void> {
    const signal = deadline(this.o.timeoutMs)
    const write = this.writing.then(() => {
      if (this.broken) throw this.broken
      return this.lp.write(encodePieceRequest(first, count), {signal})
    })
    this.writing = write.catch(() => {})
    const read = Promise.all([write, this.reading]).then(async () => {
      if (this.broken) throw this.broken
      try {
        await readChunksInto(this.lp, into, 0, into.length, {signal})
      } catch (error) {
        // A later answer must not be read from where this one stopped: the session ends here.
        const e = error instanceof OverrunError ? new BadSourceError(error.message) : error instanceof Error ? error : new Error(String(error))
        this.abort(e)
        throw e
      }
      this.o.onBytes(into.length)
    })
    this.reading = read.catch(() => {})
    return read
  }

  close(): void {
    const signal = deadline(this.o.timeoutMs)
    void this.stream.close({signal}).catch((error: unknown) => abortStream(this.stream, error))
  }

  abort(error: Error): void {
    this.broken ??= error
    abortStream(this.stream, error)
  }
}

/**
 * The holder's side of a session: answers piece requests until the fetcher closes its side, each (its wait for the
 * request, and its bytes) within `timeoutMs`. A request that is not a run of this result's blocks, or that asks a
 * block again, ends the session with an error: a session serves the result at most once.
 */
export async function servePieces(lp: LengthPrefixedStream<Stream>, stream: Stream, blob: Uint8Array, o: {timeoutMs: number; onPiece: (bytes: number) => void}): Promise<void> {
  const blocks = blockCount(blob.length)
  const served = new Uint8Array(blocks)
  for (;;) {
    const options = {signal: deadline(o.timeoutMs)}
    let frame: Uint8Array
    try {
      frame = (await lp.read(options)).subarray()
    } catch (error) {
      // The fetcher closed its side: the session is over.
      if (stream.readStatus !== 'readable' || (error instanceof Error && error.name === 'UnexpectedEOFError')) return
      throw error
    }
    const parsed = parsePieceRequest(frame, blocks)
    if (!parsed.ok) throw new Error(parsed.reason)
    const {first, count} = parsed
    for (let i = first; i < first + count; i++) {
      if (served[i]) throw new Error(`block ${i} asked twice`)
      served[i] = 1
    }
    const {start, end} = blocksRange(blob.length, first, count)
    await writeChunks(lp, blob.subarray(start, end), options)
    o.onPiece(end - start)
  }
}
