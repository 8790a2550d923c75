import assert from 'node:assert/strict'
import {test} from 'node:test'
import {signAnnouncement} from '../../src/core/primitives/announcement.js'
import {resultCommitment} from '../../src/core/primitives/pieces.js'
import {identityFromSeed} from '../../src/core/protocol/identity.js'
import {COPY_OVERLAP_THRESHOLD, indexOverlap, indexSample, nearCopies, sampleStride, OVERLAP_SAMPLE_CHUNKS} from '../../src/core/verify/copy.js'
import {ResultIntake} from '../../src/core/verify/intake.js'
import {resultIndices, validateResult, type ResultFormat} from '../../src/core/verify/result.js'

// Two tensors of 4 chunks of 8 elements, top-2 per chunk, sign values.
const format: ResultFormat = {
  value_format: 'sign',
  tensors: [
    {name: 'a', shape: [32], chunk: [8], topk: 2},
    {name: 'b', shape: [32], chunk: [8], topk: 2},
  ],
}

/** A sign-format result (distro_codec's layout) with the given per-chunk index pairs for each tensor. */
function encode(chunks: [number, number][][], signs = 0): Buffer {
  const parts = [Buffer.from('PSDR', 'latin1'), Buffer.from([1, 0]), Buffer.from([format.tensors.length, 0, 0, 0])]
  for (const [t, spec] of format.tensors.entries()) {
    parts.push(Buffer.from([spec.name.length, 0]), Buffer.from(spec.name), Buffer.from([1, 32, 0, 0, 0, 8, 0, 0, 0, 2, 0, 0, 0]))
    // 8 indices of 3 bits, LSB-first: 3 bytes.
    let bits = 0n
    chunks[t].flat().forEach((index, i) => (bits |= BigInt(index) << BigInt(3 * i)))
    parts.push(Buffer.from([Number(bits & 0xffn), Number((bits >> 8n) & 0xffn), Number((bits >> 16n) & 0xffn)]), Buffer.from([signs]))
  }
  return Buffer.concat(parts)
}

const A: [number, number][][] = [
  [
    [0, 1],
    [2, 3],
    [4, 5],
    [6, 7],
  ],
  [
    [1, 2],
    [3, 4],
    [5, 6],
    [7, 0],
  ],
]
const B: [number, number][][] = A.map((t) => t.map(([x, y]) => [(x + 4) % 8, (y + 4) % 8] as [number, number]))

test('the hand-encoded results are valid; resultIndices reads every chunk, or every stride-th chunk across tensors', () => {
  const a = encode(A)
  assert.deepEqual(validateResult(a, format), {ok: true})
  assert.equal(resultIndices(a, format).size, 16)
  // Stride 3 over 8 chunks (4 per tensor): global chunks 0, 3, 6 = tensor a chunks 0 and 3, tensor b chunk 2.
  assert.deepEqual(
    [...resultIndices(a, format, 3)].sort((x, y) => x - y),
    [0, 1, 3 * 8 + 6, 3 * 8 + 7, 32 + 2 * 8 + 5, 32 + 2 * 8 + 6],
  )
  assert.equal(sampleStride(format), 1)
  const big: ResultFormat = {value_format: 'sign', tensors: [{name: 'w', shape: [OVERLAP_SAMPLE_CHUNKS * 64], chunk: [8], topk: 2}]}
  assert.equal(sampleStride(big), 8)
})

test('index overlap: a copy with other values overlaps fully, other indices do not, a partial copy in between', () => {
  const a = indexSample(encode(A), format)
  assert.equal(indexOverlap(a, indexSample(encode(A, 0xff), format)), 1)
  assert.equal(indexOverlap(a, indexSample(encode(B), format)), 0)
  const half = A.map((t, i) => (i === 0 ? t : B[1]))
  assert.equal(indexOverlap(a, indexSample(encode(half), format)), 0.5)
  assert.equal(indexOverlap(new Set(), a), 0)
})

test('nearCopies: in list order, a result overlapping an earlier one at the threshold is dropped, the same every time', () => {
  const results = [
    {client_id: 'p1', bytes: encode(A)},
    {client_id: 'p2', bytes: encode(B)},
    {client_id: 'p3', bytes: encode(A, 0x0f)},
    {client_id: 'p4', bytes: encode(B, 0xf0)},
  ]
  const copies = nearCopies(results, format)
  assert.deepEqual(copies, [
    {index: 2, client_id: 'p3', of: 'p1', overlap: 1},
    {index: 3, client_id: 'p4', of: 'p2', overlap: 1},
  ])
  assert.deepEqual(nearCopies(results, format), copies)
  // Half the positions (one tensor redone): still a copy at the threshold; an eighth (as honest pairs share): kept.
  assert.equal(COPY_OVERLAP_THRESHOLD, 0.5)
  const half = A.map((t, i) => (i === 0 ? t : B[1]))
  assert.equal(nearCopies([results[0], {client_id: 'p5', bytes: encode(half)}], format).length, 1)
  const eighth = [[A[0][0], ...B[0].slice(1)], B[1]]
  assert.deepEqual(nearCopies([results[0], {client_id: 'p6', bytes: encode(eighth)}], format), [])
  assert.equal(indexOverlap(indexSample(encode(A), format), indexSample(encode(eighth), format)), 2 / 16)
})

test('intake: a re-signed copy with other bytes is caught by index overlap, naming the producer copied; our own result counts', () => {
  const alice = identityFromSeed(Buffer.alloc(32, 1))
  const bob = identityFromSeed(Buffer.alloc(32, 2))
  const carol = identityFromSeed(Buffer.alloc(32, 3))
  const announce = (who: typeof alice, step: number, bytes: Uint8Array) =>
    signAnnouncement(who, {run_id: 'r', step, client_id: who.id, batch_start: 0, batch_end: 1, commitment: resultCommitment(bytes), size: bytes.length})
  const intake = new ResultIntake(format)
  const a = encode(A)
  assert.equal(intake.bytes(announce(alice, 1, a), a), undefined)
  assert.equal(intake.bytes(announce(carol, 1, encode(B)), encode(B)), undefined)
  const copy = encode(A, 0x3c)
  assert.equal(intake.bytes(announce(bob, 1, copy), copy), `copy: index overlap 1.000 with ${alice.id}'s result for step 1`)
  // Another step: the same indices are no copy (results of different rounds are compared by bytes only: replays).
  const later = encode(A, 0x3d)
  assert.equal(intake.bytes(announce(bob, 2, later), later), undefined)
  // Our own result: a peer's near copy of it is caught.
  const mine = encode(B, 0x01)
  intake.own(announce(carol, 3, mine), mine)
  assert.match(intake.bytes(announce(alice, 3, encode(B, 0x80)), encode(B, 0x80))!, new RegExp(`^copy: index overlap 1.000 with ${carol.id}'s`))
  intake.forget(4)
  assert.equal(intake.bytes(announce(bob, 3, encode(B, 0x02)), encode(B, 0x02)), undefined)
})

test('the position index gives the verdicts of comparing every pair (random samples, copies and near-copies among them)', async () => {
  const {OverlapIndex} = await import('../../src/core/verify/copy.js')
  let x = 12345
  const rnd = (n: number) => ((x = (x * 1103515245 + 12345) % 2 ** 31), x % n)
  for (let trial = 0; trial < 200; trial++) {
    const samples: Set<number>[] = []
    for (let i = 0; i < 12; i++) {
      // Some results copy an earlier one with a share of their positions redone, some are empty.
      const base = i > 0 && rnd(3) === 0 ? [...samples[rnd(i)]] : []
      const keep = base.filter(() => rnd(100) < 40 + rnd(60))
      const s = new Set(keep)
      const size = rnd(5) === 0 ? 0 : 1 + rnd(40)
      while (s.size < Math.max(size, keep.length)) s.add(rnd(200))
      samples.push(s)
    }
    const ids = samples.map((_, i) => `p${i % 10}`)
    const threshold = [0.3, 0.5, 0.7][trial % 3]
    const index = new OverlapIndex()
    const kept: {id: string; s: Set<number>}[] = []
    for (const [i, s] of samples.entries()) {
      let want: {of: string; overlap: number} | undefined
      for (const k of kept) {
        if (k.id === ids[i]) continue
        const overlap = indexOverlap(s, k.s)
        if (overlap >= threshold) {
          want = {of: k.id, overlap}
          break
        }
      }
      assert.deepEqual(index.firstOverlap(ids[i], s, threshold), want, `trial ${trial}, result ${i}`)
      if (!want) {
        index.add(ids[i], s)
        kept.push({id: ids[i], s})
      }
    }
  }
})
