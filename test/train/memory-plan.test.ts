import assert from 'node:assert/strict'
import {readFileSync} from 'node:fs'
import {join} from 'node:path'
import {describe, it} from 'node:test'
import {STATE_BYTES, chunkRows, memoryPlan} from '../../src/core/train/memory-plan.js'
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

  it('counts SparseLoCo state (error feedback, inner AdamW moments, committed and start copies) and refuses AdamW sharded', () => {
    const config = template('llama2-20m')
    const sparse = (shards: number) => memoryPlan(config, {shards, microBatch: 2, seqLen: 64, optimizer: 'sparseloco', chunk: 64, topk: 32})
    const held = 19_794_176
    assert.deepEqual(sparse(1).per_rank.optimizer_state_parts, {error_feedback: 4 * held, inner_adamw_moments: 8 * held, committed: 4 * held, round_start: 4 * held})
    assert.equal(sparse(2).per_rank.optimizer_state, (20 * held) / 2)
    assert.equal(sparse(4).per_rank.gradients, (4 * held) / 4)
    // producing a result gathers every rank's top-k of the largest tensor: more than DisTrO's moment on one rank
    assert.ok(sparse(1).per_rank.transient > 0)
    assert.equal(memoryPlan(config, {shards: 1, microBatch: 2, seqLen: 64}).per_rank.transient, 0)
    assert.equal(memoryPlan(config, {shards: 1, microBatch: 2, seqLen: 64, optimizer: 'adamw'}).per_rank.optimizer_state, 8 * held)
    assert.throws(() => memoryPlan(config, {shards: 2, microBatch: 1, seqLen: 64, optimizer: 'adamw'}), /--optimizer adamw with --devices 2: AdamW does not train a sharded model/)
    assert.deepEqual(Object.keys(STATE_BYTES).sort(), ['adamw', 'distro', 'sparseloco'])
  })

  it("counts a DeepSeek-V3 model's tensors as transformers 5 builds them, its fused 3-D experts split by expert", () => {
    // transformers 5.23's DeepseekV3ForCausalLM on the meta device: 1,509,184 and 7,017,530,368 parameters
    assert.equal(memoryPlan(template('tiny-deepseek-v3'), {shards: 1, microBatch: 1, seqLen: 128}).parameters, 1_509_184)
    const small = template('deepseek-v3-small')
    const plan = (shards: number) => memoryPlan(small, {shards, microBatch: 1, seqLen: 2048, deviceBytes: 80 * 2 ** 30})
    assert.equal(plan(1).parameters, 7_017_530_368)
    assert.equal(plan(1).model_type, 'deepseek_v3')
    assert.equal(plan(1).fits, false) // 17 bytes a parameter: ~111 GiB before activations
    assert.equal(plan(2).fits, true)
    // 64 experts split 2, 4 and 8 ways; the router (64 rows: one chunk) and kv_a_proj_with_mqa (576 rows: 9 chunks) cannot
    for (const n of [2, 4, 8]) {
      assert.ok(!plan(n).whole_tensors.some((t) => t.includes('.experts.')), `${n} ranks`)
      assert.ok(plan(n).whole_tensors.includes('model.layers.1.mlp.gate.weight'))
      assert.ok(plan(n).whole_tensors.includes('model.layers.1.self_attn.kv_a_proj_with_mqa.weight'))
    }
    // 129,280 rows = 2020 chunks of 64: the embeddings and the head stay whole at 8 ranks, not at 4
    assert.ok(!plan(4).whole_tensors.includes('model.embed_tokens.weight'))
    assert.ok(plan(8).whole_tensors.includes('lm_head.weight'))
    assert.throws(() => memoryPlan({...small, model_type: 'qwen3_moe'}, {shards: 1, microBatch: 1, seqLen: 8}), /model_type "qwen3_moe": psyche plan knows llama and deepseek_v3/)
  })

  it('psyche plan --json prints the plan, --config takes a run config; a missing config is named', async () => {
    // a run config gives the optimizer, its chunk and top-k, the sequence length and the model directory
    const run = join(projectRoot, 'templates', 'deepseek-v3-small', 'state.toml')
    // three CLI processes at once (each start is most of its time)
    const [r, sparse, bad] = await Promise.all([
      runCli(['plan', '--model', join(projectRoot, 'templates', 'llama-8b', 'model'), '--devices', '4', '--json']),
      runCli(['plan', '--config', run, '--optimizer', 'sparseloco', '--devices', '4']),
      runCli(['plan', '--model', '/nonexistent', '--json']),
    ])
    assert.equal(r.exitCode, 0, r.stderr)
    const out = JSON.parse(r.stdout)
    assert.equal(out.parameters, 8_030_261_248)
    assert.equal(out.fits, true)
    assert.equal(sparse.exitCode, 0, sparse.stderr)
    assert.match(sparse.stdout, /^7,017,530,368 parameters \(deepseek_v3\) in 4 shard\(s\); micro-batch 1 × 2048 tokens/)
    assert.match(sparse.stdout, /SparseLoCo state [\d.]+ GiB \(error feedback [\d.]+ GiB, inner adamw moments [\d.]+ GiB, committed [\d.]+ GiB, round start [\d.]+ GiB\)/)
    assert.match(sparse.stdout, /total ~[\d.]+ GiB of 80 GiB: fits/)
    assert.notEqual(bad.exitCode, 0)
    assert.match(bad.stdout + bad.stderr, /nonexistent\/config.json/)
  })
})
