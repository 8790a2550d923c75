import assert from 'node:assert/strict'
import {spawnSync} from 'node:child_process'
import {mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync, mkdirSync, existsSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {after, describe, it} from 'node:test'
import {loadRunConfigFile, resolveConfigPath, summarizeRunConfig} from '../../src/core/config/index.js'
import {scaffoldRun} from '../../src/core/config/scaffold.js'
import {runTestnet} from '../../src/core/testnet/index.js'

const fixtures = 'test/fixtures/psyche-configs'
const tmp = mkdtempSync(join(tmpdir(), 'psyche-config-test-'))
after(() => rmSync(tmp, {recursive: true, force: true}))

function psyche(...args: string[]): {status: number | null; stdout: string; stderr: string} {
  const r = spawnSync(process.execPath, ['bin/psyche.js', ...args], {encoding: 'utf8', env: {...process.env, NO_COLOR: '1'}})
  return {status: r.status, stdout: r.stdout, stderr: r.stderr}
}

describe('psyche server validate-config', () => {
  it('prints a summary of a valid run and its data.toml', () => {
    const dir = `${fixtures}/llama2-20m-dolma-verify-first-checkpointer`
    // Its data.toml names ../../data/dolma, which this checkout does not have: a config written before its data.
    const r = psyche('server', 'validate-config', '--state', `${dir}/state.toml`, '--data-config', `${dir}/data.toml`, '--allow-missing')
    assert.equal(r.status, 0, r.stderr)
    assert.match(r.stderr, /warning: .*data\.toml: dir = "\.\.\/\.\.\/data\/dolma": token data directory does not exist/)
    assert.match(r.stdout, /valid server state of run "llama2-20m-dolma"/)
    assert.match(r.stdout, /25000 steps, global batch 8/)
    assert.match(r.stdout, /data\.toml {2}\.\.\/\.\.\/data\/dolma, TwoBytes, seq_len 2048/)
    assert.match(r.stdout, /trainers {3}every member, every round/)
  })

  it('max_trainers_per_round: the summary states the trade (results downloaded a round, samples per trainer)', () => {
    const capped = join(tmp, 'capped.toml')
    const text0 = readFileSync(`${fixtures}/test/state.toml`, 'utf8')
      .replace('[config]\n', '[config]\nmax_trainers_per_round = 2\n')
      .replace('optimizer = "Dummy"', 'optimizer = {AdamW = {betas = [0.9, 0.95], weight_decay = 0.0, eps = 1e-8}}')
      .replace('data_location = "Dummy"', 'data_location = {Server = "127.0.0.1:20001"}')
    writeFileSync(capped, text0)
    const r = psyche('server', 'validate-config', '--state', capped, '--json')
    assert.equal(r.status, 0, r.stderr)
    assert.equal(JSON.parse(r.stdout).summary.max_trainers_per_round, 2)
    const text = psyche('server', 'validate-config', '--state', capped)
    assert.match(
      text.stdout,
      /trainers {3}at most 2 a round \(max_trainers_per_round\): each client downloads at most 2 results a round, each trainer computes ≥ \d+ of the \d+ samples/,
    )
  })

  it('calls a config our clients cannot run invalid, naming the field and the reason (the support table)', () => {
    const gcs = psyche('server', 'validate-config', '--state', `${fixtures}/solana-test/light-config-gcs.toml`, '--json')
    assert.equal(gcs.status, 1)
    const out = JSON.parse(gcs.stdout)
    assert.equal(out.valid, false)
    assert.deepEqual(
      out.problems.map((p: {field: string}) => p.field),
      ['model.LLM.checkpoint.Gcs'],
    )
    assert.match(out.problems[0].reason, /our clients cannot run this: .*no GCS credentials support/)
    // consilience: its WeightedHttp data and its DeepSeek-V3 model (DisTrO over fused 3-D experts) are served
    const consilience = psyche('server', 'validate-config', '--state', `${fixtures}/consilience/state.toml`, '--json')
    assert.equal(consilience.status, 0, consilience.stderr)
    assert.deepEqual(JSON.parse(consilience.stdout).problems, [])
    // a Gcp bucket is served: valid
    const light = psyche('server', 'validate-config', '--state', `${fixtures}/solana-test/light-config.toml`, '--json')
    assert.equal(light.status, 0, light.stderr)
    assert.deepEqual(JSON.parse(light.stdout).warnings, [])
  })

  it('warns when an epoch whose rounds time out fits fewer rounds than health checks need (an idle member is never judged by them)', () => {
    // 30 s warmup, then 20 s rounds (15 + 5): a 45 s epoch fits one that times out, as one member that never trains
    // makes every round do (the run: a 15 s epoch, 10 s rounds).
    const short = join(tmp, 'short-epoch.toml')
    writeFileSync(short, readFileSync(`${fixtures}/solana-test/light-config.toml`, 'utf8').replace('epoch_time = 60', 'epoch_time = 45'))
    const r = psyche('server', 'validate-config', '--state', short, '--json')
    assert.equal(r.status, 0, r.stderr)
    const warnings = JSON.parse(r.stdout).warnings as {field: string; value: string; reason: string}[]
    assert.deepEqual(
      warnings.map((w) => [w.field, w.value]),
      [['config.epoch_time', '45']],
    )
    assert.match(warnings[0].reason, /fits 1 round of 20 s .* fewer than the 2 that health checks need .* Raise epoch_time above 50 s/)
    const text = psyche('server', 'validate-config', '--state', short)
    assert.equal(text.status, 0, text.stderr)
    assert.match(text.stderr, /^warning: .*short-epoch\.toml: config\.epoch_time = 45: an epoch whose rounds time out/m)
    // 60 s fits 2 such rounds: no warning (the light-config case above)
  })

  it('prints every problem with its field and exits non-zero', () => {
    const bad = join(tmp, 'bad.toml')
    const text = readFileSync(`${fixtures}/test/state.toml`, 'utf8')
      .replace('min_clients = 2\n', 'min_clients = 0\n')
      .replace('epoch_time = 60', 'epoch_time = "60"')
      .replace('optimizer = "Dummy"', 'optimizer = {AdamW = {betas = [0.9, 0.95], weight_decay = 0.0, eps = 1e-8}}')
      .replace('data_location = "Dummy"', 'data_location = {Server = "127.0.0.1:20001"}')
    writeFileSync(bad, text)
    const r = psyche('server', 'validate-config', '--state', bad)
    assert.equal(r.status, 1)
    assert.ok(r.stderr.includes(`${bad}: config.min_clients = 0: must be ≥ 1`), r.stderr)
    assert.ok(r.stderr.includes(`${bad}: config.epoch_time = "60": must be an integer, not a string`), r.stderr)
    assert.ok(r.stderr.includes(`Error: ${bad}: 2 problems found`), r.stderr)
    assert.ok(!r.stderr.includes('    at '), 'no stack trace')
    const json = psyche('server', 'validate-config', '--state', bad, '--json')
    assert.equal(json.status, 1)
    const out = JSON.parse(json.stdout)
    assert.equal(out.error.code, 'ECONFIG')
    assert.equal(out.valid, false)
    assert.deepEqual(
      out.problems.map((p: {field: string; value: string}) => [p.field, p.value]),
      [
        ['config.epoch_time', '"60"'],
        ['config.min_clients', '0'],
      ],
    )
    for (const p of out.problems) assert.equal(p.file, bad)
  })

  it('refuses sizes beyond their bounds, and local data or model paths that do not exist (warnings with --allow-missing)', () => {
    const dir = join(tmp, 'paths')
    assert.equal(psyche('init', dir, '--template', 'tiny-demo').status, 0)
    const state = join(dir, 'state.toml')
    const text = readFileSync(state, 'utf8')
    writeFileSync(join(dir, 'huge.toml'), text.replace('max_seq_len = 128', 'max_seq_len = 4294967296000').replace('epoch_time = 60', 'epoch_time = 100000000'))
    const huge = JSON.parse(psyche('server', 'validate-config', '--state', join(dir, 'huge.toml'), '--json').stdout)
    assert.deepEqual(
      huge.problems.map((p: {field: string; value: string; reason: string}) => [p.field, p.value, p.reason]),
      [
        ['model.LLM.max_seq_len', '4294967296000', 'must be ≤ 1048576'],
        ['config.epoch_time', '100000000', 'must be ≤ 604800'],
      ],
    )
    const tokens = join(dir, 'tokens')
    mkdirSync(tokens)
    writeFileSync(join(dir, 'missing.toml'), text.replace(/data_location = .*/, 'data_location = { Local = "tokens" }').replace('path = "model"', 'path = "no-model"'))
    const missing = psyche('server', 'validate-config', '--state', join(dir, 'missing.toml'), '--json')
    assert.equal(missing.status, 1)
    const problems = JSON.parse(missing.stdout).problems as {field: string; value: string; reason: string}[]
    assert.deepEqual(
      problems.map((p) => [p.field, p.value]),
      [
        ['model.LLM.data_location.Local', '"tokens"'],
        ['model.LLM.checkpoint.Local.path', '"no-model"'],
      ],
    )
    assert.match(problems[0].reason, /no token files/)
    assert.match(problems[1].reason, /model directory does not exist .*psyche model init --out/)
    const later = psyche('server', 'validate-config', '--state', join(dir, 'missing.toml'), '--allow-missing', '--json')
    assert.equal(later.status, 0, later.stderr)
    assert.equal(JSON.parse(later.stdout).warnings.length, 2)
    // The demo corpus is made on first use (join, train): its path is not a problem before then.
    assert.equal(psyche('server', 'validate-config', '--state', state).status, 0)
    // A model.safetensors that is not the model config.json describes (here: cut short) is a problem naming it.
    const weights = Buffer.alloc(64)
    weights.writeBigUInt64LE(200n)
    writeFileSync(join(dir, 'model', 'model.safetensors'), weights)
    const corrupt = psyche('server', 'validate-config', '--state', state, '--json')
    assert.equal(corrupt.status, 1)
    assert.deepEqual(
      JSON.parse(corrupt.stdout).problems.map((p: {field: string; reason: string}) => [p.field, p.reason]),
      [['model.LLM.checkpoint.Local.path', `${join(dir, 'model', 'model.safetensors')}: not a safetensors file (bad header length)`]],
    )
  })

  it('checks the data.toml against the run', () => {
    const r = psyche('server', 'validate-config', '--state', `${fixtures}/test/state.toml`, '--data-config', `${fixtures}/kill-test-short-epoch-checkpoint/data.toml`)
    assert.equal(r.status, 1)
    assert.match(r.stderr, /data\.toml: seq_len = 2048: must equal .*max_seq_len \(512\)/)
  })
})

describe('psyche init', () => {
  it('scaffolds a run directory that validates from its new place, and says how to create the weights', () => {
    const dir = join(tmp, 'run-a')
    const r = psyche('init', dir, '--template', 'tiny-demo', '--run-id', 'run-a', '--json')
    assert.equal(r.status, 0, r.stderr)
    const out = JSON.parse(r.stdout)
    assert.equal(out.run_id, 'run-a')
    assert.ok(out.files.includes('state.toml') && out.files.includes('model/config.json'))
    assert.ok(out.next_steps[0].startsWith(`psyche model init --template tiny-demo --out ${join(dir, 'model')}`))
    assert.ok(!existsSync(join(dir, 'model', 'model.safetensors')), 'init invents no weights')
    const v = psyche('server', 'validate-config', '--state', join(dir, 'state.toml'))
    assert.equal(v.status, 0, v.stderr)
  })

  it('--template tiny-sparseloco: a SparseLoCo run that validates, at the demo run’s tokens in 20× fewer rounds, on either backend', async () => {
    const dir = join(tmp, 'run-sparseloco')
    await scaffoldRun({template: 'tiny-sparseloco', dir})
    const v = psyche('server', 'validate-config', '--state', join(dir, 'state.toml'), '--json')
    assert.equal(v.status, 0, v.stderr)
    const {summary, problems} = JSON.parse(v.stdout)
    assert.deepEqual(problems, [])
    assert.equal(summary.optimizer, 'SparseLoCo 20 inner steps, chunk 64, top-k 64, 2-bit, outer_lr 0.5')
    assert.deepEqual([summary.total_steps, summary.inner_steps], [15, 20])
    const demo = summarizeRunConfig(await loadRunConfigFile('templates/tiny-demo/state.toml'))
    assert.deepEqual([demo.total_steps, demo.inner_steps], [300, 1])
    assert.equal(summary.total_tokens, demo.total_tokens)
    // the Solana program runs it too (its account holds the inner steps)
    assert.deepEqual(summary.solana_unsupported, [])
    assert.deepEqual(demo.solana_unsupported, [])
    const text = psyche('server', 'validate-config', '--state', join(dir, 'state.toml')).stdout
    assert.match(text, /\n {2}training {3}15 rounds of 20 inner steps, global batch /)
    assert.doesNotMatch(text, /not on the Solana program/)
  })

  it('a verification_sample the Solana program cannot store: validate-config says so, and psyche testnet --backend solana refuses it before anything starts, naming the file and the field', async () => {
    const dir = join(tmp, 'run-sample-solana')
    await scaffoldRun({template: 'tiny-demo', dir})
    const state = join(dir, 'state.toml')
    const text = readFileSync(state, 'utf8')
    assert.match(text, /^\[config\]$/m)
    writeFileSync(state, text.replace(/^\[config\]$/m, '[config]\nverification_sample = 8'))
    const field = /config\.verification_sample: 8, but the Solana program does not store it/
    const v = psyche('server', 'validate-config', '--state', state, '--json')
    assert.equal(v.status, 0, v.stderr)
    assert.deepEqual(
      JSON.parse(v.stdout).summary.solana_unsupported.map((u: {path: string}) => u.path),
      ['config.verification_sample'],
    )
    await assert.rejects(runTestnet({clients: 2, config: dir, backend: 'solana', rounds: 1}), (e: Error) => {
      assert.ok(e.message.startsWith(`${state}: `), e.message)
      assert.match(e.message, field)
      return true
    })
    assert.deepEqual(readdirSync(dir).sort(), ['model', 'state.toml'], 'nothing written')
  })

  it('--min-clients sets the clients every epoch waits for, and refuses more than the first batch can feed', async () => {
    const dir = join(tmp, 'run-two')
    const r = psyche('init', dir, '--min-clients', '2')
    assert.equal(r.status, 0, r.stderr)
    const run = await loadRunConfigFile(join(dir, 'state.toml'))
    assert.equal(run.config?.init_min_clients, 2)
    assert.equal(run.config?.min_clients, 1, "min_clients stays the template's when not above")
    const tooMany = psyche('init', join(tmp, 'run-many'), '--min-clients', '17')
    assert.equal(tooMany.status, 1)
    assert.match(tooMany.stderr, /global_batch_size_start = 16: must be ≥ init_min_clients \(17\)/)
    assert.ok(!existsSync(join(tmp, 'run-many')), 'nothing written')
    assert.equal(psyche('init', join(tmp, 'run-zero'), '--min-clients', '0').status, 2, 'a usage error')
  })

  it('refuses a non-empty directory and unknown or model-only templates', () => {
    const dir = join(tmp, 'full')
    mkdirSync(dir)
    writeFileSync(join(dir, 'x'), '')
    const r = psyche('init', dir)
    assert.equal(r.status, 1)
    assert.match(r.stderr, /directory is not empty \(use --force/)
    assert.match(psyche('init', join(tmp, 'n'), '--template', 'nope').stderr, /--template nope: no such template; run templates: .*tiny-demo/)
  })
})

describe('scaffoldRun', () => {
  it('rewrites paths that lead outside the template so they point at the same place', async () => {
    const templates = join(tmp, 'templates')
    mkdirSync(join(templates, 't', 'model'), {recursive: true})
    writeFileSync(join(templates, 't', 'model', 'config.json'), '{}')
    const state = readFileSync(`${fixtures}/test/state.toml`, 'utf8')
      .replace('data_location = "Dummy"', 'data_location = { Local = "../shared-data" }')
      .replace('[model.LLM.checkpoint.Dummy]\nrepo_id = ""', '[model.LLM.checkpoint.Local]\npath = "model"')
    writeFileSync(join(templates, 't', 'state.toml'), state)
    writeFileSync(join(templates, 't', 'data.toml'), `dir = "../tokens"\ntoken_size = "TwoBytes"\nseq_len = 512\nshuffle_seed = [${Array(32).fill(1).join(', ')}]\n`)
    const out = join(tmp, 'deep', 'er', 'run')
    const result = await scaffoldRun({template: 't', dir: out, templatesDir: templates})
    assert.deepEqual(
      result.rewritten.map((r) => [r.file, r.to]),
      [
        ['state.toml', join(templates, 'shared-data')],
        ['data.toml', join(templates, 'tokens')],
      ],
    )
    const run = await loadRunConfigFile(join(out, 'state.toml'))
    const llm = run.model.LLM
    assert.deepEqual(llm.data_location, {Local: join(templates, 'shared-data')})
    assert.equal(resolveConfigPath(run, (llm.checkpoint as {Local: {path: string}}).Local.path), join(out, 'model'))
    assert.equal(result.model_dir, join(out, 'model'))
    assert.equal(result.model_has_weights, false)
    // Only the path changed: comments and layout are kept.
    assert.equal(readFileSync(join(out, 'state.toml'), 'utf8'), state.replace('"../shared-data"', JSON.stringify(join(templates, 'shared-data'))))
  })
})
