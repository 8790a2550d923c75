import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import type {ClientWorker} from '../../src/core/client/components.js'
import {nearCopies} from '../../src/core/verify/copy.js'
import {ResultIntake} from '../../src/core/verify/intake.js'
import {validateResult, type ResultFormat} from '../../src/core/verify/result.js'
import {LOAD_TEST_TENSOR, LoadTestWorker, loadTestResultFormat} from '../../src/core/worker/load-test-worker.js'

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
