import assert from 'node:assert/strict'
import {createHash, randomBytes} from 'node:crypto'
import {describe, it} from 'node:test'
import {
  globalBatchSize,
  isTrainerHealthy,
  participantKey,
  rangeForPosition,
  roundBatchSize,
  selectWitnesses,
  shuffleAll,
  shuffledIndex,
  unshuffledIndex,
  witnessBloomParams,
  witnessCount,
  witnessQuorum,
} from '../../src/core/coordinator/index.js'
import {BloomFilter, bloomParamsFor} from '../../src/core/primitives/bloom.js'
import {baseConfig, honestProof, ok, toFirstRound} from './helpers.js'

describe('swap-or-not shuffle', () => {
  const seed = Buffer.alloc(32, 7)

  it('is a permutation, and unshuffledIndex inverts it', () => {
    for (const n of [1, 2, 3, 10, 257, 1000]) {
      const seen = new Set<number>()
      for (let i = 0; i < n; i++) {
        const p = shuffledIndex(i, n, seed)
        assert.ok(p >= 0 && p < n)
        seen.add(p)
        assert.equal(unshuffledIndex(p, n, seed), i)
      }
      assert.equal(seen.size, n)
    }
  })

  it('shuffleAll agrees with shuffledIndex index by index', () => {
    for (const n of [1, 5, 300, 2000]) {
      const all = shuffleAll(n, seed)
      for (let i = 0; i < n; i += Math.max(1, Math.floor(n / 50))) assert.equal(all[i], shuffledIndex(i, n, seed))
    }
  })

  it('depends on the seed and mixes (not the identity, positions spread out)', () => {
    const n = 1000
    const a = shuffleAll(n, seed)
    const b = shuffleAll(n, randomBytes(32))
    let same = 0
    let fixed = 0
    for (let i = 0; i < n; i++) {
      if (a[i] === b[i]) same++
      if (a[i] === i) fixed++
    }
    assert.ok(same < 20, `${same} positions agree between two seeds`)
    assert.ok(fixed < 20, `${fixed} fixed points`)
  })

  it('rejects bad arguments', () => {
    assert.throws(() => shuffledIndex(5, 5, seed), RangeError)
    assert.throws(() => shuffledIndex(0, 0, seed), RangeError)
    assert.throws(() => shuffledIndex(0, 4, Buffer.alloc(8)), RangeError)
  })
})

describe('batch ranges', () => {
  it("partition the round's batches contiguously, sizes differing by at most one", () => {
    for (const [batch, trainers] of [
      [8, 3],
      [8, 8],
      [4, 10],
      [12288, 16],
      [1, 1],
      [7, 2],
    ]) {
      const round = {data_index: 100, batch_size: batch}
      const ranges = Array.from({length: trainers}, (_, p) => rangeForPosition(round, trainers, p))
      assert.equal(ranges[0].start, 100)
      for (let p = 1; p < trainers; p++) assert.equal(ranges[p].start, ranges[p - 1].end)
      assert.equal(ranges[trainers - 1].end, 100 + batch)
      const sizes = ranges.map((r) => r.end - r.start)
      assert.ok(Math.max(...sizes) - Math.min(...sizes) <= 1)
    }
  })
})

describe('witnesses', () => {
  it('witness_nodes = 0 means every client, up to 32', () => {
    assert.equal(witnessCount({...baseConfig, witness_nodes: 0}, 5), 5)
    assert.equal(witnessCount({...baseConfig, witness_nodes: 0}, 10_000), 32)
    assert.equal(witnessCount({...baseConfig, witness_nodes: 4}, 3), 3)
  })

  it('quorum follows Psyche: 1→1, 2→2, 3→2, n→⌊2n/3⌋', () => {
    assert.deepEqual([1, 2, 3, 4, 6, 9, 32].map(witnessQuorum), [1, 2, 2, 2, 4, 6, 21])
  })
})

describe('global batch size', () => {
  const config = {...baseConfig, global_batch_size_start: 100, global_batch_size_end: 300, global_batch_size_warmup_tokens: 1000}
  it('ramps linearly over the warmup tokens, then stays at the end size', () => {
    assert.equal(globalBatchSize(config, 0), 100)
    assert.equal(globalBatchSize(config, 500), 200)
    assert.equal(globalBatchSize(config, 999), 300 - 0) // 299.8 rounds to 300
    assert.equal(globalBatchSize(config, 1000), 300)
    assert.equal(globalBatchSize(config, 10 ** 12), 300)
    assert.equal(globalBatchSize(baseConfig, 0), 8)
  })

  it('a SparseLoCo round carries its inner steps: H times the global batch (other optimizers: one)', () => {
    const llm = {max_seq_len: 10}
    const sparseloco = {SparseLoCo: {inner_steps: 5}} as never
    assert.equal(roundBatchSize({config, model: {LLM: {...llm, optimizer: sparseloco}}} as never, 50), 200 * 5)
    assert.equal(roundBatchSize({config, model: {LLM: {...llm, optimizer: sparseloco}}} as never, 100), 300 * 5)
    assert.equal(roundBatchSize({config, model: {LLM: {...llm, optimizer: {Distro: {}}}}} as never, 50), 200)
    // Consecutive rounds' batches tile the data: the next round starts where this one's H global batches end.
    const ranges = [0, 1, 2].map((t) => rangeForPosition({data_index: 0, batch_size: 1500}, 3, t))
    assert.deepEqual(ranges, [
      {start: 0, end: 500},
      {start: 500, end: 1000},
      {start: 1000, end: 1500},
    ])
  })
})

describe('bloom filter', () => {
  it('never misses an added item, and stays near its false-positive rate', () => {
    const items = Array.from({length: 1000}, (_, i) => `client-${i}`)
    const bloom = BloomFilter.forCapacity(items.length, 0.01)
    for (const item of items) bloom.add(item)
    assert.ok(items.every((item) => bloom.contains(item)))
    let falsePositives = 0
    for (let i = 0; i < 5000; i++) if (bloom.contains(`other-${i}`)) falsePositives++
    assert.ok(falsePositives / 5000 < 0.03, `false-positive rate ${falsePositives / 5000}`)
    assert.ok(bloom.fillRatio() > 0.3 && bloom.fillRatio() < 0.7)
  })

  it('round-trips through base64 and refuses a filter of the wrong size', () => {
    const params = bloomParamsFor(10)
    const bloom = new BloomFilter(params).add(Buffer.from([1, 2, 3]))
    const back = BloomFilter.fromBase64(params, bloom.toBase64())
    assert.ok(back.contains(Buffer.from([1, 2, 3])))
    assert.ok(!new BloomFilter(params).contains(Buffer.from([1, 2, 3])))
    assert.throws(() => BloomFilter.fromBase64({bits: params.bits * 2, hashes: params.hashes}, bloom.toBase64()), RangeError)
  })

  it('sizes grow with capacity', () => {
    assert.equal(bloomParamsFor(0).bits, 64)
    assert.ok(bloomParamsFor(10_000).bits >= 95_000)
    assert.ok(bloomParamsFor(10_000).hashes >= 6)
  })

  // Two client ids whose participant keys plain double hashing, (h1 + i·h2) mod 64, mapped to exactly the same 15
  // bits of a 3-trainer round's 64-bit filter (h1 and h2 equal modulo 64: one pair in 2,048; found by search).
  const twinA = createHash('sha256').update('collide/12').digest('hex')
  const twinC = createHash('sha256').update('collide/18').digest('hex')
  const other = createHash('sha256').update('collide/0').digest('hex')

  it("a small filter's positions depend on the whole hash: two items equal modulo its size set different bits", () => {
    const params = witnessBloomParams({}, {roster: ['a', 'b', 'c']})
    assert.deepEqual(params, {bits: 64, hashes: 15})
    const positions = (id: string) => new Set(BloomFilter.positionsFor(params, participantKey(id)))
    assert.notDeepEqual(positions(twinA), positions(twinC))
    assert.ok(!new BloomFilter(params).add(participantKey(twinA)).contains(participantKey(twinC)))
    // The designed rate, not one item in 2,048: a 64-bit filter holding two items vouches for none of 20,000 others.
    const bloom = new BloomFilter(params).add('item-0').add('item-1')
    let falsePositives = 0
    for (let i = 2; i < 20_002; i++) if (bloom.contains(`item-${i}`)) falsePositives++
    assert.equal(falsePositives, 0)
  })

  it('a trainer nobody received is not healthy, even when its key used to set the same bits as a trainer that was', () => {
    // Three clients, three witnesses (quorum 2); the twin C is cut off from its peers: A and B saw A and B, C saw
    // only itself. Under the old positions, A's and B's blooms named C too: C was healthy, every replica waited for
    // its result (decide.ts acceptedResults: missing), which nobody had, and dropped its model (sim: out_of_sync).
    const first = toFirstRound([twinA, other, twinC], {witness_nodes: 3})
    let state = first.state
    const now = first.now
    const round = state.epoch.round!
    assert.deepEqual([...selectWitnesses(state)].sort(), [twinA, other, twinC].sort())
    for (const from of [twinA, other]) state = ok(state, {type: 'witness', from, step: round.step, proof: honestProof(state, [twinA, other])}, now)
    state = ok(state, {type: 'witness', from: twinC, step: round.step, proof: honestProof(state, [twinC])}, now)
    const final = state.epoch.round!
    assert.equal(final.witnesses.length, 3)
    assert.ok(isTrainerHealthy(state, final, twinA) && isTrainerHealthy(state, final, other), 'the two that exchanged results are healthy')
    assert.ok(!isTrainerHealthy(state, final, twinC), 'C: only its own proof names it')
  })
})
