import assert from 'node:assert/strict'
import {test} from 'node:test'
import {indexOverlap} from '../../src/core/verify/copy.js'
import {randomBatchIds, roundScale, scoreOf, Scorer} from '../../src/core/verify/score.js'

test('scoreOf: improvement on the assigned batch beyond any gain on the random batch, scale-free', () => {
  const honest = scoreOf({assigned: {before: 5, after: 4.9}, random: {before: 5, after: 4.98}})
  const flipped = scoreOf({assigned: {before: 5, after: 5.1}, random: {before: 5, after: 5.02}})
  const random = scoreOf({assigned: {before: 5, after: 5.01}, random: {before: 5, after: 5.01}})
  assert.ok(honest > 0.5, String(honest))
  assert.ok(flipped < -0.5, String(flipped))
  // A random update raises the loss on every batch alike: only a gain on the random batch counts for a result, so
  // it scores −0.5, far below honest work (not 0, where noise would hide it).
  assert.ok(Math.abs(random + 0.5) < 1e-6, String(random))
  // Trained on other batches: it helps the random batch as much as its own, about 0.
  assert.ok(Math.abs(scoreOf({assigned: {before: 5, after: 4.95}, random: {before: 5, after: 4.95}})) < 1e-6)
  // Scale-free: the same picture at a 10× smaller step scores the same.
  assert.ok(Math.abs(scoreOf({assigned: {before: 5, after: 4.99}, random: {before: 5, after: 4.998}}) - honest) < 1e-6)
})

test('Scorer: moving averages; a peer is a low scorer only with enough scores below the threshold', () => {
  const s = new Scorer({alpha: 0.5, threshold: 0.05, window: 2})
  s.add('bad', -0.9)
  s.add('good', 0.6)
  assert.deepEqual(s.lowScorers(), []) // one score is not a window
  s.add('bad', -0.8)
  s.add('good', -0.2) // one bad round of an honest peer: its average stays above
  assert.deepEqual(s.lowScorers(), ['bad'])
  assert.ok(Math.abs(s.get('good')!.average - 0.2) < 1e-12)
  assert.equal(s.get('bad')!.count, 2)
})

test("randomBatchIds: after the round's own batches, from the seed; indexOverlap counts shared positions", () => {
  const round = {seed: 'ab'.repeat(32), data_index: 100, batch_size: 16}
  const ids = randomBatchIds(round, 4)
  assert.equal(ids.length, 4)
  assert.ok(ids[0] >= 116)
  assert.deepEqual(randomBatchIds(round, 4), ids)
  assert.notDeepEqual(randomBatchIds({...round, seed: 'cd'.repeat(32)}, 4), ids)
  assert.equal(indexOverlap(new Set([1, 2, 3, 4]), new Set([3, 4, 5, 6])), 0.5)
  assert.equal(indexOverlap(new Set(), new Set([1])), 0)
})

test("roundScale: a result that barely moves the loss scores about 0 against the round's median step, not amplified noise", () => {
  const honest = (g: number) => ({assigned: {before: 5, after: 5 - g}, random: {before: 5, after: 5 - g / 3}})
  const tiny = {assigned: {before: 5, after: 5 - 6e-4}, random: {before: 5, after: 5 + 3e-5}}
  assert.ok(scoreOf(tiny) > 0.9) // on its own scale: noise looks like a perfect score
  const scale = roundScale([honest(0.2), honest(0.25), tiny, honest(0.3)])
  assert.ok(Math.abs(scale - ((0.2 + 0.25) * (4 / 3)) / 2) < 1e-9, String(scale)) // the median of 4 sizes
  assert.ok(Math.abs(scoreOf(tiny, scale)) < 0.01)
  // Honest results keep their scores; a large one is judged on its own scale (a median: one attacker cannot move it).
  assert.ok(Math.abs(scoreOf(honest(0.25), scale) - scoreOf(honest(0.25))) < 1e-9)
  assert.ok(Math.abs(scoreOf(honest(3), scale) - scoreOf(honest(3))) < 1e-9)
  assert.equal(roundScale([]), 0)
})
