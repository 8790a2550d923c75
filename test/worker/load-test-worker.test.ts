import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import type {ClientWorker} from '../../src/core/client/components.js'
import {nearCopies} from '../../src/core/verify/copy.js'
import {ResultIntake} from '../../src/core/verify/intake.js'
import {validateResult, type ResultFormat} from '../../src/core/verify/result.js'
import {sparseLoCoResultSize, validateSparseLoCoResult, type SparseLoCoResultFormat} from '../../src/core/verify/sparseloco-result.js'
import {LOAD_TEST_TENSOR, LoadTestWorker, loadTestResultFormat, loadTestSparseLoCoResultFormat} from '../../src/core/worker/load-test-worker.js'

const tokens = (seed: number) => Uint32Array.from({length: 2 * 17}, (_, i) => (seed * 131 + i * 7) % 256)

async function oneResult(w: LoadTestWorker, step: number, seed: number): Promise<Uint8Array> {
  await w.beginRound(tokens(seed), 2, step)
  return (await w.finishRound(step)).result
}

describe('the load-test compute stand-in (LoadTestWorker)', () => {
  it('is excluded from scoring: no score_results (a verifier with it reports no scores)', () => {
    const w = new LoadTestWorker({purpose: 'load-test', resultBytes: 100, computeMs: 0})
    assert.equal('scoreResults' in w, false)
    const asClientWorker: ClientWorker = w
    assert.equal(asClientWorker.scoreResults, undefined)
  })

  it('refuses to be constructed without naming its purpose', () => {
    assert.throws(() => new LoadTestWorker({resultBytes: 100, computeMs: 0} as never), /load-test tool/)
    assert.throws(() => new LoadTestWorker({purpose: 'train', resultBytes: 100, computeMs: 0} as never), /load-test tool/)
  })

  for (const target of [64, 1000, 4096, 100_000]) {
    it(`returns results of about ${target} bytes that pass the format validation peers apply`, async () => {
      const w = new LoadTestWorker({purpose: 'load-test', resultBytes: target, computeMs: 0})
      await w.initFromConfig({}, 1)
      const {resultFormat} = await w.configure({optimizer: {}, micro_batch: 1})
      const intake = new ResultIntake(resultFormat)
      const results: Uint8Array[] = []
      for (let seed = 0; seed < 8; seed++) {
        const r = await oneResult(w, 1, seed)
        assert.equal(r.length, w.resultSize)
        assert.ok(r.length >= target && r.length < target + 64, `size ${r.length} for a target of ${target}`)
        assert.deepEqual(validateResult(r, resultFormat), {ok: true})
        const a = {client_id: `p${seed}`, step: 1, commitment: `c${seed}`}
        assert.equal(intake.bytes(a, r), undefined, `peer ${seed}: the client's intake (format, copy, replay) accepts it`)
        results.push(r)
      }
      // Different producers' results are not copies of each other (index overlap far under the threshold).
      assert.deepEqual(
        nearCopies(
          results.map((bytes, i) => ({client_id: `p${i}`, bytes})),
          resultFormat,
        ),
        [],
      )
    })
  }

  it("is refused by a real model's format, and a corrupted one by its own", async () => {
    const w = new LoadTestWorker({purpose: 'load-test', resultBytes: 500, computeMs: 0})
    const r = await oneResult(w, 1, 1)
    const real: ResultFormat = {value_format: 'sign', tensors: [{name: 'model.embed_tokens.weight', shape: loadTestResultFormat(500).tensors[0].shape, chunk: [1, 64], topk: 8}]}
    const v = validateResult(r, real)
    assert.equal(v.ok, false)
    assert.match((v as {reason: string}).reason, /name does not match|a sign result for this model is exactly/)
    const bad = Uint8Array.from(r)
    bad[bad.length - 1] ^= 0xff
    bad[40] ^= 0xff
    assert.equal(validateResult(bad, loadTestResultFormat(500)).ok, false)
    assert.ok(LOAD_TEST_TENSOR.includes('not_a_model'))
  })

  for (const target of [100, 5000, 40_000]) {
    it(`in a SparseLoCo run, returns SparseLoCo results of about ${target} bytes that pass the SparseLoCo validator and the intake`, async () => {
      const w = new LoadTestWorker({purpose: 'load-test', resultBytes: target, computeMs: 0})
      await w.initFromConfig({}, 1)
      const {resultFormat} = await w.configure({optimizer: {SparseLoCo: {inner_steps: 15}}, micro_batch: 1})
      assert.equal(resultFormat.format, 'sparseloco')
      const format = resultFormat as SparseLoCoResultFormat
      assert.equal(format.tensors[0].name, LOAD_TEST_TENSOR)
      const intake = new ResultIntake(resultFormat)
      const results: Uint8Array[] = []
      for (let seed = 0; seed < 6; seed++) {
        const r = await oneResult(w, 2, seed)
        assert.equal(r.length, w.resultSize)
        assert.ok(r.length >= target && r.length < target + 100, `size ${r.length} for a target of ${target}`)
        assert.deepEqual(validateSparseLoCoResult(r, format), {ok: true})
        assert.equal(intake.bytes({client_id: `p${seed}`, step: 2, commitment: `c${seed}`}, r), undefined)
        results.push(r)
      }
      assert.deepEqual(
        nearCopies(
          results.map((bytes, i) => ({client_id: `p${i}`, bytes})),
          resultFormat,
        ),
        [],
      )
      // A real model's layout (another layout id) refuses it; a flipped index bit breaks it; the same inputs give the same bytes.
      const real: SparseLoCoResultFormat = {...format, layout_id: '0123456789abcdef'}
      assert.match((validateSparseLoCoResult(results[0], real) as {reason: string}).reason, /layout id/)
      const bad = Uint8Array.from(results[0])
      bad[40] ^= 0xff
      assert.equal(validateSparseLoCoResult(bad, format).ok, false)
      assert.deepEqual(await oneResult(w, 2, 0), results[0])
      // Replicas fold the applied results' hashes: every result applied shows in the hash.
      const [a, b] = [new LoadTestWorker({purpose: 'load-test', resultBytes: target, computeMs: 0}), new LoadTestWorker({purpose: 'load-test', resultBytes: target, computeMs: 0})]
      assert.equal(await a.applyResults(2, results), await b.applyResults(2, [...results].reverse()))
      assert.notEqual(await a.applyResults(3, results.slice(1)), await b.applyResults(3, results))
    })
  }

  it('sizes SparseLoCo results to the target (one chunk of 4,096 with 64 indices is about 80 bytes)', () => {
    for (const target of [200, 21_476_224]) {
      const f = loadTestSparseLoCoResultFormat(target)
      assert.equal(f.tensors[0].topk, 64)
      assert.equal(f.value_bits, 2)
      const size = sparseLoCoResultSize(f)
      assert.ok(size >= target && size < target + 80, `size ${size} for a target of ${target}`)
    }
  })

  it('with computeMsPerBatch, computes longer for more batches (a SparseLoCo round of H batches), and records it (while under way, as running)', async () => {
    const w = new LoadTestWorker({purpose: 'load-test', resultBytes: 100, computeMs: 0, computeMsPerBatch: 20})
    const t0 = performance.now()
    const begun = w.beginRound(
      Uint32Array.from({length: 4 * 17}, (_, i) => i % 256),
      4,
      1,
    )
    assert.deepEqual(w.running && [w.running.step, w.running.batches], [1, 4])
    assert.equal(w.computed.length, 0)
    await begun
    assert.ok(performance.now() - t0 >= 75, `took ${performance.now() - t0} ms`)
    assert.equal(w.running, undefined)
    assert.equal(w.computed.length, 1)
    assert.equal(w.computed[0].batches, 4)
    assert.ok(w.computed[0].end - w.computed[0].start >= 75)
  })

  it('a speculative round gives the same result as one begun for real, and an undone one is marked and leaves nothing to finish', async () => {
    const [usual, early] = [new LoadTestWorker({purpose: 'load-test', resultBytes: 200, computeMs: 0}), new LoadTestWorker({purpose: 'load-test', resultBytes: 200, computeMs: 0})]
    await usual.beginRound(tokens(1), 2, 1)
    await early.beginRound(tokens(1), 2, 1, {speculative: true})
    assert.deepEqual((await early.finishRound(1)).result, (await usual.finishRound(1)).result)
    await assert.rejects(early.discardRound(2), /not begun speculative/)
    await early.beginRound(tokens(2), 2, 2)
    await assert.rejects(early.discardRound(2), /not begun speculative/, 'only a speculative round is undone')
    await early.beginRound(tokens(3), 2, 3, {speculative: true})
    await early.discardRound(3)
    await assert.rejects(early.finishRound(3), /without its begin_round/)
    assert.deepEqual(
      early.computed.map((c) => [c.step, c.speculative ?? false, c.discarded ?? false]),
      [
        [1, true, false],
        [2, false, false],
        [3, true, true],
      ],
    )
  })

  it('waits computeMs before the round is trained', async () => {
    const w = new LoadTestWorker({purpose: 'load-test', resultBytes: 100, computeMs: 60})
    const t0 = performance.now()
    await w.beginRound(tokens(1), 2, 1)
    assert.ok(performance.now() - t0 >= 55, `took ${performance.now() - t0} ms`)
  })

  it('applies results in hash order: replicas that apply the same set agree, a different set differs', async () => {
    const make = async () => {
      const w = new LoadTestWorker({purpose: 'load-test', resultBytes: 200, computeMs: 0})
      await w.initFromConfig({a: 1}, 7)
      return w
    }
    const [a, b, c] = [await make(), await make(), await make()]
    const producer = await make()
    const results = [await oneResult(producer, 1, 1), await oneResult(producer, 1, 2), await oneResult(producer, 1, 3)]
    const before = a.paramHash
    const ha = await a.applyResults(1, results)
    const hb = await b.applyResults(1, [...results].reverse())
    const hc = await c.applyResults(1, results.slice(0, 2))
    assert.equal(ha, hb)
    assert.notEqual(ha, before)
    assert.notEqual(hc, ha)
    assert.deepEqual(a.applies, [{step: 1, results: 3}])
  })
})
