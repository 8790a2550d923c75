import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import {dataIndexAfter, evalDue, heldOutIds} from '../../src/core/client/eval.js'
import {globalBatchSize} from '../../src/core/coordinator/index.js'
import {baseConfig, baseLLM} from '../coordinator/helpers.js'

const run = (config: Partial<typeof baseConfig> = {}) => ({config: {...baseConfig, ...config}, model: {LLM: {...baseLLM}}})

describe('validation rules (client/eval.ts)', () => {
  it('the run trains on batch ids below the sum of its rounds’ global batch sizes, batch-size warmup included', () => {
    assert.equal(dataIndexAfter(run({total_steps: 10, global_batch_size_start: 8, global_batch_size_end: 8})), 80)
    const warm = run({total_steps: 20, global_batch_size_start: 2, global_batch_size_end: 8, global_batch_size_warmup_tokens: 16 * 40})
    let index = 0
    for (let step = 1; step <= 20; step++) index += globalBatchSize(warm.config, index * 16)
    assert.equal(dataIndexAfter(warm), index)
    assert.ok(index > 40 && index < 160, `between all-start and all-end sizes: ${index}`)
  })

  it('holds out the tail of the training data only when the run never reaches it', () => {
    const r = run({total_steps: 10, global_batch_size_start: 8, global_batch_size_end: 8})
    assert.deepEqual(heldOutIds(r, {every: 5, batches: 4}, {trainSamples: 84, hasSplit: false}), {ids: [80, 81, 82, 83], source: 'tail'})
    const short = heldOutIds(r, {every: 5, batches: 4}, {trainSamples: 83, hasSplit: false})
    assert.ok('reason' in short && /trains on 80 samples and the data has 83/.test(short.reason), JSON.stringify(short))
    assert.ok('reason' in heldOutIds(r, {every: 5, batches: 4}, {trainSamples: undefined, hasSplit: false}))
  })

  it('a held-out split gives its first samples (fewer when it is smaller), whatever the run trains on', () => {
    const r = run({total_steps: 1000})
    assert.deepEqual(heldOutIds(r, {every: 5, batches: 4}, {trainSamples: 10, split: 100, hasSplit: true}), {ids: [0, 1, 2, 3], source: 'split'})
    assert.deepEqual(heldOutIds(r, {every: 5, batches: 4}, {trainSamples: 10, split: 2, hasSplit: true}), {ids: [0, 1], source: 'split'})
    assert.ok('reason' in heldOutIds(r, {every: 5, batches: 4}, {trainSamples: 10, split: 0, hasSplit: true}))
  })

  it('evaluates after every n-th step and after the last one; never with every 0', () => {
    const due = (every: number) => Array.from({length: 12}, (_, i) => i + 1).filter((s) => evalDue(s, {every, batches: 8}, 12))
    assert.deepEqual(due(5), [5, 10, 12])
    assert.deepEqual(due(4), [4, 8, 12])
    assert.deepEqual(due(0), [])
  })
})
