import assert from 'node:assert/strict'
import {execFileSync} from 'node:child_process'
import {existsSync, mkdtempSync, readFileSync, readdirSync, rmSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {after, describe, it} from 'node:test'
import {devicePlan} from '../../src/core/train/plan.js'
import {ModelWorker} from '../../src/core/worker/model-worker.js'
import {projectRoot, workerPython} from '../../src/core/worker/python.js'

/**
 * A client whose model is held in 2 shards (--shard 2: FSDP2 over 2 gloo ranks, python/psyche_worker/sharding.py)
 * against an unsharded one, on llama2-20m: 5 DisTrO rounds give the same result bytes, the same parameters after
 * every apply (hashes), the same losses, the same verification scores and the same exported parameters. With
 * micro-batches of one rank's rows, FSDP's sum of the 2 ranks' gradients adds the terms the unsharded accumulation
 * adds (a + b = b + a exactly), and each rank compresses and applies its own DCT chunks. Then the same two workers
 * train 3 SparseLoCo rounds of 2 inner steps each, with the same bytes again (each rank its own chunks' top-k,
 * error feedback and inner AdamW moments).
 * A checkpoint the sharded client saves (several safetensors files and an index) loads in transformers and in an
 * unsharded worker with the same parameter hash (python/tests/test_saved_model.py loads one into a sharded worker).
 *
 * `PSYCHE_TEST_SHARD_RANKS=4 node scripts/test.mjs test/worker/sharded.test.ts` runs the same against a client
 * sharded 4 ways, with 5 SparseLoCo rounds (outside the suites for their time: bench/README.md, "Memory per rank of
 * a sharded client"). The batch has 2 rows a rank, so that each rank's rows are one micro-batch (DisTrO) and each
 * inner step's (SparseLoCo).
 */
const config = JSON.parse(readFileSync(join(projectRoot, 'templates', 'llama2-20m', 'model', 'config.json'), 'utf8')) as Record<string, unknown>
const distro = {Distro: {clip_grad_norm: 1.0, compression_decay: 0.999, compression_chunk: 64, compression_topk: 8, quantize_1bit: true, weight_decay: 0.01}}
const RANKS = Number(process.env.PSYCHE_TEST_SHARD_RANKS ?? 2)
if (!Number.isInteger(RANKS) || RANKS < 2) throw new Error(`PSYCHE_TEST_SHARD_RANKS=${process.env.PSYCHE_TEST_SHARD_RANKS}: expected a whole number ≥ 2`)
const ROWS = 2 * RANKS
const SEQ = 33
const ROUNDS = 5
const sparseloco = {SparseLoCo: {inner_steps: 2, chunk: 64, topk: 32, outer_lr: 0.7}}
const SPARSELOCO_ROUNDS = RANKS === 2 ? 3 : 5
const schedule = {Constant: {base_lr: 4e-4, warmup_steps: 0, warmup_init_lr: 0}}

function batch(seed: number): Uint32Array {
  const vocab = Number(config.vocab_size)
  const out = new Uint32Array(ROWS * SEQ)
  let x = seed
  for (let i = 0; i < out.length; i++) {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0
    out[i] = x % vocab
  }
  return out
}

const workers: ModelWorker[] = []
const dirs: string[] = []
after(async () => {
  for (const w of workers) await w.shutdown().catch(() => {})
  for (const d of dirs) rmSync(d, {recursive: true, force: true})
})

async function client(shard: number) {
  const w = await ModelWorker.start({device: 'cpu', shard, threads: 1, label: `shard-${shard}`})
  workers.push(w)
  const hello = (await w.client.call<{shards: number}>('hello')).reply
  await w.initFromConfig(config, 11)
  await w.configure({optimizer: distro, lr_schedule: schedule, micro_batch: ROWS / RANKS, delay_correction: true})
  return {w, shards: hello.shards}
}

/** The unsharded and the 2-way sharded client, started once for both optimizers. */
let started: Promise<[Awaited<ReturnType<typeof client>>, Awaited<ReturnType<typeof client>>]> | undefined
const clients = () => (started ??= Promise.all([client(1), client(RANKS)]))

async function rounds(w: ModelWorker, count = ROUNDS) {
  const losses: number[] = []
  const results: Buffer[] = []
  const hashes: string[] = []
  let previous: {applyStep: number; results: Uint8Array[]} | undefined
  for (let step = 1; step <= count; step++) {
    const r = await w.trainRound(batch(step), ROWS, step, previous)
    losses.push(r.loss)
    results.push(Buffer.from(r.result))
    hashes.push(r.paramHash)
    // the client's own result and a second one (the previous round's): a round applies more than one result
    previous = {applyStep: step, results: results.length > 1 ? [r.result, results[results.length - 2]] : [r.result]}
  }
  const scores = await w.scoreResults(
    count,
    [results[count - 1]],
    [
      {tokens: batch(100), rows: ROWS},
      {tokens: batch(101), rows: ROWS},
    ],
  )
  const evaluation = await w.evaluate(batch(102), ROWS)
  return {losses, results, hashes, scores: {before: scores.before, after: scores.after}, evaluation: {loss: evaluation.loss, tokens: evaluation.tokens}}
}

describe(`a client sharded ${RANKS} ways (FSDP2 on ${RANKS} gloo ranks), llama2-20m`, () => {
  it("produces the unsharded client's results and parameters, bit for bit, for 5 DisTrO rounds; its checkpoint loads", async () => {
    const [one, two] = await clients()
    assert.equal(one.shards, 1)
    assert.equal(two.shards, RANKS)
    const a = await rounds(one.w)
    const b = await rounds(two.w)
    for (let i = 0; i < ROUNDS; i++) assert.ok(b.results[i].equals(a.results[i]), `round ${i + 1}: results differ`)
    assert.deepEqual(b.hashes, a.hashes)
    assert.deepEqual(b.losses, a.losses)
    assert.deepEqual(b.scores, a.scores)
    assert.deepEqual(b.evaluation, a.evaluation)
    // work happened: the model changed every round, the results are real DisTrO results
    assert.equal(new Set(a.hashes).size, ROUNDS)
    assert.ok(a.results.every((r) => r.length > 10_000))
    const exported = await two.w.exportParams()
    assert.equal(exported.paramHash, a.hashes[ROUNDS - 1])

    // a checkpoint in Hugging Face's layout: several safetensors files and their index
    const dir = mkdtempSync(join(tmpdir(), 'psyche-sharded-'))
    dirs.push(dir)
    const saved = join(dir, 'model')
    await two.w.save(saved, {maxShardBytes: 30_000_000})
    const files = readdirSync(saved)
    assert.ok(files.includes('model.safetensors.index.json'), `index in ${files.join(', ')}`)
    assert.ok(files.filter((f) => f.endsWith('.safetensors')).length >= 2)
    assert.ok(!existsSync(join(saved, 'model.safetensors')))
    // transformers reads it, and an unsharded worker loads it with the parameters the sharded client held
    const script = [
      'import sys, torch',
      'from transformers import AutoModelForCausalLM',
      'from psyche_worker.model import param_hash',
      'print(param_hash(AutoModelForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32)))',
    ].join('\n')
    const fromTransformers = execFileSync(workerPython(), ['-c', script, saved], {cwd: join(projectRoot, 'python'), encoding: 'utf8'})
      .trim()
      .split('\n')
      .at(-1)
    assert.equal(fromTransformers, a.hashes[ROUNDS - 1])
    const loaded = await ModelWorker.start({device: 'cpu', threads: 1, label: 'loaded'})
    workers.push(loaded)
    assert.equal((await loaded.load(saved)).param_hash, a.hashes[ROUNDS - 1])
    // the sharded client takes parameters imported whole (a joiner's model from its peers): each rank keeps its blocks
    const before = await one.w.exportParams()
    await one.w.trainRound(batch(200), ROWS, ROUNDS + 1, {applyStep: ROUNDS, results: [a.results[ROUNDS - 1]]})
    const moved = await one.w.exportParams()
    assert.notEqual(moved.paramHash, before.paramHash)
    assert.equal(await two.w.importParams(moved.frames), moved.paramHash)
    assert.equal(await two.w.paramHash(), moved.paramHash)
  })
})

describe(`a client sharded ${RANKS} ways, SparseLoCo, llama2-20m`, () => {
  it(`produces the unsharded client's results and parameters, bit for bit, for ${SPARSELOCO_ROUNDS} rounds of 2 inner steps`, async () => {
    const [one, two] = await clients()
    // each inner step's rows: one micro-batch a rank on the sharded client, one a row on the unsharded one
    const setup = {optimizer: sparseloco, lr_schedule: schedule, micro_batch: 1, delay_correction: true}
    for (const c of [one, two]) {
      await c.w.initFromConfig(config, 12)
      await c.w.configure(setup)
    }
    const a = await rounds(one.w, SPARSELOCO_ROUNDS)
    const b = await rounds(two.w, SPARSELOCO_ROUNDS)
    for (let i = 0; i < SPARSELOCO_ROUNDS; i++) assert.ok(b.results[i].equals(a.results[i]), `round ${i + 1}: results differ`)
    assert.deepEqual(b.hashes, a.hashes)
    assert.deepEqual(b.losses, a.losses)
    assert.deepEqual(b.scores, a.scores)
    assert.deepEqual(b.evaluation, a.evaluation)
    // work happened: the model changed every round, the results are SparseLoCo's
    assert.equal(new Set(a.hashes).size, SPARSELOCO_ROUNDS)
    assert.ok(a.results.every((r) => r.subarray(0, 4).toString() === 'PSSL' && r.length > 10_000))
    assert.equal((await two.w.exportParams()).paramHash, a.hashes[SPARSELOCO_ROUNDS - 1])
  })
})

describe('--shard', () => {
  it("becomes the worker's rank count, and conflicting flags are refused by name", () => {
    assert.deepEqual(devicePlan({device: 'cpu', shard: 2}), {device: 'cpu', dataParallel: 1, shard: 2})
    assert.deepEqual(devicePlan({devices: 'cuda:0,cuda:1', shard: 2}), {device: 'cuda:0,cuda:1', dataParallel: 1, shard: 2})
    assert.throws(() => devicePlan({device: 'cpu', shard: 2, dataParallel: 2}), /--shard 2 and --data-parallel 2: give one or the other \(sharded replicas, HSDP,/)
    assert.throws(() => devicePlan({devices: 'cuda:0,cuda:1,cuda:2', shard: 2}), /--shard is 2/)
  })
})
