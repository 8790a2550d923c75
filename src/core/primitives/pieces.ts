import * as crypto from 'node:crypto'

/**
 * A result's commitment and its hash list. A result is cut into blocks of BLOCK_BYTES (the last one shorter); each
 * block has a hash, and the commitment is the root over the result's size and the blocks' hashes in order. The block
 * size is fixed by the protocol, so one content has exactly one commitment (copy and replay detection compare
 * commitments). A fetcher gets the hash list from any holder, checks it against the commitment, then fetches pieces
 * (runs of whole blocks: join --piece-bytes) from several holders at once and checks each on arrival
 * (p2p/piece-fetch.ts). The one function that computes a commitment is `resultCommitment`: the announcement,
 * witnesses' blooms, copy detection and the Solana side compare its 32-byte hex digest as they compared a blob's
 * SHA-256 before. Pure.
 */

/** The hash list's block: a hash list is 1/2048 of the result it describes. */
export const BLOCK_BYTES = 1 << 16
export const BLOCK_HASH_BYTES = 32
/** A piece (what one request fetches) is whole blocks, at most this many bytes: what a bad sender wastes at once. */
export const MAX_PIECE_BYTES = 1 << 23
/** Default piece size (join --piece-bytes). */
export const DEFAULT_PIECE_BYTES = 1 << 20

const BLOCK_DOMAIN = Buffer.from('psyche/result-block/1\0', 'utf8')
const ROOT_DOMAIN = Buffer.from('psyche/result-blocks/1\0', 'utf8')

/** A piece size is whole blocks, from one block to MAX_PIECE_BYTES. */
export function validPieceBytes(pieceBytes: number): boolean {
  return Number.isSafeInteger(pieceBytes) && pieceBytes >= BLOCK_BYTES && pieceBytes <= MAX_PIECE_BYTES && pieceBytes % BLOCK_BYTES === 0
}

/** How many blocks a result of `size` bytes has (an empty result has none). */
export function blockCount(size: number): number {
  return Math.ceil(size / BLOCK_BYTES)
}

/** The hash of one block's bytes (domain-tagged SHA-256, so a block never hashes to some list's root). */
function blockHash(bytes: Uint8Array): Buffer {
  return crypto.createHash('sha256').update(BLOCK_DOMAIN).update(bytes).digest()
}

/** The hash list of a result: each block's hash, in order, concatenated. */
export function blockHashes(blob: Uint8Array): Uint8Array {
  const count = blockCount(blob.length)
  const out = Buffer.alloc(count * BLOCK_HASH_BYTES)
  for (let i = 0; i < count; i++) blockHash(blob.subarray(i * BLOCK_BYTES, Math.min(blob.length, (i + 1) * BLOCK_BYTES))).copy(out, i * BLOCK_HASH_BYTES)
  return out
}

/** The root of a hash list (hex): what an announcement commits to. */
function listRoot(size: number, hashes: Uint8Array): string {
  const header = Buffer.alloc(8)
  header.writeBigUInt64BE(BigInt(size), 0)
  return crypto.createHash('sha256').update(ROOT_DOMAIN).update(header).update(hashes).digest('hex')
}

/** A result's commitment: the root of its hash list. Every place that commits to a result calls this. */
export function resultCommitment(blob: Uint8Array): string {
  return listRoot(blob.length, blockHashes(blob))
}

/** A checked hash list: block `i`'s hash is hashes[32i .. 32i + 32). */
export interface BlockList {
  size: number
  hashes: Uint8Array
}

/**
 * Checks a hash list a peer sent for a result of the announced `size` and `commitment`: exactly one hash per block,
 * and their root equal to the commitment. Returns the list, or the reason it is refused. Never throws.
 */
export function parseBlockList(bytes: Uint8Array, expected: {size: number; commitment: string}): {ok: true; list: BlockList} | {ok: false; reason: string} {
  const count = blockCount(expected.size)
  if (bytes.length !== count * BLOCK_HASH_BYTES) return {ok: false, reason: `hash list of ${bytes.length} bytes, not ${count} block hashes of ${BLOCK_HASH_BYTES} bytes`}
  if (listRoot(expected.size, bytes) !== expected.commitment) return {ok: false, reason: 'hash list does not match the commitment'}
  return {ok: true, list: {size: expected.size, hashes: Uint8Array.from(bytes)}}
}

/** Where a run of blocks lies in the result: [start, end) in bytes. */
export function blocksRange(size: number, first: number, count: number): {start: number; end: number} {
  return {start: Math.min(size, first * BLOCK_BYTES), end: Math.min(size, (first + count) * BLOCK_BYTES)}
}

/** Whether `bytes` are blocks first .. first + count - 1 of a checked list (the index of the first that is not, else -1). */
export function badBlockIn(list: BlockList, first: number, count: number, bytes: Uint8Array): number {
  const {start, end} = blocksRange(list.size, first, count)
  if (first < 0 || count < 1 || first + count > blockCount(list.size) || bytes.length !== end - start) return Math.max(0, first)
  for (let i = 0; i < count; i++) {
    const block = bytes.subarray(i * BLOCK_BYTES, Math.min(bytes.length, (i + 1) * BLOCK_BYTES))
    const want = list.hashes.subarray((first + i) * BLOCK_HASH_BYTES, (first + i + 1) * BLOCK_HASH_BYTES)
    if (!blockHash(block).equals(want)) return first + i
  }
  return -1
}
