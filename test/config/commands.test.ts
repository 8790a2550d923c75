import assert from 'node:assert/strict'
import {spawnSync} from 'node:child_process'
import {mkdtempSync, readFileSync, rmSync, writeFileSync, mkdirSync, existsSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {after, describe, it} from 'node:test'
import {loadRunConfigFile, resolveConfigPath} from '../../src/core/config/index.js'
import {scaffoldRun} from '../../src/core/config/scaffold.js'

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
    const r = psyche('server', 'validate-config', '--state', `${dir}/state.toml`, '--data-config', `${dir}/data.toml`)
    assert.equal(r.status, 0, r.stderr)
    assert.match(r.stdout, /valid server state of run "llama2-20m-dolma"/)
    assert.match(r.stdout, /25000 steps, global batch 8/)
    assert.match(r.stdout, /data\.toml {2}\.\.\/\.\.\/data\/dolma, TwoBytes, seq_len 2048/)
  })

  it('--json returns the summary, with unsupported variants as warnings (and --strict as errors)', () => {
    const file = `${fixtures}/solana-test/light-config-gcs.toml`
    const r = psyche('server', 'validate-config', '--state', file, '--json')
    assert.equal(r.status, 0, r.stderr)
    const out = JSON.parse(r.stdout)
    assert.equal(out.valid, true)
    assert.equal(out.summary.kind, 'run config')
    assert.equal(out.warnings.length, 2)
    assert.match(out.warnings[0], /model\.LLM\.checkpoint\.Gcs: .*no GCS credentials support/)
    const strict = psyche('server', 'validate-config', '--state', file, '--strict')
    assert.equal(strict.status, 1)
    assert.match(strict.stderr, /model\.LLM\.data_location\.Http\.location\.Gcp/)
  })

  it('prints every problem with its field and exits non-zero', () => {
    const bad = join(tmp, 'bad.toml')
    const text = readFileSync(`${fixtures}/test/state.toml`, 'utf8').replace('min_clients = 2\n', 'min_clients = 0\n').replace('epoch_time = 60', 'epoch_time = "60"')
    writeFileSync(bad, text)
    const r = psyche('server', 'validate-config', '--state', bad)
    assert.equal(r.status, 1)
    assert.ok(r.stderr.includes(`${bad}: config.min_clients = 0: must be ≥ 1`), r.stderr)
    assert.ok(r.stderr.includes(`${bad}: config.epoch_time = "60": must be an integer, not a string`), r.stderr)
    assert.ok(r.stderr.includes(`Error: ${bad}: 2 problems found`), r.stderr)
    assert.ok(!r.stderr.includes('    at '), 'no stack trace')
    const json = psyche('server', 'validate-config', '--state', bad, '--json')
    assert.equal(json.status, 1)
    assert.equal(JSON.parse(json.stdout).error.code, 'ECONFIG')
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

  it('--min-clients sets the clients the first epoch waits for, and refuses more than the first batch can feed', async () => {
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
