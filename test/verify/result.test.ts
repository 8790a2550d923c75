import assert from 'node:assert/strict'
import {randomBytes} from 'node:crypto'
import {join} from 'node:path'
import {test} from 'node:test'
import {execa} from 'execa'
import {projectRoot, pythonEnv, workerPython} from '../../src/core/worker/python.js'
import {maxResultSize, parseResultFormat, resultSize, validateResult, type DistroResultFormat} from '../../src/core/verify/result.js'

type ResultFormat = DistroResultFormat
const parseDistro = (raw: unknown) => parseResultFormat(raw) as DistroResultFormat

interface Vectors {
  format: ResultFormat
  cases: {hex: string; ok: boolean}[]
}

async function pythonVectors(seed: number, count: number): Promise<Vectors[]> {
  const r = await execa(workerPython(), [join(projectRoot, 'test', 'verify', 'codec_vectors.py'), String(seed), String(count)], {env: pythonEnv(), maxBuffer: 1 << 28})
  return JSON.parse(r.stdout) as Vectors[]
}

test('the TypeScript validator accepts exactly what the worker decoder accepts (valid, mutated and random results, 3 value formats)', async () => {
  const sets = await pythonVectors(7, 3000)
  assert.equal(sets.length, 3)
  for (const set of sets) {
    const format = parseDistro(set.format)
    let accepted = 0
    for (const [i, c] of set.cases.entries()) {
      const v = validateResult(Buffer.from(c.hex, 'hex'), format)
      assert.equal(
        v.ok,
        c.ok,
        `${format.value_format} case ${i} (${c.hex.slice(0, 40)}…): python ${c.ok ? 'accepts' : 'rejects'}, TypeScript ${v.ok ? 'accepts' : `rejects: ${(v as {reason: string}).reason}`}`,
      )
      if (v.ok) accepted++
    }
    // Both sides of the comparison are exercised: valid results and mutations that stay valid, and rejections.
    assert.ok(accepted >= 3 && accepted < set.cases.length / 2, `${format.value_format}: ${accepted} of ${set.cases.length} accepted`)
  }
})

test('validation names what is wrong; sizes are exact; nothing throws on random input', async () => {
  const [sign, bf16, fp16] = await pythonVectors(3, 0)
  const fmt = parseDistro(sign.format)
  const valid = Buffer.from(sign.cases[0].hex, 'hex')
  assert.deepEqual(validateResult(valid, fmt), {ok: true})
  assert.equal(valid.length, resultSize(fmt))
  assert.equal(maxResultSize(fmt), valid.length)
  assert.equal(Buffer.from(bf16.cases[0].hex, 'hex').length, resultSize(parseDistro(bf16.format)))
  assert.equal(Buffer.from(fp16.cases[0].hex, 'hex').length, maxResultSize(parseDistro(fp16.format)))

  const reason = (b: Uint8Array, f: ResultFormat = fmt) => {
    const v = validateResult(b, f)
    assert.equal(v.ok, false)
    return (v as {reason: string}).reason
  }
  assert.match(reason(randomBytes(valid.length)), /bad magic/)
  assert.match(reason(Buffer.concat([valid, Buffer.from([0])])), /exactly/)
  assert.match(reason(valid.subarray(0, 5)), /truncated/)
  // A full-value result where the run sends signs.
  assert.match(reason(Buffer.from(bf16.cases[0].hex, 'hex')), /does not match the run's 1-bit/)
  const wrongCount = Buffer.from(valid)
  wrongCount.writeUInt32LE(9, 6)
  assert.match(reason(wrongCount), /has 9 tensors, the model has 3/)
  // Another model: same names, other topk.
  const other = {...fmt, tensors: fmt.tensors.map((t) => ({...t, topk: 2}))}
  assert.match(reason(valid, other), /exactly|topk/)
  // Duplicate indices: the first tensor's first chunk repeats its first index (3 bits per index for chunk 4x2).
  const dup = Buffer.from(valid)
  const at = 10 + 2 + 'a.weight'.length + 1 + 16 + 4
  const first = dup[at] & 0b111
  dup[at] = (dup[at] & ~0b111000) | (first << 3)
  assert.match(reason(dup), /duplicate index in chunk 0|out of range/)
  // A non-finite bf16 value.
  const bfFmt = parseDistro(bf16.format)
  const nan = Buffer.from(bf16.cases[0].hex, 'hex')
  nan.writeUInt16LE(0x7fc0, nan.length - 2)
  assert.match(reason(nan, bfFmt), /non-finite bf16/)

  for (let i = 0; i < 2000; i++) {
    const b = randomBytes(Math.floor(Math.random() * 2 * valid.length))
    if (i % 2 === 0) Buffer.from('PSDR\x01\x00', 'latin1').copy(b)
    const v = validateResult(b, fmt)
    assert.equal(typeof v.ok, 'boolean')
  }
})

test('parseResultFormat refuses a malformed format', () => {
  assert.throws(() => parseDistro({value_format: 'int8', tensors: []}), /result_format/)
  assert.throws(() => parseDistro({value_format: 'sign', tensors: [{name: 'x', shape: [4], chunk: [4, 1], topk: 1}]}), /tensor 0/)
})
