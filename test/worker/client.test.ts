import assert from 'node:assert/strict'
import {after, before, describe, it} from 'node:test'
import {WorkerRequestError, workerRequestError} from '../../src/core/worker/client.js'
import {ModelWorker} from '../../src/core/worker/model-worker.js'
import {tinyModelConfig} from '../helpers.js'

describe('worker client: errors cross the boundary as data', () => {
  it("reads a kind's structured fields from the reply, never from the message", () => {
    const refused = workerRequestError({kind: 'bad_result', message: 'rejected result: result 7: truncated', index: 2}, 'apply_results')
    assert.ok(refused instanceof WorkerRequestError)
    assert.equal(refused.kind, 'bad_result')
    assert.equal(refused.index, 2, 'the index is the reply field, not the number in the message')
    assert.equal(refused.op, 'apply_results')
    assert.equal(refused.message, 'worker: apply_results: rejected result: result 7: truncated')
    assert.equal(refused.code, 'EWORKER_BAD_RESULT')
    for (const index of [-1, 1.5, '2', null, Number.MAX_SAFE_INTEGER + 1]) {
      assert.equal(workerRequestError({kind: 'bad_result', message: 'm', index}, 'op').index, undefined, `index ${String(index)}`)
    }
    const plain = workerRequestError({kind: 'state', message: 'no model loaded'}, 'param_hash')
    assert.equal(plain.index, undefined)
    const garbled = workerRequestError('not an object', 'hello')
    assert.equal(garbled.kind, 'unknown')
    assert.equal(garbled.message, 'worker: hello: failed')
  })

  describe('a real worker', () => {
    let worker: ModelWorker
    before(async () => {
      worker = await ModelWorker.start({threads: 1, device: 'cpu'})
    })
    after(async () => {
      await worker.shutdown()
    })

    it('names a refused result by its index in the list sent, and applies nothing', async () => {
      await worker.initFromConfig(tinyModelConfig, 3)
      await worker.configure({
        optimizer: {Distro: {compression_decay: 0.9, compression_chunk: 8, compression_topk: 2, quantize_1bit: true}},
        lr_schedule: {Constant: {base_lr: 1e-2}},
        micro_batch: 2,
        delay_correction: true,
      })
      const tokens = Uint32Array.from({length: 2 * 17}, (_, i) => (i * 7) % tinyModelConfig.vocab_size)
      const {result, paramHash} = await worker.trainRound(tokens, 2, 1)
      const bad = result.subarray(0, result.length - 3)
      for (const [results, index] of [
        [[bad, result, result], 0],
        [[result, result, bad], 2],
      ] as const) {
        const error = await worker.applyResults(1, [...results]).then(
          () => assert.fail('the worker applied a truncated result'),
          (e: unknown) => e,
        )
        assert.ok(error instanceof WorkerRequestError, String(error))
        assert.equal(error.kind, 'bad_result')
        assert.equal(error.index, index)
        // the message keeps its text, for people (and for clients that still read it)
        assert.match(error.message, new RegExp(`result ${index}: truncated`))
      }
      assert.equal(await worker.paramHash(), paramHash, 'nothing was applied')
      assert.notEqual(await worker.applyResults(1, [result]), paramHash, 'a good result is applied')
    })
  })
})
