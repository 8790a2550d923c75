import assert from 'node:assert/strict'
import {mkdirSync, readFileSync, writeFileSync} from 'node:fs'
import {join} from 'node:path'
import {after, before, describe, it} from 'node:test'
import {ensureDemoCorpus} from '../../src/core/corpus.js'
import {projectRoot} from '../../src/core/worker/python.js'
import {runCli, tempDir} from '../helpers.js'

/**
 * `psyche train --model DIR --steps 5` as a user runs it on a model of another family than Llama: the model's
 * config.json decides what it is (HfAuto), the demo corpus is the data, the default run's DisTrO the optimizer, two
 * runs with the same seed give the same parameter hash, and the trained model is saved with the directory's own
 * tokenizer. One dense family (qwen3, tied embeddings) and one mixture of experts (deepseek_v3, HfDeepseek's family,
 * fused 3-D experts). Every other family trains through the same command path; test/worker/architectures.test.ts
 * trains all ten in two worker processes (a CLI run costs ~5 CPU seconds, most of it importing torch and
 * transformers).
 */
const all = JSON.parse(readFileSync(join(projectRoot, 'test', 'fixtures', 'tiny-architectures.json'), 'utf8')) as Record<string, {config: Record<string, unknown>}>
const families = {qwen3: all.qwen3, deepseek_v3: all.deepseek_v3}
const tmp = tempDir()
after(() => tmp.cleanup())

describe('psyche train --model DIR of a dense and a mixture-of-experts family', () => {
  let corpusTokenizer = ''
  before(async () => {
    corpusTokenizer = (await ensureDemoCorpus()).tokenizer
  })

  for (const [family, {config}] of Object.entries(families)) {
    it(`${family}: a finite, falling loss and the same param_hash for the same seed`, async () => {
      const dir = join(tmp.path, family)
      mkdirSync(dir)
      writeFileSync(join(dir, 'config.json'), JSON.stringify(config))
      // the model's own tokenizer (the demo corpus's BPE, re-serialised: other bytes than the manifest's file)
      const ownTokenizer = JSON.stringify(JSON.parse(readFileSync(corpusTokenizer, 'utf8')))
      writeFileSync(join(dir, 'tokenizer.json'), ownTokenizer)
      const args = ['train', '--model', dir, '--steps', '5', '--total-batch', '8', '--seq-len', '32', '--lr', '5e-2', '--eval-batches', '1', '--threads', '1', '--json']
      const save = join(dir, 'trained')
      const runs = await Promise.all([0, 1].map((i) => runCli([...args, '--metrics', join(dir, `metrics-${i}.jsonl`), ...(i === 0 ? ['--save', save] : [])])))
      for (const r of runs) assert.equal(r.exitCode, 0, r.stderr)
      const [a, b] = runs.map((r) => JSON.parse(r.stdout))
      assert.equal(a.steps, 5)
      const losses = readFileSync(join(dir, 'metrics-0.jsonl'), 'utf8')
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l).loss as number)
      assert.equal(losses.length, 5)
      assert.ok(
        losses.every((l) => Number.isFinite(l)),
        `finite: ${losses}`,
      )
      assert.ok(a.last_loss < a.first_loss - 0.1, `the loss falls: ${losses.map((l) => l.toFixed(3)).join(' → ')}`)
      assert.match(a.param_hash, /^[0-9a-f]{64}$/)
      assert.equal(a.param_hash, b.param_hash, 'the same seed, the same parameters')
      assert.equal(readFileSync(join(save, 'tokenizer.json'), 'utf8'), ownTokenizer, "saved with the model's own tokenizer")
      assert.equal(JSON.parse(readFileSync(join(save, 'config.json'), 'utf8')).model_type, family)
    })
  }
})
