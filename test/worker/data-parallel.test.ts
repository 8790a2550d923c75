import assert from 'node:assert/strict'
import {readFileSync} from 'node:fs'
import {join} from 'node:path'
import {after, describe, it} from 'node:test'
import {devicePlan} from '../../src/core/train/plan.js'
import {ModelWorker} from '../../src/core/worker/model-worker.js'
import {projectRoot} from '../../src/core/worker/python.js'

/**
 * Data parallelism inside one client (python/psyche_worker/parallel.py): a worker started with
 * --device cpu,cpu runs each batch across 2 gloo ranks and answers as one worker. The same batch through a
 * 1-rank worker must give the same loss, the same DisTrO result bytes and the same parameter hash. With
 * micro-batches equal to each rank's shard, the 2-rank all-reduce adds the same two terms the 1-rank
 * gradient accumulation adds (a + b = b + a exactly in IEEE), so equality is exact, not approximate; with
 * other micro-batch sizes the sums differ in reduction order (measured below, in floating-point ulps).
 */
const config = JSON.parse(readFileSync(join(projectRoot, 'templates', 'tiny-demo', 'model', 'config.json'), 'utf8')) as Record<string, unknown>
const small: Record<string, unknown> = {...config, hidden_size: 32, intermediate_size: 64, num_hidden_layers: 2, num_attention_heads: 2, num_key_value_heads: 2}
const distro = {Distro: {clip_grad_norm: 1.0, compression_decay: 0.96, compression_chunk: 16, compression_topk: 4, quantize_1bit: true}}
const ROWS = 8
const SEQ = 33

function batch(seed: number): Uint32Array {
  const vocab = Number(small.vocab_size)
  const out = new Uint32Array(ROWS * SEQ)
  let x = seed
  for (let i = 0; i < out.length; i++) {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0
    out[i] = x % vocab
  }
  return out
}

async function rounds(
  device: string,
  microBatch: number,
  precision: 'auto' | 'fp32' | 'bf16' = 'auto',
): Promise<{losses: number[]; results: Buffer[]; hashes: string[]; dataParallel: number; precision: string}> {
  const w = await ModelWorker.start({device, threads: 1, precision, label: `dp-${device}`})
  workers.push(w)
  const hello = (await w.client.call<{data_parallel: number; precision: string}>('hello')).reply
  await w.initFromConfig(small, 7)
  await w.configure({optimizer: distro, lr_schedule: {Constant: {base_lr: 1e-2, warmup_steps: 0, warmup_init_lr: 0}}, micro_batch: microBatch, delay_correction: true})
  const losses: number[] = []
  const results: Buffer[] = []
  const hashes: string[] = []
  let previous: {applyStep: number; results: Uint8Array[]} | undefined
  for (let step = 1; step <= 3; step++) {
    const r = await w.trainRound(batch(step), ROWS, step, previous)
    losses.push(r.loss)
    results.push(Buffer.from(r.result))
    hashes.push(r.paramHash)
    previous = {applyStep: step, results: [r.result]}
  }
  await w.shutdown()
  return {losses, results, hashes, dataParallel: hello.data_parallel, precision: hello.precision}
}

const workers: ModelWorker[] = []
after(async () => {
  for (const w of workers) await w.shutdown().catch(() => {})
})

describe('data parallelism inside one client (2 gloo ranks on CPU)', () => {
  it('gives the 1-rank loss, result bytes and parameter hash, bit for bit, with micro-batches of one shard', async () => {
    const one = await rounds('cpu', ROWS / 2)
    const two = await rounds('cpu,cpu', ROWS / 2)
    assert.equal(one.dataParallel, 1)
    assert.equal(two.dataParallel, 2)
    assert.deepEqual(two.losses, one.losses)
    for (let i = 0; i < one.results.length; i++) assert.ok(two.results[i].equals(one.results[i]), `step ${i + 1}: results differ`)
    assert.deepEqual(two.hashes, one.hashes)
    // Work happened: the model changed every round, and the results are real DisTrO results.
    assert.equal(new Set(one.hashes).size, 3)
    assert.ok(one.results.every((r) => r.length > 100))
  })

  it('--precision bf16 reaches every rank: 2 bf16 ranks equal 1 bf16 rank bit for bit, and differ from fp32', async () => {
    const fp32 = await rounds('cpu', ROWS / 2)
    const one = await rounds('cpu', ROWS / 2, 'bf16')
    const two = await rounds('cpu,cpu', ROWS / 2, 'bf16')
    assert.equal(fp32.precision, 'fp32') // auto on CPU
    assert.equal(one.precision, 'bf16')
    assert.equal(two.precision, 'bf16')
    assert.deepEqual(two.losses, one.losses)
    assert.deepEqual(two.hashes, one.hashes)
    for (let i = 0; i < one.results.length; i++) assert.ok(two.results[i].equals(one.results[i]), `step ${i + 1}: bf16 results differ`)
    // autocast ran (a rank left in fp32 would make the 2-rank losses differ from the 1-rank bf16 ones, too)
    assert.notDeepEqual(one.losses, fp32.losses)
    for (let i = 0; i < one.losses.length; i++) assert.ok(Math.abs(one.losses[i] - fp32.losses[i]) < 0.05 * fp32.losses[i], 'bf16 loss near the fp32 loss')
    assert.equal(new Set(one.hashes).size, 3)
  })
})

describe('--devices / --data-parallel', () => {
  it("become the worker's device list and rank count, and conflicting flags are refused by name", () => {
    assert.deepEqual(devicePlan({devices: 'cuda:0, cuda:1'}), {device: 'cuda:0,cuda:1', dataParallel: 1, shard: 1})
    assert.deepEqual(devicePlan({device: 'cpu', dataParallel: 2}), {device: 'cpu', dataParallel: 2, shard: 1})
    assert.deepEqual(devicePlan({}), {device: 'auto', dataParallel: 1, shard: 1})
    assert.throws(() => devicePlan({devices: 'cuda:0,tpu'}), /--devices cuda:0,tpu/)
    assert.throws(() => devicePlan({devices: 'cuda:0,cuda:1', dataParallel: 3}), /--data-parallel/)
    assert.throws(() => devicePlan({devices: 'cuda:0,cuda:1', device: 'cpu'}), /--devices and --device/)
  })
})
