import assert from 'node:assert/strict'
import {existsSync, mkdirSync, readFileSync, writeFileSync} from 'node:fs'
import {join} from 'node:path'
import {after, before, describe, it} from 'node:test'
import {ensureDemoCorpus} from '../../src/core/corpus.js'
import {ModelWorker} from '../../src/core/worker/model-worker.js'
import {projectRoot} from '../../src/core/worker/python.js'
import {runCli, tempDir} from '../helpers.js'

/**
 * `psyche train --model DIR --steps 5` as a user runs it, for every family of test/fixtures/tiny-architectures.json
 * (llama, qwen2, qwen3, mistral, gemma3_text, olmo2, gpt_neox, deepseek_v3, qwen3_moe, mixtral): DIR holds the
 * family's config.json and a tokenizer.json of its own, so the model's config.json decides what it is (HfAuto), the
 * demo corpus is the data and the default run's DisTrO the optimizer. Each run must give finite losses that fall,
 * a parameter hash other than the one the model starts from, and a saved model that loads (with the trained hash,
 * its model_type and its own tokenizer). deepseek_v3 (routing decides each gradient) trains twice: the same seed,
 * the same param_hash.
 *
 * One CLI process (one worker) per run, two at a time (one torch thread each); one more worker in this process
 * makes each family's starting parameters (the same seed and architecture as the CLI's) and loads what each run saved.
 */
const families = JSON.parse(readFileSync(join(projectRoot, 'test', 'fixtures', 'tiny-architectures.json'), 'utf8')) as Record<string, {config: Record<string, unknown>}>
const tmp = tempDir()
let worker: ModelWorker | undefined
after(async () => {
  await worker?.shutdown().catch(() => {})
  tmp.cleanup()
})

/** One call at a time to the test's own worker (its model is whichever was created last). */
let workerQueue: Promise<unknown> = Promise.resolve()
function withWorker<T>(fn: (w: ModelWorker) => Promise<T>): Promise<T> {
  const next = workerQueue.then(() => fn(worker!))
  workerQueue = next.catch(() => {})
  return next
}

describe('psyche train --model DIR --steps 5 for every architecture family', {concurrency: 2}, () => {
  let ownTokenizer = ''
  before(async () => {
    const [corpus, w] = await Promise.all([ensureDemoCorpus(), ModelWorker.start({threads: 1, device: 'cpu', label: 'families'})])
    worker = w
    // the model's own tokenizer: the demo corpus's BPE, re-serialised (other bytes than the manifest's file)
    ownTokenizer = JSON.stringify(JSON.parse(readFileSync(corpus.tokenizer, 'utf8')))
  })

  const firstRuns = new Map<string, ReturnType<typeof train>>()
  async function train(family: string, run: string, save: boolean) {
    const dir = join(tmp.path, family)
    if (!existsSync(dir)) {
      mkdirSync(dir)
      writeFileSync(join(dir, 'config.json'), JSON.stringify(families[family].config))
      writeFileSync(join(dir, 'tokenizer.json'), ownTokenizer)
    }
    const metrics = join(dir, `metrics-${run}.jsonl`)
    const saveTo = join(dir, `trained-${run}`)
    const args = ['train', '--model', dir, '--steps', '5', '--total-batch', '8', '--seq-len', '32', '--lr', '5e-2', '--eval-batches', '1', '--threads', '1', '--json']
    const r = await runCli([...args, '--metrics', metrics, ...(save ? ['--save', saveTo] : [])])
    assert.equal(r.exitCode, 0, `${family}: ${r.stderr}`)
    const summary = JSON.parse(r.stdout) as {steps: number; first_loss: number; last_loss: number; param_hash: string}
    const losses = readFileSync(metrics, 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l).loss as number)
    return {dir, saveTo, summary, losses}
  }

  for (const family of Object.keys(families)) {
    it(`${family}: finite, falling losses; the parameters changed; the saved model loads with the trained hash`, async () => {
      const start = await withWorker((w) => w.initFromConfig(families[family].config, 0, 'HfAuto'))
      const run = train(family, 'a', true)
      firstRuns.set(family, run)
      const {saveTo, summary, losses} = await run
      assert.equal(summary.steps, 5)
      assert.equal(losses.length, 5)
      assert.ok(
        losses.every((l) => Number.isFinite(l)),
        `finite: ${losses}`,
      )
      assert.ok(summary.last_loss < summary.first_loss - 0.1, `the loss falls: ${losses.map((l) => l.toFixed(3)).join(' → ')}`)
      assert.match(summary.param_hash, /^[0-9a-f]{64}$/)
      assert.notEqual(summary.param_hash, start.param_hash, 'training changed the parameters it started from')
      const loaded = await withWorker((w) => w.load(saveTo, 0, 'HfAuto'))
      assert.equal(loaded.param_hash, summary.param_hash, 'the saved model is the trained one')
      assert.equal(JSON.parse(readFileSync(join(saveTo, 'config.json'), 'utf8')).model_type, family)
      assert.equal(readFileSync(join(saveTo, 'tokenizer.json'), 'utf8'), ownTokenizer, "saved with the model's own tokenizer")
    })
  }

  it('deepseek_v3 again: the same seed, the same param_hash', async () => {
    const b = await train('deepseek_v3', 'b', false)
    const a = await firstRuns.get('deepseek_v3')!
    assert.deepEqual(a.losses, b.losses)
    assert.equal(a.summary.param_hash, b.summary.param_hash)
  })
})
