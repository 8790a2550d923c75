import assert from 'node:assert/strict'
import {existsSync, readFileSync} from 'node:fs'
import {join} from 'node:path'
import {after, test} from 'node:test'
import {nonSnakeKeys} from '../../src/core/cli/json.js'
import {runCli, tempDir} from '../helpers.js'

// Five CLI processes, three of them with a PyTorch worker: the e2e tier (test/tiers.mjs). npm test keeps the path
// init → model init → validate-config through the README's runnable block (test/cli/readme.test.ts).
const tmp = tempDir()
after(() => tmp.cleanup())

test('psyche init then psyche model init: weights from the scaffolded config, deterministic, never overwritten by accident', async () => {
  const run = join(tmp.path, 'run')
  const init = await runCli(['init', run, '--template', 'tiny-demo'])
  assert.equal(init.exitCode, 0, init.stderr)
  assert.ok(existsSync(join(run, 'model', 'config.json')) && !existsSync(join(run, 'model', 'model.safetensors')))

  const [scaffolded, fromTemplate] = await Promise.all([
    runCli(['model', 'init', '--out', join(run, 'model'), '--json']),
    runCli(['model', 'init', '--template', 'tiny-demo', '--out', join(tmp.path, 'other'), '--json']),
  ])
  assert.equal(scaffolded.exitCode, 0, scaffolded.stderr)
  assert.equal(fromTemplate.exitCode, 0, fromTemplate.stderr)
  const a = JSON.parse(scaffolded.stdout)
  const b = JSON.parse(fromTemplate.stdout)
  // The tokenizer matches the template's vocab (4096): the demo corpus's BPE, the one the run's tokens were made with.
  for (const [m, dir] of [
    [a, join(run, 'model')],
    [b, join(tmp.path, 'other')],
  ] as const) {
    assert.match(m.tokenizer, /demo-corpus\/tokenizer\.json$/)
    const vocab = Object.keys(JSON.parse(readFileSync(join(dir, 'tokenizer.json'), 'utf8')).model.vocab).length
    assert.ok(vocab > 257 && vocab <= 4096, `a BPE of the model's vocab, not bytes: ${vocab} tokens`)
  }
  assert.equal(a.parameters, 1_475_200)
  assert.deepEqual(nonSnakeKeys(a), [], 'every --json key is snake_case')
  assert.equal(a.template, join(run, 'model', 'config.json'))
  assert.equal(a.param_hash, b.param_hash, 'same config and seed, same bytes')
  assert.ok(existsSync(join(run, 'model', 'model.safetensors')))

  const again = await runCli(['model', 'init', '--out', join(run, 'model')])
  assert.equal(again.exitCode, 1)
  assert.match(again.stderr, /already holds a model.*--force/)
  const reseeded = await runCli(['model', 'init', '--out', join(run, 'model'), '--force', '--seed', '1', '--json'])
  assert.equal(reseeded.exitCode, 0, reseeded.stderr)
  assert.notEqual(JSON.parse(reseeded.stdout).param_hash, a.param_hash)

  const validate = await runCli(['server', 'validate-config', '--state', join(run, 'state.toml')])
  assert.equal(validate.exitCode, 0, validate.stderr)
})
