import assert from 'node:assert/strict'
import {readdirSync, readFileSync, statSync} from 'node:fs'
import {dirname, join} from 'node:path'
import {describe, it} from 'node:test'
import {fileURLToPath} from 'node:url'
import {parse as parseToml} from 'smol-toml'
import {
  ConfigError,
  checkDataServerForRun,
  loadDataServerConfig,
  loadRunConfigFile,
  parseDataServerConfig,
  parseRunConfig,
  resolveConfigPath,
  summarizeRunConfig,
  unsupportedFeatures,
  validateRunConfig,
  type SparseLoCoConfig,
} from '../../src/core/config/index.js'

const fixtures = join(dirname(fileURLToPath(import.meta.url)), '..', 'fixtures')
const root = join(fixtures, '..', '..')

function tomlFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name)
    return statSync(path).isDirectory() ? tomlFiles(path) : name.endsWith('.toml') ? [path] : []
  })
}

/** Drops keys whose value is undefined, so a parsed file compares with the raw TOML. */
function plain(value: unknown): unknown {
  return JSON.parse(JSON.stringify(value))
}

function expectIssue(text: string, path: string, expected: string): ConfigError {
  try {
    parseRunConfig(text, path)
  } catch (error) {
    assert.ok(error instanceof ConfigError, `expected a ConfigError, got ${error}`)
    const all = error.issues.map((i) => `${i.file}: ${i.path}${i.value === undefined ? '' : ` = ${i.value}`}: ${i.message}`)
    assert.ok(error.message.includes(expected) || all.some((line) => line.includes(expected)), `expected "${expected}" among:\n${all.join('\n')}`)
    return error
  }
  assert.fail(`${path} should not load`)
}

describe("Psyche's own configs (test/fixtures/psyche-configs)", () => {
  const files = tomlFiles(join(fixtures, 'psyche-configs'))
  it('finds all 16 files', () => assert.equal(files.length, 16))
  it('are unchanged copies of ../shared/psyche-configs (when that folder is present)', (t) => {
    const shared = '/work/shared/psyche-configs'
    if (!statSync(shared, {throwIfNoEntry: false})) return t.skip('no shared folder on this machine')
    const theirs = tomlFiles(shared)
    assert.equal(theirs.length, files.length)
    for (const file of theirs) assert.equal(readFileSync(join(fixtures, 'psyche-configs', file.slice(shared.length + 1)), 'utf8'), readFileSync(file, 'utf8'))
  })
  for (const file of files) {
    const name = file.slice(file.indexOf('psyche-configs'))
    it(`loads ${name} without losing a field`, async () => {
      const raw = parseToml(readFileSync(file, 'utf8')) as Record<string, unknown>
      if (file.endsWith('data.toml')) {
        const data = await loadDataServerConfig(file)
        assert.deepEqual({...(plain(data) as object), path: undefined}, {...(plain(raw) as object), path: undefined})
        return
      }
      const run = await loadRunConfigFile(file)
      // Every field of the file is kept, unchanged (round trip); the loader only adds defaults.
      const loaded = plain({run_id: run.run_id, run_state: run.run_state, config: run.config, model: run.model}) as Record<string, unknown>
      assert.deepEqual(plain(raw), loaded)
      assert.equal(summarizeRunConfig(run).total_steps, (raw.config as {total_steps: number}).total_steps)
    })
  }

  it('names what our clients cannot run, from the support table, in every Psyche config', async () => {
    const unsupported = async (file: string) => unsupportedFeatures(await loadRunConfigFile(join(fixtures, 'psyche-configs', file))).map((u) => [u.path, u.reason])
    const gcs = await unsupported('solana-test/light-config-gcs.toml')
    assert.deepEqual(
      gcs.map(([path]) => path),
      ['model.LLM.checkpoint.Gcs'],
    )
    assert.match(gcs[0][1], /no GCS credentials support/)
    // a Gcp bucket, a single URL and a data server: served
    for (const file of ['solana-test/light-config.toml', 'solana-test/nano-config.toml', 'llama2-20m-dolma-noverify-first-checkpointer/state.toml']) {
      assert.deepEqual(await unsupported(file), [], file)
    }
    // consilience: its WeightedHttp data and its DeepSeek-V3 model (DisTrO over fused 3-D experts) are served
    assert.deepEqual(await unsupported('consilience/state.toml'), [])
    assert.deepEqual(
      (await unsupported('test/state.toml')).map(([path]) => path),
      ['model.LLM.data_location', 'model.LLM.optimizer'],
    )
  })

  it('Finetuning needs data with loss masks (Preprocessed), named on data_type', async () => {
    const text = readFileSync(join(fixtures, 'psyche-configs/llama2-20m-dolma-noverify-first-checkpointer/state.toml'), 'utf8').replace(
      'data_type = "Pretraining"',
      'data_type = "Finetuning"',
    )
    const run = parseRunConfig(text, 'finetune.toml')
    assert.deepEqual(
      unsupportedFeatures(run).map((u) => u.path),
      ['model.LLM.data_type'],
    )
    assert.match(unsupportedFeatures(run)[0].reason, /only Preprocessed data carries; data_location Server is a token stream/)
    const preprocessed = parseRunConfig(text.replace(/\[model\.LLM\.data_location\]\nServer = "[^"]*"/, '[model.LLM.data_location]\nPreprocessed = "chat"'), 'finetune.toml')
    assert.deepEqual(unsupportedFeatures(preprocessed), [])
  })

  it('keeps big integers exact (consilience: 540B warmup tokens)', async () => {
    const run = await loadRunConfigFile(join(fixtures, 'psyche-configs/consilience/state.toml'))
    assert.equal(run.config!.global_batch_size_warmup_tokens, 549755813888)
    assert.deepEqual(Object.keys(run.model.LLM.lr_schedule), ['WarmupStableDecay'])
    assert.deepEqual(run.model.LLM.data_location, {WeightedHttp: 'https://storage.googleapis.com/nous-pretraining-public-us/consilience-stage1-mix.json'})
  })

  it('checks a data.toml against the run it feeds', async () => {
    const dir = join(fixtures, 'psyche-configs/consilience-match-llama2-20m-fineweb-pretrain-dev')
    const run = await loadRunConfigFile(join(dir, 'state.toml'))
    const data = await loadDataServerConfig(join(dir, 'data.toml'))
    assert.deepEqual(checkDataServerForRun(run, data), {errors: [], warnings: []})
    const {errors} = checkDataServerForRun(run, {...data, seq_len: 2048})
    assert.equal(errors.length, 1)
    assert.equal(errors[0].path, 'seq_len')
    assert.match(errors[0].message, /max_seq_len \(512\)/)
    const other = await loadRunConfigFile(join(fixtures, 'psyche-configs/solana-test/nano-config.toml'))
    assert.match(checkDataServerForRun(other, {...data, seq_len: 64}).warnings[0].message, /unused/)
  })
})

describe('broken configs (test/fixtures/broken-configs)', () => {
  const dir = join(fixtures, 'broken-configs')
  for (const name of readdirSync(dir)
    .filter((n) => n.endsWith('.toml'))
    .sort()) {
    it(`rejects ${name}, naming the field`, () => {
      const text = readFileSync(join(dir, name), 'utf8')
      const expected = /^# expect: (.*)$/m.exec(text)?.[1]
      assert.ok(expected, `${name} needs an "# expect:" line`)
      const error = expectIssue(text, `broken/${name}`, expected)
      assert.ok(error.message.startsWith(`broken/${name}`), 'the message starts with the file name')
      assert.ok(!error.message.includes('\n'), 'the message is one line')
    })
  }
})

describe('parseRunConfig', () => {
  const good = readFileSync(join(fixtures, 'psyche-configs/test/state.toml'), 'utf8')

  it('formats an issue as file: field = value: expectation', () => {
    const error = expectIssue(good.replace('min_clients = 2\n', 'min_clients = 0\n'), 'state.toml', 'state.toml: config.min_clients = 0: must be ≥ 1')
    assert.match(error.message, /^state\.toml: config\.min_clients = 0: must be ≥ 1/)
  })

  it('reports every problem at once, not just the first', () => {
    const text = good.replace('min_clients = 2\n', 'min_clients = 0\n').replace('warmup_time = 5\n', 'warmup_time = -1\n').replace('max_seq_len = 512', 'max_seq_len = "x"')
    const error = expectIssue(text, 'state.toml', 'config.warmup_time = -1: must be ≥ 0')
    assert.equal(error.issues.length, 3)
    assert.match(error.message, /and 2 more problems/)
  })

  it('does not report a cross-field rule on a field already reported', () => {
    // min_clients = 0 alone is the mistake; "init_min_clients ≥ min_clients" would be noise.
    const error = expectIssue(good.replace('min_clients = 2\n', 'min_clients = 0\n'), 's', 'must be ≥ 1')
    assert.equal(error.issues.length, 1)
  })

  it("keeps Psyche's integer seconds, and accepts fractions of a second (our extension, millisecond precision)", () => {
    const integers = parseRunConfig(good, 'state.toml')
    assert.ok(Number.isInteger(integers.config!.round_witness_time))
    const text = good.replace(/round_witness_time = \d+\n/, 'round_witness_time = 0.25\n').replace(/warmup_time = \d+\n/, 'warmup_time = 0.5\n')
    const run = parseRunConfig(text, 'state.toml')
    assert.equal(run.config!.round_witness_time, 0.25)
    assert.equal(run.config!.warmup_time, 0.5)
    expectIssue(
      good.replace(/round_witness_time = \d+\n/, 'round_witness_time = 0.0005\n'),
      'state.toml',
      'config.round_witness_time = 0.0005: must be a whole number of milliseconds',
    )
    expectIssue(good.replace(/round_witness_time = \d+\n/, 'round_witness_time = 0\n'), 'state.toml', 'config.round_witness_time = 0: must be ≥ 1')
    expectIssue(good.replace(/round_witness_time = \d+\n/, 'round_witness_time = -0.5\n'), 'state.toml', 'config.round_witness_time = -0.5: must be > 0')
    expectIssue(good.replace(/warmup_time = \d+\n/, 'warmup_time = -0.5\n'), 'state.toml', 'config.warmup_time = -0.5: must be ≥ 0')
  })

  it("fills Psyche's defaults for optional fields", () => {
    const text = good.replace('waiting_for_members_extra_time = 3\n', '').replace('verification_percent = 0\n', '').replace('cold_start_warmup_steps = 0\n', '')
    const run = parseRunConfig(text, 'state.toml')
    assert.equal(run.config!.waiting_for_members_extra_time, 3)
    assert.equal(run.config!.verification_percent, 0)
    assert.equal(run.model.LLM.cold_start_warmup_steps, 0)
  })

  it('verification_sample (our extension): optional, 1 to 64 results per verifier per round', () => {
    assert.equal(parseRunConfig(good, 'state.toml').config!.verification_sample, undefined)
    const withSample = (k: string) => good.replace('verification_percent = 0\n', `verification_percent = 0\nverification_sample = ${k}\n`)
    assert.equal(parseRunConfig(withSample('8'), 'state.toml').config!.verification_sample, 8)
    expectIssue(withSample('0'), 'state.toml', 'config.verification_sample = 0: must be ≥ 1')
    expectIssue(withSample('65'), 'state.toml', 'config.verification_sample = 65: must be ≤ 64')
  })

  it('accepts unit variants as bare strings and data variants as tables', () => {
    const run = parseRunConfig(good, 'state.toml')
    assert.equal(run.model.LLM.optimizer, 'Dummy')
    assert.equal(run.model.LLM.data_location, 'Dummy')
    assert.deepEqual(run.model.LLM.checkpoint, {Dummy: {repo_id: ''}})
    expectIssue(good.replace('optimizer = "Dummy"', 'optimizer = "Distro"'), 's', 'model.LLM.optimizer = "Distro": variant Distro needs fields')
  })

  it('accepts every lr schedule and optimizer variant', () => {
    const lrs = {
      Constant: 'base_lr = 1e-3\nwarmup_steps = 10\nwarmup_init_lr = 0.0',
      Linear: 'base_lr = 1e-3\nwarmup_steps = 10\nwarmup_init_lr = 0.0\ntotal_steps = 100\nfinal_lr = 1e-4',
      Cosine: 'base_lr = 1e-3\nwarmup_steps = 10\nwarmup_init_lr = 0.0\ntotal_steps = 100\nfinal_lr = 1e-4',
      WarmupStableDecay:
        'base_lr = 1e-3\nwarmup_steps = 10\nwarmup_init_lr = 0.0\nstable_steps = 50\ncosine_decay_steps = 30\ncosine_decay_final_lr = 1e-4\nlinear_decay_steps = 10\nlinear_decay_final_lr = 1e-5',
    }
    const head = good.slice(0, good.indexOf('[model.LLM.lr_schedule.Cosine]')).replace('optimizer = "Dummy"\n', '')
    for (const [variant, body] of Object.entries(lrs)) {
      const text = `${head}[model.LLM.lr_schedule.${variant}]\n${body}\n[model.LLM.optimizer.AdamW]\nbetas = [0.9, 0.95]\nweight_decay = 0.0\neps = 1e-8\n`
      const run = parseRunConfig(text, 'state.toml')
      assert.deepEqual(Object.keys(run.model.LLM.lr_schedule), [variant])
      assert.deepEqual(run.model.LLM.optimizer, {AdamW: {betas: [0.9, 0.95], weight_decay: 0, eps: 1e-8}})
    }
  })

  it('SparseLoCo (our extension): the defaults of τemplar, with, every field bounded, inner steps in the summary and the round', () => {
    const head = good.slice(0, good.indexOf('[model.LLM.lr_schedule.Cosine]')).replace('optimizer = "Dummy"\n', '')
    const lr = '[model.LLM.lr_schedule.Constant]\nbase_lr = 1e-3\nwarmup_steps = 10\nwarmup_init_lr = 0.0\n'
    const with_ = (body: string) => `${head}${lr}[model.LLM.optimizer.SparseLoCo]\n${body}\n`
    const run = parseRunConfig(with_('inner_steps = 30'), 'state.toml')
    assert.deepEqual(run.model.LLM.optimizer, {
      SparseLoCo: {
        inner_steps: 30,
        error_feedback_decay: 0.95,
        chunk: 64,
        topk: 64,
        value_bits: 2,
        outer_lr: 0.4,
        dct: false,
        inner: {betas: [0.9, 0.95], weight_decay: 0.1, eps: 1e-8, clip_grad_norm: 1},
      },
    })
    const tuned = parseRunConfig(
      with_('inner_steps = 4\nchunk = 32\ntopk = 16\nvalue_bits = 3\nouter_lr = 0.7\ndct = true\n[model.LLM.optimizer.SparseLoCo.inner]\nweight_decay = 0.0'),
      's',
    )
    const s = (tuned.model.LLM.optimizer as {SparseLoCo: SparseLoCoConfig}).SparseLoCo
    assert.deepEqual([s.inner_steps, s.chunk, s.topk, s.value_bits, s.outer_lr, s.dct, s.inner.weight_decay, s.inner.betas], [4, 32, 16, 3, 0.7, true, 0, [0.9, 0.95]])
    const summary = summarizeRunConfig(tuned)
    assert.match(summary.optimizer, /SparseLoCo 4 inner steps, chunk 32, top-k 16, 3-bit, outer_lr 0.7, DCT/)
    assert.equal(summary.total_tokens, tuned.config!.total_steps * tuned.config!.global_batch_size_end * 4 * tuned.model.LLM.max_seq_len)
    expectIssue(with_('inner_steps = 0'), 's', 'model.LLM.optimizer.SparseLoCo.inner_steps = 0: must be ≥ 1')
    expectIssue(with_('chunk = 8\ntopk = 65'), 's', 'model.LLM.optimizer.SparseLoCo.topk = 65: must be ≤ 64')
    expectIssue(with_('value_bits = 9'), 's', 'model.LLM.optimizer.SparseLoCo.value_bits = 9: must be ≤ 8')
    expectIssue(with_('outer_lr = 0'), 's', 'model.LLM.optimizer.SparseLoCo.outer_lr = 0')
    expectIssue(with_('error_feedback_decay = 1.5'), 's', 'model.LLM.optimizer.SparseLoCo.error_feedback_decay = 1.5')
    expectIssue(with_('topK = 3'), 's', 'model.LLM.optimizer.SparseLoCo.topK: unknown field')
    expectIssue(with_('[model.LLM.optimizer.SparseLoCo.inner]\neps = 0'), 's', 'model.LLM.optimizer.SparseLoCo.inner.eps = 0')
  })

  it('accepts every data location variant, and rejects malformed ones with the path', () => {
    const head = good.replace('data_location = "Dummy"\n', '')
    const ok = [
      ['data_location = { Local = "data/tokens" }', {Local: 'data/tokens'}],
      ['data_location = { Server = "10.0.0.1:20001" }', {Server: '10.0.0.1:20001'}],
      ['data_location = { Preprocessed = "some/dir" }', {Preprocessed: 'some/dir'}],
      [
        '[model.LLM.data_location.Http]\ntoken_size_in_bytes = "FourBytes"\nshuffle = { Seeded = [' +
          Array(32).fill(7).join(',') +
          '] }\n[model.LLM.data_location.Http.location.NumberedFiles]\nurl_template = "https://x/{}.ds"\nstart_index = 0\nn_left_pad_zeros = 3\nnum_files = 10',
        {
          Http: {
            location: {NumberedFiles: {url_template: 'https://x/{}.ds', start_index: 0, n_left_pad_zeros: 3, num_files: 10}},
            token_size_in_bytes: 'FourBytes',
            shuffle: {Seeded: Array(32).fill(7)},
          },
        },
      ],
    ] as const
    for (const [toml, expected] of ok) {
      const text = toml.startsWith('[') ? `${head}\n${toml}\n` : head.replace('cold_start_warmup_steps = 0\n', `cold_start_warmup_steps = 0\n${toml}\n`)
      assert.deepEqual(parseRunConfig(text, 's').model.LLM.data_location, expected)
    }
    const badShuffle = `${head}\n[model.LLM.data_location.Http]\ntoken_size_in_bytes = "TwoBytes"\nshuffle = { Seeded = [1, 2] }\n[model.LLM.data_location.Http.location]\nSingleUrl = "https://x/a.ds"\n`
    expectIssue(badShuffle, 's', 'model.LLM.data_location.Http.shuffle.Seeded = [1,2]: must be 32 integers from 0 to 255')
  })

  it('accepts our Local checkpoint extension and resolves relative paths against the file', () => {
    const text = good.replace('[model.LLM.checkpoint.Dummy]\nrepo_id = ""', '[model.LLM.checkpoint.Local]\npath = "model"')
    const run = parseRunConfig(text, '/runs/demo/state.toml')
    assert.deepEqual(run.model.LLM.checkpoint, {Local: {path: 'model'}})
    assert.equal(resolveConfigPath(run, 'model'), '/runs/demo/model')
    assert.equal(resolveConfigPath(run, '/abs/data'), '/abs/data')
    assert.equal(resolveConfigPath({path: 'rel/state.toml'}, '../x'), join(process.cwd(), 'x'))
  })

  it('reports unknown top-level keys and a run_state without run_id', () => {
    expectIssue(`extra = 1\n${good}`, 's', 's: extra: unknown field')
    expectIssue(good.replace('run_id = "test"\n', ''), 's', 'run_id: missing')
  })

  it('rejects WarmupStableDecay rates Psyche would assert on mid-run', () => {
    const text = readFileSync(join(fixtures, 'psyche-configs/consilience/state.toml'), 'utf8').replace('linear_decay_final_lr = 2.0e-5', 'linear_decay_final_lr = 3.0e-5')
    expectIssue(text, 's', 'linear_decay_final_lr = 0.00003: must be ≤ cosine_decay_final_lr (0.00002)')
  })

  it('names a missing file', async () => {
    await assert.rejects(loadRunConfigFile('/nonexistent/state.toml'), /\/nonexistent\/state\.toml: cannot read: ENOENT/)
  })
})

describe('validateRunConfig (objects in the TOML shape)', () => {
  it('accepts a loaded config and rejects a changed one with the field named', async () => {
    const run = await loadRunConfigFile(join(fixtures, 'psyche-configs/test/state.toml'))
    const ok = validateRunConfig(run.config, run.model)
    assert.ok('config' in ok)
    const bad = validateRunConfig({...run.config, init_min_clients: 1}, run.model, 'update')
    assert.ok('issues' in bad)
    assert.equal(bad.issues[0].path, 'config.init_min_clients')
  })
})

describe('data.toml', () => {
  it('rejects a bad shuffle seed and token size with the field named', () => {
    assert.throws(
      () => parseDataServerConfig('dir = "x"\ntoken_size = "ThreeBytes"\nseq_len = 8\nshuffle_seed = [1]\n', 'data.toml'),
      (e: ConfigError) => {
        assert.deepEqual(
          e.issues.map((i) => i.path),
          ['shuffle_seed', 'token_size'],
        )
        return true
      },
    )
  })
})

describe('templates', () => {
  it('every template state.toml validates', async () => {
    for (const name of readdirSync(join(root, 'templates'))) {
      const path = join(root, 'templates', name, 'state.toml')
      if (!statSync(path, {throwIfNoEntry: false})) continue
      const run = await loadRunConfigFile(path)
      assert.equal(run.run_id !== undefined, true)
    }
  })
})
