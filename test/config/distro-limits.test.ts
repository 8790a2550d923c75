import assert from 'node:assert/strict'
import {join} from 'node:path'
import {test} from 'node:test'
import {fileURLToPath} from 'node:url'
import {execa} from 'execa'
import {loadRunConfigFile, validateRunConfig} from '../../src/core/config/index.js'
import {DISTRO_MAX_CHUNK} from '../../src/core/config/run-config.js'
import {pythonEnv, workerPython} from '../../src/core/worker/python.js'

const fixtures = join(fileURLToPath(new URL('.', import.meta.url)), '..', 'fixtures')

// One rule, one place: validate-config accepts exactly the DisTrO settings a worker accepts (and never one it
// would refuse). Compared on the boundaries of every limit.
test('the run-config validator and the worker accept the same DisTrO chunk and top-k settings', async () => {
  const run = await loadRunConfigFile(join(fixtures, 'psyche-configs/test/state.toml'))
  const base = (run.model.LLM.optimizer as {Distro?: Record<string, unknown>}).Distro ?? {compression_decay: 0.999, quantize_1bit: true}
  const cases: [number, number][] = []
  for (const chunk of [1, 2, 16, 64, DISTRO_MAX_CHUNK - 1, DISTRO_MAX_CHUNK, DISTRO_MAX_CHUNK + 1, 65535]) {
    for (const topk of [1, chunk - 1, chunk, chunk + 1, chunk * chunk]) if (topk >= 1) cases.push([chunk, topk])
  }
  const ts = cases.map(([chunk, topk]) => {
    const distro = {...base, compression_chunk: chunk, compression_topk: topk}
    return 'config' in validateRunConfig(run.config, {LLM: {...run.model.LLM, optimizer: {Distro: distro}}})
  })
  const script = [
    'import json, sys',
    'from psyche_worker.distro import DistroConfig',
    'out = []',
    'for chunk, topk in json.loads(sys.argv[1]):',
    '    try:',
    '        DistroConfig.from_dict({"compression_chunk": chunk, "compression_topk": topk}); out.append(True)',
    '    except ValueError:',
    '        out.append(False)',
    'print(json.dumps(out))',
  ].join('\n')
  const r = await execa(workerPython(), ['-c', script, JSON.stringify(cases)], {env: pythonEnv()})
  const py = JSON.parse(r.stdout) as boolean[]
  for (const [i, [chunk, topk]] of cases.entries())
    assert.equal(ts[i], py[i], `chunk ${chunk}, topk ${topk}: validate-config ${ts[i] ? 'accepts' : 'refuses'}, the worker ${py[i] ? 'accepts' : 'refuses'}`)
  assert.ok(ts.includes(true) && ts.includes(false))
})
