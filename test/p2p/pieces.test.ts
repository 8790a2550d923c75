import assert from 'node:assert/strict'
import {randomBytes} from 'node:crypto'
import {describe, it} from 'node:test'
import {encodePieceRequest, parsePieceRequest, PieceDownload, type PieceSession, type PieceSource} from '../../src/core/p2p/piece-fetch.js'
import {
  badBlockIn,
  BLOCK_BYTES,
  BLOCK_HASH_BYTES,
  blockCount,
  blockHashes,
  blocksRange,
  MAX_PIECE_BYTES,
  parseBlockList,
  resultCommitment,
  validPieceBytes,
} from '../../src/core/primitives/pieces.js'
import {seededRng} from '../helpers.js'

const PIECE = 2 * BLOCK_BYTES
/** 11.5 blocks: 6 pieces of 2 blocks, the last one short. */
const SIZE = 11 * BLOCK_BYTES + BLOCK_BYTES / 2

describe('result commitment: the root of a hash list of 64 KiB blocks', () => {
  it('is one 32-byte hex digest per content, bound to every byte and to the size', () => {
    const blob = randomBytes(SIZE)
    const c = resultCommitment(blob)
    assert.match(c, /^[0-9a-f]{64}$/)
    assert.equal(resultCommitment(Buffer.from(blob)), c)
    const flipped = Buffer.from(blob)
    flipped[SIZE - 1] ^= 1
    assert.notEqual(resultCommitment(flipped), c)
    assert.notEqual(resultCommitment(blob.subarray(0, SIZE - 1)), c)
    // Zero bytes past the end do not give the same commitment (the size is in the root).
    assert.notEqual(resultCommitment(Buffer.alloc(10)), resultCommitment(Buffer.alloc(11)))
    assert.match(resultCommitment(new Uint8Array(0)), /^[0-9a-f]{64}$/)
    assert.equal(blockHashes(blob).length, 12 * BLOCK_HASH_BYTES)
  })

  it('a hash list is accepted only when its root is the commitment, and checks each block of a piece', () => {
    const blob = randomBytes(SIZE)
    const commitment = resultCommitment(blob)
    const hashes = blockHashes(blob)
    const ok = parseBlockList(hashes, {size: SIZE, commitment})
    assert.ok(ok.ok)
    assert.match(String((parseBlockList(hashes.subarray(32), {size: SIZE, commitment}) as {reason: string}).reason), /not 12 block hashes/)
    const wrong = Buffer.from(hashes)
    wrong[40] ^= 1
    assert.match(String((parseBlockList(wrong, {size: SIZE, commitment}) as {reason: string}).reason), /does not match the commitment/)
    assert.equal(parseBlockList(hashes, {size: SIZE - 1, commitment}).ok, false, 'the size is part of the root')
    const list = ok.list
    const {start, end} = blocksRange(SIZE, 10, 2)
    assert.equal(end - start, BLOCK_BYTES * 1.5)
    assert.equal(badBlockIn(list, 10, 2, blob.subarray(start, end)), -1)
    const bad = Buffer.from(blob.subarray(start, end))
    bad[BLOCK_BYTES + 3] ^= 1
    assert.equal(badBlockIn(list, 10, 2, bad), 11)
    assert.equal(badBlockIn(list, 10, 2, blob.subarray(start, end - 1)), 10, 'a short piece is bad')
    assert.equal(badBlockIn(list, 11, 2, blob.subarray(start, end)), 11, 'past the last block')
  })

  it('piece sizes are whole blocks up to 8 MiB', () => {
    assert.ok(validPieceBytes(BLOCK_BYTES) && validPieceBytes(1 << 20) && validPieceBytes(MAX_PIECE_BYTES))
    for (const n of [0, BLOCK_BYTES - 1, BLOCK_BYTES + 1, MAX_PIECE_BYTES + BLOCK_BYTES, 1.5, Number.NaN]) assert.equal(validPieceBytes(n), false, String(n))
  })
})

/** A holder in memory: serves `blob` (and the hash list of `listOf`), optionally failing after some pieces. */
function holder(id: string, blob: Uint8Array, o: {listOf?: Uint8Array; dropAfter?: number; notThere?: boolean} = {}) {
  const asked: number[] = []
  let inFlight = 0
  let peak = 0
  let opened = 0
  const source: PieceSource = {
    id,
    open: async (wantList): Promise<PieceSession> => {
      await new Promise((r) => setTimeout(r, 1))
      if (o.notThere) throw new Error('does not hold it')
      opened++
      return {
        list: wantList ? blockHashes(o.listOf ?? blob) : undefined,
        piece: async (first, count, into) => {
          inFlight++
          peak = Math.max(peak, inFlight)
          try {
            await new Promise((r) => setTimeout(r, 2))
            if (o.dropAfter !== undefined && asked.length >= o.dropAfter) throw new Error('connection reset')
            asked.push(first)
            const {start, end} = blocksRange(blob.length, first, count)
            into.set(blob.subarray(start, end))
          } finally {
            inFlight--
          }
        },
        close: () => {},
        abort: () => {},
      }
    },
  }
  return {source, asked, peak: () => peak, opened: () => opened}
}

describe('piece scheduler (p2p/piece-fetch.ts)', () => {
  it('takes pieces from several holders at once, at most perSource outstanding on each', async () => {
    const blob = randomBytes(SIZE)
    const holders = ['a', 'b', 'c'].map((id) => holder(id, blob))
    const d = new PieceDownload(SIZE, resultCommitment(blob), PIECE)
    const outcomes = await d.run(
      holders.map((h) => h.source),
      {maxSources: 4, perSource: 2},
    )
    assert.ok(d.complete())
    assert.deepEqual(Buffer.from(d.bytes), blob)
    assert.equal(
      outcomes.reduce((n, o) => n + o.pieces, 0),
      6,
    )
    assert.ok(outcomes.every((o) => o.error === undefined && o.pieces > 0))
    for (const h of holders) assert.ok(h.peak() <= 2)
    assert.deepEqual([...d.piecesFrom.values()].sort(), outcomes.map((o) => o.pieces).sort())
  })

  it('a bad piece is blamed on the holder that sent it and fetched from another', async () => {
    const blob = randomBytes(SIZE)
    const corrupt = Buffer.from(blob)
    corrupt[3 * BLOCK_BYTES] ^= 0x80
    const liar = holder('liar', corrupt, {listOf: blob})
    const honest = holder('honest', blob)
    const d = new PieceDownload(SIZE, resultCommitment(blob), PIECE)
    // The liar alone first: it sends piece 0 (good), then piece 1 (bad: block 3).
    const first = await d.run([liar.source], {maxSources: 4, perSource: 1})
    assert.equal(d.complete(), false)
    assert.equal(first[0].bad, 'block 3 does not match its hash in the hash list')
    assert.equal(first[0].pieces, 1)
    assert.equal(d.badPieces, 1)
    const second = await d.run([honest.source], {maxSources: 4, perSource: 2})
    assert.ok(d.complete())
    assert.deepEqual(Buffer.from(d.bytes), blob)
    assert.equal(second[0].pieces, 5)
    assert.deepEqual(
      honest.asked.sort((x, y) => x - y),
      [2, 4, 6, 8, 10],
      'piece 0 is not fetched again',
    )
    assert.deepEqual(Object.fromEntries(d.piecesFrom), {liar: 1, honest: 5})
  })

  it('a holder whose hash list is not the commitment is blamed; the list is taken from the next', async () => {
    const blob = randomBytes(SIZE)
    const liar = holder('liar', blob, {listOf: randomBytes(SIZE)})
    const honest = holder('honest', blob)
    const d = new PieceDownload(SIZE, resultCommitment(blob), PIECE)
    const outcomes = await d.run([liar.source, honest.source], {maxSources: 1, perSource: 2})
    assert.ok(d.complete())
    assert.equal(outcomes[0].bad, 'hash list does not match the commitment')
    assert.equal(liar.asked.length, 0)
    assert.equal(outcomes[1].pieces, 6)
  })

  it('resumes after a dropped connection from the pieces already held', async () => {
    const blob = randomBytes(SIZE)
    const dropping = holder('dropping', blob, {dropAfter: 3})
    const gone = holder('gone', blob, {notThere: true})
    const d = new PieceDownload(SIZE, resultCommitment(blob), PIECE)
    const first = await d.run([dropping.source, gone.source], {maxSources: 4, perSource: 1})
    assert.equal(d.complete(), false)
    assert.equal(d.heldPieces(), 3)
    assert.match(String(first.find((o) => o.id === 'dropping')?.error), /connection reset/)
    assert.equal(first.find((o) => o.id === 'dropping')?.bad, undefined, 'a dropped connection is no fault')
    assert.match(String(first.find((o) => o.id === 'gone')?.error), /does not hold it/)
    // Later (the next pass), the same holder again: only the 3 missing pieces are asked for.
    const again = holder('dropping', blob)
    await d.run([again.source], {maxSources: 4, perSource: 2})
    assert.ok(d.complete())
    assert.deepEqual(Buffer.from(d.bytes), blob)
    assert.deepEqual(
      again.asked.sort((x, y) => x - y),
      [6, 8, 10],
    )
  })

  it('opens at most maxSources holders at once; the next starts when one stops', async () => {
    const blob = randomBytes(SIZE)
    const holders = Array.from({length: 6}, (_, i) => holder(`h${i}`, blob, {notThere: i < 2}))
    const d = new PieceDownload(SIZE, resultCommitment(blob), PIECE)
    const outcomes = await d.run(
      holders.map((h) => h.source),
      {maxSources: 2, perSource: 1},
    )
    assert.ok(d.complete())
    // h0 and h1 do not hold it; h2 and h3 take their places and fetch every piece; h4 and h5 are never opened.
    assert.deepEqual(
      outcomes.map((o) => o.id),
      ['h0', 'h1', 'h2', 'h3'],
    )
    assert.equal(holders[4].opened() + holders[5].opened(), 0)
  })
})

it('fuzz: random and mutated hash lists and piece requests never throw, and only valid ones are accepted', () => {
  const seed = Number(process.env.FUZZ_SEED ?? Date.now() % 0xffffffff)
  const next = seededRng(seed)
  const blob = randomBytes(SIZE)
  const commitment = resultCommitment(blob)
  const hashes = Buffer.from(blockHashes(blob))
  const blocks = blockCount(SIZE)
  const randomBuf = (n: number) => Buffer.from(Array.from({length: n}, () => next() & 0xff))
  const mutate = (b: Buffer): Buffer => {
    switch (next() % 5) {
      case 0: {
        const c = Buffer.from(b)
        if (c.length) c[next() % c.length] ^= 1 << (next() % 8)
        return c
      }
      case 1:
        return b.subarray(0, next() % (b.length + 1))
      case 2:
        return Buffer.concat([b, randomBuf(next() % 64)])
      case 3:
        return randomBuf(next() % 600)
      default:
        return Buffer.from(b)
    }
  }
  let accepted = 0
  for (let i = 0; i < 3000; i++) {
    const bytes = mutate(hashes)
    const size = next() % 8 === 0 ? next() % (2 * SIZE) : SIZE
    let r: ReturnType<typeof parseBlockList>
    try {
      r = parseBlockList(bytes, {size, commitment})
    } catch (error) {
      assert.fail(`seed ${seed}: parseBlockList threw ${String(error)}`)
    }
    if (r.ok) {
      accepted++
      assert.ok(bytes.equals(hashes) && size === SIZE, `seed ${seed}: accepted a list that is not the real one`)
    } else assert.ok(r.reason.length > 0)
  }
  assert.ok(accepted > 0, `seed ${seed}: the unmutated list was never tried`)
  for (let i = 0; i < 3000; i++) {
    const valid = encodePieceRequest(next() % blocks, 1 + (next() % 2))
    const bytes = next() % 3 === 0 ? randomBuf(next() % 12) : mutate(Buffer.from(valid))
    let r: ReturnType<typeof parsePieceRequest>
    try {
      r = parsePieceRequest(bytes, blocks)
    } catch (error) {
      assert.fail(`seed ${seed}: parsePieceRequest threw ${String(error)}`)
    }
    if (r.ok) {
      assert.equal(bytes.length, 8)
      assert.ok(r.count >= 1 && r.count <= MAX_PIECE_BYTES / BLOCK_BYTES && r.first + r.count <= blocks, `seed ${seed}: accepted ${r.first}+${r.count}`)
      assert.deepEqual(Buffer.from(encodePieceRequest(r.first, r.count)), bytes)
    } else assert.ok(r.reason.length > 0)
  }
})
