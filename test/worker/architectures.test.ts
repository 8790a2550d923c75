import assert from 'node:assert/strict'
import {readFileSync} from 'node:fs'
import {join} from 'node:path'
import {after, before, describe, it} from 'node:test'
import {ARCHITECTURE_MODEL_TYPES} from '../../src/core/config/support.js'
import {ModelWorker} from '../../src/core/worker/model-worker.js'
import {projectRoot} from '../../src/core/worker/python.js'

/**
 * Replicas of every architecture family stay bit-identical across clients: two worker processes (one thread each,
 * as two clients' workers) build each tiny model of test/fixtures/tiny-architectures.json from the same seed and
 * train it on DisTrO's network path, each client on its own batches, both applying both clients' results a round
 * later. Mixtures of experts included: routing decides each client's gradient, and their fused 3-D expert tensors
 * are compressed expert by expert.
 */
interface Family {
  architecture: 'HfLlama' | 'HfDeepseek' | 'HfAuto'
  config: Record<string, unknown>
}
const families = JSON.parse(readFileSync(join(projectRoot, 'test', 'fixtures', 'tiny-architectures.json'), 'utf8')) as Record<string, Family>
const ROWS = 4
const SEQ = 33
const STEPS = 5
const schedule = {Constant: {base_lr: 1e-2, warmup_steps: 0, warmup_init_lr: 0}}
const distro = {Distro: {clip_grad_norm: 1.0, compression_decay: 0.96, compression_chunk: 16, compression_topk: 4, quantize_1bit: true}}

/** Learnable token rows: each an arithmetic sequence over 64 ids (so the loss can fall in a few steps). */
function batch(seed: number): Uint32Array {
  const out = new Uint32Array(ROWS * SEQ)
  let x = seed
  for (let r = 0; r < ROWS; r++) {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0
    const start = x % 64
    const stride = 1 + ((x >>> 8) % 3)
    for (let i = 0; i < SEQ; i++) out[r * SEQ + i] = 100 + ((start + i * stride) % 64)
  }
  return out
}

const workers: ModelWorker[] = []
after(async () => {
  for (const w of workers) await w.shutdown().catch(() => {})
})

describe('every architecture family, in two worker processes', () => {
  let a: ModelWorker
  let b: ModelWorker
  before(async () => {
    ;[a, b] = await Promise.all([ModelWorker.start({threads: 1, device: 'cpu', label: 'arch-a'}), ModelWorker.start({threads: 1, device: 'cpu', label: 'arch-b'})])
    workers.push(a, b)
  })

  for (const [family, {architecture, config}] of Object.entries(families)) {
    it(`${family} (${architecture}): the same parameters from the same seed, the same hash after every step, the loss falls`, async () => {
      const [ia, ib] = await Promise.all([a.initFromConfig(config, 3, architecture), b.initFromConfig(config, 3, architecture)])
      assert.equal(ia.param_hash, ib.param_hash, 'same seed, same initial parameters')
      assert.equal(ia.vocab_size, 4096)
      const hashes = new Set([ia.param_hash])
      const losses: number[] = []
      const setup = {optimizer: distro, lr_schedule: schedule, micro_batch: ROWS, delay_correction: true}
      await Promise.all([a.configure(setup), b.configure(setup)])
      let previous: {applyStep: number; results: Uint8Array[]} | undefined
      for (let step = 1; step <= STEPS + 1; step++) {
        const [ra, rb] = await Promise.all([a.trainRound(batch(2 * step), ROWS, step, previous), b.trainRound(batch(2 * step + 1), ROWS, step, previous)])
        assert.equal(ra.paramHash, rb.paramHash, `step ${step}: replicas differ after applying both results`)
        assert.equal(ra.applied, previous ? 2 : 0, `step ${step}: both clients' results applied`)
        hashes.add(ra.paramHash)
        losses.push((ra.loss + rb.loss) / 2)
        previous = {applyStep: step, results: [ra.result, rb.result]}
      }
      assert.equal(hashes.size, STEPS + 1, 'every step changed the parameters')
      assert.ok(
        losses.every((l) => Number.isFinite(l)),
        `finite losses: ${losses}`,
      )
      assert.ok(losses.at(-1)! < losses[0] - 0.05, `the loss falls: ${losses.map((l) => l.toFixed(3)).join(' → ')}`)
    })
  }

  it('DisTrO compresses every parameter once: a tied embedding (qwen3) once, a fused 3-D expert tensor (deepseek_v3) whole', async () => {
    for (const family of ['qwen3', 'deepseek_v3']) {
      const {architecture, config} = families[family]
      await a.initFromConfig(config, 0, architecture)
      const {resultFormat} = await a.configure({optimizer: distro, lr_schedule: schedule, micro_batch: ROWS, delay_correction: true})
      const tensors = resultFormat!.tensors
      const params = (await a.exportParams()).frames
      assert.deepEqual(tensors.map((t) => t.name).sort(), params.map((f) => f.name).sort(), `${family}: one compressed tensor per parameter`)
      if (family === 'qwen3') {
        assert.equal(config.tie_word_embeddings, true)
        assert.ok(params.some((f) => f.name === 'model.embed_tokens.weight') && !params.some((f) => f.name === 'lm_head.weight'))
      } else {
        const experts = tensors.find((t) => t.name === 'model.layers.1.mlp.experts.gate_up_proj')
        assert.equal(experts?.shape.length, 3, 'the fused experts [E, R, C]')
      }
    }
  })

  it('refuses a model of another architecture than the run names, by its model_type', async () => {
    await assert.rejects(a.initFromConfig(families.qwen2.config, 0, 'HfLlama'), /model_type 'qwen2' is not a HfLlama model .*HfAuto/)
    await assert.rejects(a.initFromConfig(families.mixtral.config, 0, 'HfDeepseek'), /model_type 'mixtral' is not a HfDeepseek model \(HfDeepseek runs deepseek_v3\)/)
  })

  it("the worker's hello reports the architectures the validator reads (python/psyche_worker/architectures.json)", async () => {
    const {reply} = await a.client.call<{architectures: Record<string, string[] | null>}>('hello')
    const ours = Object.fromEntries(Object.entries(ARCHITECTURE_MODEL_TYPES).map(([k, v]) => [k, v ? [...v] : null]))
    assert.deepEqual(ours, reply.architectures)
  })
})
