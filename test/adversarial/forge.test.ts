import assert from 'node:assert/strict'
import {join} from 'node:path'
import {test} from 'node:test'
import {execa} from 'execa'
import {projectRoot, pythonEnv, workerPython} from '../../src/core/worker/python.js'
import {parseResultFormat, validateResult} from '../../src/core/verify/result.js'
import {randomWellFormed, signFlipped} from './forge.js'

test('forged results (sign-flipped, random) are well-formed: only scoring can tell them from honest work', async () => {
  const r = await execa(workerPython(), [join(projectRoot, 'test', 'verify', 'codec_vectors.py'), '1', '0'], {env: pythonEnv(), maxBuffer: 1 << 26})
  for (const set of JSON.parse(r.stdout) as {format: unknown; cases: {hex: string}[]}[]) {
    const format = parseResultFormat(set.format)
    const honest = Buffer.from(set.cases[0].hex, 'hex')
    const flipped = signFlipped(honest, format)
    const random = randomWellFormed(honest, format)
    assert.deepEqual(validateResult(flipped, format), {ok: true})
    assert.deepEqual(validateResult(random, format), {ok: true})
    assert.notDeepEqual(Buffer.from(flipped), honest)
    assert.notDeepEqual(Buffer.from(random), honest)
    assert.deepEqual(Buffer.from(signFlipped(flipped, format)), honest)
  }
})
