import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import {busyFraction, bytesPerToken, cpuBusy, limitOf, TOKENS_PER_BATCH, uploadsPerResult, type Fetch} from '../../bench/utilization-stats.js'

/** The utilization bench's arithmetic (bench/utilization-stats.ts), from sample logs. */
describe('the utilization bench: what its logs and counters come to', () => {
  it('GPU-busy fraction: compute spans clipped to the window, over its wall time', () => {
    const window = {start: 10_000, end: 30_000}
    // A warm-up compute ending inside the window, two measured ones, one past the end.
    const computes = [
      {start: 4_000, end: 11_000},
      {start: 12_000, end: 18_000},
      {start: 22_000, end: 28_000},
      {start: 29_000, end: 35_000},
    ]
    assert.equal(busyFraction(computes, window), (1_000 + 6_000 + 6_000 + 1_000) / 20_000)
    assert.equal(busyFraction([], window), 0)
    assert.ok(Number.isNaN(busyFraction(computes, {start: 5, end: 5})))
  })

  it('bytes per token: link bytes, scaled back by K, over the tokens of the batches trained in the window', () => {
    assert.equal(TOKENS_PER_BATCH, 262_144)
    // 2 rounds of one batch, 7 DisTrO results of 439,128 B each way at K = 8: about 47 B per token
    assert.equal(bytesPerToken(2 * 7 * 439_128, 2, 8), (2 * 7 * 439_128 * 8) / (2 * 262_144))
    // a SparseLoCo round of H = 15 batches moves its bytes over 15 times the tokens
    assert.equal(bytesPerToken(1000, 30, 1), 1000 / (30 * 262_144))
    // a client that trained nothing in the window (max_trainers_per_round) has no bytes per token
    assert.ok(Number.isNaN(bytesPerToken(1000, 0, 8)))
  })

  it("uploads per result: the fetches each producer served of its own result, per step measured; and anyone's most", () => {
    const f = (fetcher: string, from: string, producer: string, step: number): Fetch => ({fetcher, from, producer, step})
    const fetches = [
      // step 2: a's result fetched from a by b, c, d; b's by a from b, by c and d from a (a re-served it)
      f('b', 'a', 'a', 2),
      f('c', 'a', 'a', 2),
      f('d', 'a', 'a', 2),
      f('a', 'b', 'b', 2),
      f('c', 'a', 'b', 2),
      f('d', 'a', 'b', 2),
      // step 1 (warm-up) is not counted
      f('b', 'a', 'a', 1),
    ]
    const u = uploadsPerResult(fetches, new Set([2]))
    assert.deepEqual(u.byProducer.sort(), [1, 3])
    assert.equal(u.maxByAnyone, 3)
    // A result nobody fetched from its producer counts 0 uploads for it.
    assert.deepEqual(uploadsPerResult([f('b', 'c', 'a', 2)], new Set([2])).byProducer, [0])
    assert.deepEqual(uploadsPerResult([], new Set([2])), {byProducer: [], maxByAnyone: 0})
    // Fetched in pieces: a quarter from the producer, the rest from another holder, by two fetchers.
    const shared = [
      {...f('b', 'a', 'a', 2), share: 0.25},
      {...f('b', 'c', 'a', 2), share: 0.75},
      {...f('d', 'a', 'a', 2), share: 0.25},
      {...f('d', 'c', 'a', 2), share: 0.75},
    ]
    assert.deepEqual(uploadsPerResult(shared, new Set([2])), {byProducer: [0.5], maxByAnyone: 1.5})
  })

  it("the limit: compute when busy, else the largest of uplink time, downlink time and the round's rest", () => {
    const base = {busy: 0.5, period: 20, compute: 6.5, cpuBusy: 0.5}
    assert.equal(limitOf({...base, busy: 0.96, up: 1, down: 1}).limit, 'compute (nothing else)')
    assert.deepEqual(limitOf({...base, up: 10, down: 2}), {limit: 'uplink', rest: 3.5})
    assert.equal(limitOf({...base, up: 2, down: 10}).limit, 'downlink')
    assert.deepEqual(limitOf({...base, up: 2, down: 1}), {limit: "the round's coordination", rest: 11.5})
    assert.equal(limitOf({...base, cpuBusy: 0.95, up: 2, down: 1}).limit, "this machine's CPU and the round's coordination")
  })

  it('the machine CPU busy fraction from two /proc/stat cpu lines', () => {
    // user nice system idle iowait irq softirq
    assert.ok(Math.abs(cpuBusy([100, 0, 50, 800, 50, 0, 0], [250, 0, 100, 900, 50, 0, 0]) - 2 / 3) < 1e-12)
    assert.ok(Number.isNaN(cpuBusy([1, 1, 1, 1], [1, 1, 1, 1])))
  })
})
