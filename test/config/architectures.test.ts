import assert from 'node:assert/strict'
import {spawnSync} from 'node:child_process'
import {mkdirSync, readFileSync, writeFileSync} from 'node:fs'
import {join} from 'node:path'
import {after, describe, it} from 'node:test'
import ValidateConfig from '../../src/commands/server/validate-config.js'
import {architectureMismatch, checkArchitecture, describeArchitectures} from '../../src/core/config/architectures.js'
import {ARCHITECTURES, ARCHITECTURE_MODEL_TYPES, ARCHITECTURES_FILE, readArchitectures, unsupportedFeatures} from '../../src/core/config/support.js'
import {loadRunConfigFile} from '../../src/core/config/index.js'
import {scaffoldRun} from '../../src/core/config/scaffold.js'
import {resolveTrainPlan} from '../../src/core/train/plan.js'
import {tempDir} from '../helpers.js'

const tmp = tempDir()
after(() => tmp.cleanup())
const families = JSON.parse(readFileSync('test/fixtures/tiny-architectures.json', 'utf8')) as Record<string, {config: Record<string, unknown>}>

/** A run directory from `template` whose model directory holds `modelConfig`, with the architecture replaced. */
async function runWith(name: string, architecture: string, modelConfig: Record<string, unknown>, template = 'tiny-demo'): Promise<string> {
  const dir = join(tmp.path, name)
  await scaffoldRun({template, dir})
  const state = join(dir, 'state.toml')
  writeFileSync(state, readFileSync(state, 'utf8').replace(/^architecture = .*$/m, `architecture = "${architecture}"`))
  writeFileSync(join(dir, 'model', 'config.json'), JSON.stringify(modelConfig))
  return state
}

describe('model.LLM.architecture against the model it names', () => {
  it('one file decides the architectures, for the validator and the worker alike (python/psyche_worker/architectures.json)', async () => {
    assert.equal(ARCHITECTURES_FILE, join(process.cwd(), 'python', 'psyche_worker', 'architectures.json'))
    const table = JSON.parse(readFileSync(ARCHITECTURES_FILE, 'utf8')) as Record<string, string[] | null>
    assert.deepEqual(ARCHITECTURE_MODEL_TYPES, table)
    for (const [name, support] of Object.entries(ARCHITECTURES)) assert.equal(support.supported, name in table, name)
    // validate-config's help describes the same table
    assert.equal(describeArchitectures(), 'HfLlama: llama, HfDeepseek: deepseek_v3, HfAuto: any causal LM transformers builds')
    assert.ok(ValidateConfig.description!.includes(`(${describeArchitectures()})`), ValidateConfig.description)
    // a run of every architecture in the file is one our clients can run
    const run = await loadRunConfigFile('templates/tiny-deepseek-v3/state.toml')
    for (const architecture of Object.keys(table)) {
      const file = {...run, model: {LLM: {...run.model.LLM, architecture: architecture as typeof run.model.LLM.architecture}}}
      assert.deepEqual(unsupportedFeatures(file), [], architecture)
    }
    // a malformed table is refused, naming the file
    for (const bad of ['{"HfLlama": []}', '{"HfLlama": "llama"}', '[]', '{"HfLlama": [""]}', '{']) {
      const path = join(tmp.path, 'architectures.json')
      writeFileSync(path, bad)
      assert.throws(() => readArchitectures(path), /architectures\.json: /, bad)
    }
  })

  it('HfLlama runs llama, HfDeepseek deepseek_v3, HfAuto any model type', () => {
    assert.equal(architectureMismatch('HfLlama', families.llama.config), undefined)
    assert.equal(architectureMismatch('HfDeepseek', families.deepseek_v3.config), undefined)
    for (const {config} of Object.values(families)) assert.equal(architectureMismatch('HfAuto', config), undefined)
    assert.match(architectureMismatch('HfLlama', families.qwen2.config)!, /model_type "qwen2"; HfLlama runs llama models \(HfAuto runs any causal LM/)
    assert.match(architectureMismatch('HfDeepseek', families.qwen3_moe.config)!, /model_type "qwen3_moe"; HfDeepseek runs deepseek_v3 models/)
    assert.match(architectureMismatch('HfAuto', {vocab_size: 8})!, /no model_type/)
  })

  it('validate-config: an architecture our clients cannot run with the run’s model is an error naming the field', async () => {
    const bad = await runWith('llama-on-qwen', 'HfLlama', families.qwen2.config)
    const issues = checkArchitecture(await loadRunConfigFile(bad))
    assert.deepEqual(
      issues.map((i) => [i.path, i.value]),
      [['model.LLM.architecture', '"HfLlama"']],
    )
    assert.match(issues[0].message, /model_type "qwen2".*model\/config\.json\)$/)
    const r = spawnSync(process.execPath, ['bin/psyche.js', 'server', 'validate-config', '--state', bad, '--json'], {encoding: 'utf8'})
    assert.equal(r.status, 1, r.stderr)
    const out = JSON.parse(r.stdout)
    assert.equal(out.valid, false)
    assert.deepEqual(
      out.problems.map((p: {field: string}) => p.field),
      ['model.LLM.architecture'],
    )
    const good = await runWith('deepseek', 'HfDeepseek', families.deepseek_v3.config)
    assert.deepEqual(checkArchitecture(await loadRunConfigFile(good)), [])
    const broken = await runWith('broken', 'HfAuto', {})
    writeFileSync(join(tmp.path, 'broken', 'model', 'config.json'), '{"model_type": ')
    assert.match(checkArchitecture(await loadRunConfigFile(broken))[0].message, /config\.json \(model\.LLM\.checkpoint\.Local\.path\) is not valid JSON/)
    // a model that is not on this disk is checked when it loads (the worker refuses it by name)
    assert.deepEqual(checkArchitecture(await loadRunConfigFile('test/fixtures/psyche-configs/consilience/state.toml')), [])
  })

  it('psyche train refuses a run whose architecture is not its model’s; --model alone takes the model’s own', async () => {
    const bad = await runWith('train-mismatch', 'HfDeepseek', families.llama.config)
    await assert.rejects(resolveTrainPlan({config: bad}), /model\.LLM\.architecture = "HfDeepseek": the model's config\.json has model_type "llama"/)
    const dir = join(tmp.path, 'mixtral')
    mkdirSync(dir)
    writeFileSync(join(dir, 'config.json'), JSON.stringify(families.mixtral.config))
    const plan = await resolveTrainPlan({model: dir})
    assert.equal(plan.model.architecture, 'HfAuto')
    assert.equal(plan.model.kind, 'config')
    await assert.rejects(resolveTrainPlan({model: dir, template: 'tiny-demo'}), /model\.LLM\.architecture = "HfLlama": the model's config\.json has model_type "mixtral"/)
    writeFileSync(join(dir, 'config.json'), JSON.stringify({...families.mixtral.config, model_type: undefined}))
    await assert.rejects(resolveTrainPlan({model: dir}), new RegExp(`--model ${dir}: its config\\.json has no model_type`))
  })

  it('the tiny-qwen3, tiny-deepseek-v3 and deepseek-v3-small templates scaffold runs that validate', async () => {
    for (const [template, architecture, modelType] of [
      ['tiny-qwen3', 'HfAuto', 'qwen3'],
      ['tiny-deepseek-v3', 'HfDeepseek', 'deepseek_v3'],
      ['deepseek-v3-small', 'HfDeepseek', 'deepseek_v3'],
    ]) {
      const dir = join(tmp.path, template)
      const result = await scaffoldRun({template, dir})
      assert.equal(result.model_has_weights, false)
      const run = await loadRunConfigFile(join(dir, 'state.toml'))
      assert.equal(run.model.LLM.architecture, architecture)
      assert.equal(JSON.parse(readFileSync(join(dir, 'model', 'config.json'), 'utf8')).model_type, modelType)
      assert.deepEqual(checkArchitecture(run), [])
      const plan = await resolveTrainPlan({template})
      assert.equal(plan.model.architecture, architecture)
    }
  })
})
