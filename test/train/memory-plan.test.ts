import assert from 'node:assert/strict'
import {readFileSync} from 'node:fs'
import {join} from 'node:path'
import {describe, it} from 'node:test'
import {chunkRows, memoryPlan} from '../../src/core/train/memory-plan.js'
import {projectRoot} from '../../src/core/worker/python.js'
import {runCli} from '../helpers.js'

const template = (name: string) => JSON.parse(readFileSync(join(projectRoot, 'templates', name, 'model', 'config.json'), 'utf8'))

describe('psyche plan: the memory per rank of a sharded client', () => {
  it('gives, for llama2-20m, the bytes the worker holds per rank (bench/sharding_memory.py: 320.9, 160.5, 80.2 MiB)', () => {
    const config = template('llama2-20m')
    const held = (shards: number) => {
      const r = memoryPlan(config, {shards, microBatch: 4, seqLen: 64}).per_rank
      return r.parameters + r.gradients + r.optimizer_state
    }
    // measured with 1, 2 and 4 gloo ranks after two DisTrO rounds: 75.5 + 75.5 + 169.9 MiB unsharded
    assert.equal(held(1), 336_500_992)
    assert.equal(held(2), 336_500_992 / 2)
    assert.equal(held(4), 336_500_992 / 4)
    assert.equal(memoryPlan(config, {shards: 1, microBatch: 1, seqLen: 64}).parameters, 19_794_176)
  })

  it("knows Llama 3 8B's size, what fits on 80 GB GPUs, and which tensors cannot split 8 ways", () => {
    const config = template('llama-8b')
    const plan = (shards: number) => memoryPlan(config, {shards, microBatch: 1, seqLen: 2048, deviceBytes: 80 * 2 ** 30})
    assert.equal(plan(1).parameters, 8_030_261_248)
    assert.equal(plan(1).fits, false) // ~128 GiB of weights, gradients and state alone
    assert.equal(plan(2).fits, true)
    assert.deepEqual(plan(4).whole_tensors, [])
    // 128,256 rows = 2004 chunks of 64: not a multiple of 8
    assert.deepEqual(plan(8).whole_tensors, ['model.embed_tokens.weight', 'lm_head.weight'])
    assert.ok(plan(8).per_rank.total > plan(4).per_rank.total / 2)
    assert.equal(chunkRows(128_256, 64), 64)
    assert.equal(chunkRows(30, 64), 30)
    assert.equal(chunkRows(98, 64), 49)
  })

  it('psyche plan --json prints the plan; a missing config is named', async () => {
    const r = await runCli(['plan', '--model', join(projectRoot, 'templates', 'llama-8b', 'model'), '--devices', '4', '--json'])
    assert.equal(r.exitCode, 0, r.stderr)
    const out = JSON.parse(r.stdout)
    assert.equal(out.parameters, 8_030_261_248)
    assert.equal(out.fits, true)
    const bad = await runCli(['plan', '--model', '/nonexistent', '--json'])
    assert.notEqual(bad.exitCode, 0)
    assert.match(bad.stdout + bad.stderr, /nonexistent\/config.json/)
  })
})
