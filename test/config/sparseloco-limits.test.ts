import assert from 'node:assert/strict'
import {join} from 'node:path'
import {test} from 'node:test'
import {fileURLToPath} from 'node:url'
import {execa} from 'execa'
import {loadRunConfigFile, validateRunConfig} from '../../src/core/config/index.js'
import {SPARSELOCO_LIMITS} from '../../src/core/config/run-config.js'
import {pythonEnv, workerPython} from '../../src/core/worker/python.js'

const fixtures = join(fileURLToPath(new URL('.', import.meta.url)), '..', 'fixtures')

// One rule, one place: validate-config accepts exactly the SparseLoCo settings a worker accepts (and never one it
// would refuse). Compared on the boundaries of every limit.
test('the run-config validator and the worker accept the same SparseLoCo settings', async () => {
  const run = await loadRunConfigFile(join(fixtures, 'psyche-configs/test/state.toml'))
  const L = SPARSELOCO_LIMITS
  const cases: Record<string, unknown>[] = [{}]
  for (const h of [0, 1, 30, L.innerSteps, L.innerSteps + 1]) cases.push({inner_steps: h})
  for (const chunk of [0, 1, 2, 64, L.chunk, L.chunk + 1]) for (const topk of [0, 1, chunk, chunk * chunk, chunk * chunk + 1]) cases.push({chunk, topk})
  for (const value_bits of [0, 1, 2, 8, 9]) cases.push({value_bits})
  for (const outer_lr of [0, 1e-9, 0.4, L.outerLr, L.outerLr + 1, -1]) cases.push({outer_lr})
  for (const error_feedback_decay of [-0.1, 0, 0.95, 1, 1.01]) cases.push({error_feedback_decay})
  for (const inner of [{}, {betas: [0.9, 1]}, {weight_decay: -1}, {eps: 0}, {clip_grad_norm: 0}, {betas: [0.8, 0.99], eps: 1e-6}]) cases.push({inner})
  cases.push({dct: true}, {inner_steps: 2.5}, {unknown_field: 1})
  const ts = cases.map((c) => 'config' in validateRunConfig(run.config, {LLM: {...run.model.LLM, optimizer: {SparseLoCo: c}}}))
  const script = [
    'import json, sys',
    'from psyche_worker.optim.sparseloco import SparseLoCoConfig',
    'out = []',
    'for c in json.loads(sys.argv[1]):',
    '    try:',
    '        SparseLoCoConfig.from_dict(c); out.append(True)',
    '    except ValueError:',
    '        out.append(False)',
    'print(json.dumps(out))',
  ].join('\n')
  const r = await execa(workerPython(), ['-c', script, JSON.stringify(cases)], {env: pythonEnv()})
  const py = JSON.parse(r.stdout) as boolean[]
  for (const [i, c] of cases.entries())
    assert.equal(ts[i], py[i], `${JSON.stringify(c)}: validate-config ${ts[i] ? 'accepts' : 'refuses'}, the worker ${py[i] ? 'accepts' : 'refuses'}`)
  assert.ok(ts.filter(Boolean).length > 10 && ts.filter((x) => !x).length > 10)
})
