import assert from 'node:assert/strict'
import {readFileSync, writeFileSync, mkdirSync} from 'node:fs'
import {join} from 'node:path'
import {after, before, describe, test} from 'node:test'
import {execa} from 'execa'
import {nonSnakeKeys} from '../../src/core/cli/json.js'
import {demoCorpusDir, ensureDemoCorpus} from '../../src/core/corpus.js'
import {python} from '../checkpoint/helpers.js'
import {processAlive, runCli, startCli, tempDir, tinyModelConfig, waitFor} from '../helpers.js'

/** The pid of the PyTorch worker that the CLI process `parent` started (waits for it to appear). */
async function workerPidOf(parent: number): Promise<number> {
  let pid = 0
  await waitFor(
    async () => {
      const r = await execa('pgrep', ['-P', String(parent), '-f', 'psyche_worker'], {reject: false})
      pid = Number(String(r.stdout).trim().split('\n')[0])
      return pid > 0
    },
    60_000,
    'the worker process',
  )
  return pid
}

describe('psyche train (real CLI, worker and ZeroMQ)', () => {
  const tmp = tempDir()
  before(async () => {
    await ensureDemoCorpus()
  })
  after(() => tmp.cleanup())

  test('trains the demo model for 30 steps and the loss falls', async () => {
    const metrics = join(tmp.path, 'metrics.jsonl')
    const r = await runCli(['train', '--steps', '30', '--json', '--threads', '2', '--metrics', metrics])
    assert.equal(r.exitCode, 0, r.stderr)
    const summary = JSON.parse(r.stdout)
    for (const key of ['steps', 'tokens', 'wall_seconds', 'tokens_per_second', 'first_loss', 'last_loss', 'param_hash']) assert.ok(key in summary, `summary has ${key}`)
    assert.deepEqual(nonSnakeKeys(summary), [], 'every --json key is snake_case')
    assert.equal(summary.steps, 30)
    assert.equal(summary.tokens, 30 * 16 * 128)
    assert.ok(summary.first_loss > 8, `random init loss ~ln(4096)=8.3, got ${summary.first_loss}`)
    assert.ok(summary.last_loss < summary.first_loss - 1, `loss fell: ${summary.first_loss} → ${summary.last_loss}`)
    assert.ok(summary.val_loss < summary.first_val_loss - 1, `validation loss fell: ${summary.first_val_loss} → ${summary.val_loss}`)
    assert.match(summary.param_hash, /^[0-9a-f]{64}$/)
    const lines = readFileSync(metrics, 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l))
    assert.equal(lines.length, 30)
    assert.deepEqual(
      lines.map((l) => l.step),
      [...Array(30).keys()],
    )
    assert.ok(lines.every((l) => Number.isFinite(l.loss) && l.tokens === 16 * 128))
  })

  test('same seed gives the same parameter hash; another seed does not; --save writes a loadable model', async () => {
    const args = ['train', '--steps', '3', '--total-batch', '4', '--seq-len', '32', '--json', '--threads', '1', '--eval-batches', '1']
    const save = join(tmp.path, 'saved')
    const [a, b, c] = await Promise.all([
      runCli([...args, '--seed', '5', '--metrics', join(tmp.path, 'a.jsonl'), '--save', save]),
      runCli([...args, '--seed', '5', '--metrics', join(tmp.path, 'b.jsonl')]),
      runCli([...args, '--seed', '6', '--metrics', join(tmp.path, 'c.jsonl')]),
    ])
    for (const r of [a, b, c]) assert.equal(r.exitCode, 0, r.stderr)
    const [ha, hb, hc] = [a, b, c].map((r) => JSON.parse(r.stdout).param_hash)
    assert.equal(ha, hb)
    assert.notEqual(ha, hc)
    // the saved model reloads with the same bytes (a step at lr 1e-30 moves no float32 parameter)
    const reloaded = await runCli([
      'train',
      '--model',
      save,
      '--steps',
      '1',
      '--total-batch',
      '1',
      '--seq-len',
      '8',
      '--lr',
      '1e-30',
      '--json',
      '--threads',
      '1',
      '--eval-batches',
      '1',
      '--metrics',
      join(tmp.path, 'r.jsonl'),
    ])
    assert.equal(reloaded.exitCode, 0, reloaded.stderr)
    assert.equal(JSON.parse(reloaded.stdout).param_hash, ha)
    assert.ok(readFileSync(join(save, 'config.json'), 'utf8').includes('"vocab_size": 4096'))
    // with the tokenizer its training data was made with, a model card, and loadable by plain transformers
    assert.deepEqual(readFileSync(join(save, 'tokenizer.json')), readFileSync(join(demoCorpusDir, 'tokenizer.json')))
    assert.match(readFileSync(join(save, 'README.md'), 'utf8'), new RegExp(ha))
    const loaded = await python(`
import json
from transformers import AutoModelForCausalLM, AutoTokenizer
m = AutoModelForCausalLM.from_pretrained(${JSON.stringify(save)})
t = AutoTokenizer.from_pretrained(${JSON.stringify(save)})
ids = t("State of the Union")["input_ids"]
print(json.dumps({"ids": ids, "text": t.decode(ids), "logits": list(m(__import__("torch").tensor([ids])).logits.shape)}))
`)
    assert.equal(loaded.text, 'State of the Union')
    assert.deepEqual(loaded.logits, [1, loaded.ids.length, 4096])
  })

  test('AdamW and DisTrO with simulated peers both train; DisTrO reports its bytes per step', async () => {
    const common = ['train', '--steps', '12', '--total-batch', '8', '--micro-batch', '4', '--json', '--threads', '1', '--eval-batches', '2']
    const [adamw, distro] = await Promise.all([
      runCli([...common, '--optimizer', 'adamw', '--metrics', join(tmp.path, 'adamw.jsonl')]),
      runCli([...common, '--optimizer', 'distro', '--simulate-peers', '2', '--metrics', join(tmp.path, 'distro.jsonl')]),
    ])
    assert.equal(adamw.exitCode, 0, adamw.stderr)
    assert.equal(distro.exitCode, 0, distro.stderr)
    const a = JSON.parse(adamw.stdout)
    const d = JSON.parse(distro.stdout)
    assert.ok(a.last_loss < a.first_loss - 0.5, `AdamW loss fell: ${a.first_loss} → ${a.last_loss}`)
    assert.ok(d.last_loss < d.first_loss - 0.5, `DisTrO loss fell: ${d.first_loss} → ${d.last_loss}`)
    assert.equal(a.distro, undefined)
    assert.equal(d.distro.peers, 2)
    assert.equal(d.distro.dense_bytes, 4 * d.parameters)
    assert.ok(d.distro.compression > 500, `a DisTrO result is much smaller than a dense update (${d.distro.compression}×)`)
    const bad = await runCli([...common, '--optimizer', 'distro', '--simulate-peers', '3'])
    assert.notEqual(bad.exitCode, 0)
    assert.match(JSON.parse(bad.stdout).error.message, /total-batch 8 does not split evenly among 3 simulated peers/)
    const late = await runCli([...common, '--optimizer', 'distro', '--simulate-peers', '2', '--simulate-delay'])
    assert.notEqual(late.exitCode, 0)
    assert.match(JSON.parse(late.stdout).error.message, /--simulate-delay: only SparseLoCo/)
  })

  test("SparseLoCo's simulated clients with --simulate-delay: round 1 as without it, round 2 starts before round 1's results are applied", async () => {
    // 2 rounds of the template's H = 20 inner steps, 2 simulated clients of one row each
    const common = [
      'train',
      '--template',
      'tiny-sparseloco',
      '--steps',
      '2',
      '--total-batch',
      '40',
      '--micro-batch',
      '4',
      '--simulate-peers',
      '2',
      '--json',
      '--threads',
      '1',
      '--eval-batches',
      '2',
    ]
    const [now, late] = await Promise.all([
      runCli([...common, '--metrics', join(tmp.path, 'now.jsonl')]),
      runCli([...common, '--simulate-delay', '--metrics', join(tmp.path, 'late.jsonl')]),
    ])
    assert.equal(now.exitCode, 0, now.stderr)
    assert.equal(late.exitCode, 0, late.stderr)
    const losses = (f: string) =>
      readFileSync(join(tmp.path, f), 'utf8')
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l).loss as number)
    const [a, b] = [losses('now.jsonl'), losses('late.jsonl')]
    assert.equal(a.length, 2)
    assert.equal(a[0], b[0], 'round 1 has no earlier results to apply late')
    assert.notEqual(a[1], b[1], "round 2's inner steps start elsewhere when round 1's results are applied late")
    assert.notEqual(JSON.parse(now.stdout).param_hash, JSON.parse(late.stdout).param_hash)
  })

  test('a worker killed mid-run gives a clear error and leaves no process behind', async () => {
    const cli = startCli(['train', '--steps', '400', '--threads', '1', '--metrics', join(tmp.path, 'k.jsonl')])
    const workerPid = await workerPidOf(cli.pid!)
    // let it get into training (the metrics file gets lines)
    await waitFor(
      () => {
        try {
          return readFileSync(join(tmp.path, 'k.jsonl'), 'utf8').split('\n').length > 2
        } catch {
          return false
        }
      },
      90_000,
      'training steps',
    )
    process.kill(workerPid, 'SIGKILL')
    const r = await cli
    assert.notEqual(r.exitCode, 0)
    assert.match(String(r.stderr), new RegExp(`worker \\(pid ${workerPid}\\) was killed by SIGKILL`))
    assert.equal(processAlive(workerPid), false)
  })

  test('interrupting the CLI (SIGTERM) takes its worker down too', async () => {
    const cli = startCli(['train', '--steps', '400', '--threads', '1', '--metrics', join(tmp.path, 't.jsonl')])
    const workerPid = await workerPidOf(cli.pid!)
    cli.kill('SIGTERM')
    await cli
    await waitFor(() => !processAlive(workerPid), 10_000, 'the worker to exit')
  })
})

describe('psyche train: bad input gets one clear line and a non-zero exit', () => {
  const tmp = tempDir()
  after(() => tmp.cleanup())

  async function expectError(args: string[], pattern: RegExp, exit?: number) {
    const r = await runCli(args)
    if (exit !== undefined) assert.equal(r.exitCode, exit, r.stderr)
    else assert.notEqual(r.exitCode, 0)
    assert.match(r.stderr, pattern)
    assert.doesNotMatch(r.stderr, /\n\s+at .+:\d+:\d+/, 'no stack trace')
  }

  test('missing config file', async () => {
    await expectError(['train', '--config', join(tmp.path, 'nope.toml')], /nope\.toml/)
  })

  test('malformed config', async () => {
    const path = join(tmp.path, 'bad.toml')
    writeFileSync(path, 'run_id = "x"\n[model.LLM\narchitecture = "HfLlama"\n')
    await expectError(['train', '--config', path], /bad\.toml/)
  })

  test('a config field with the wrong type names the field', async () => {
    const path = join(tmp.path, 'field.toml')
    const text = readFileSync(join(import.meta.dirname, '..', '..', 'templates', 'tiny-demo', 'state.toml'), 'utf8').replace('max_seq_len = 128', 'max_seq_len = "long"')
    writeFileSync(path, text)
    await expectError(['train', '--config', path], /field\.toml.*max_seq_len/)
  })

  test('model directory without config.json', async () => {
    mkdirSync(join(tmp.path, 'empty-model'))
    await expectError(['train', '--model', join(tmp.path, 'empty-model'), '--steps', '1'], /empty-model.*config\.json/)
  })

  test('token file whose size is not a multiple of the token size', async () => {
    const dir = join(tmp.path, 'odd-tokens')
    mkdirSync(dir)
    writeFileSync(join(dir, 'data.bin'), Buffer.alloc(1001))
    await expectError(['train', '--data', dir, '--steps', '1'], /data\.bin.*1001.*multiple/)
  })

  test('data tokenized with a larger vocabulary than the model', async () => {
    const dir = join(tmp.path, 'big-vocab')
    mkdirSync(dir)
    writeFileSync(join(dir, '000.bin'), Buffer.alloc(2 * 4096))
    writeFileSync(join(dir, 'manifest.json'), JSON.stringify({format: 'psyche-tokens/1', token_size: 2, vocab_size: 50257, tokens: 4096, files: ['000.bin']}))
    const model = join(tmp.path, 'small-model')
    mkdirSync(model)
    writeFileSync(join(model, 'config.json'), JSON.stringify(tinyModelConfig))
    await expectError(['train', '--model', model, '--data', dir, '--steps', '1', '--seq-len', '16'], /big-vocab.*50257.*4096/)
  })

  test('an unknown optimizer is a usage error (exit 2); one in a config names the field', async () => {
    await expectError(['train', '--optimizer', 'lion'], /lion/, 2)
    const path = join(tmp.path, 'opt.toml')
    const text = readFileSync(join(import.meta.dirname, '..', '..', 'templates', 'tiny-demo', 'state.toml'), 'utf8').replace(
      '[model.LLM.optimizer.Distro]',
      '[model.LLM.optimizer.Lion]',
    )
    writeFileSync(path, text)
    await expectError(['train', '--config', path], /opt\.toml.*optimizer/)
  })
})
