import assert from 'node:assert/strict'
import {randomBytes} from 'node:crypto'
import {join} from 'node:path'
import {test} from 'node:test'
import {execa} from 'execa'
import {projectRoot, pythonEnv, workerPython} from '../../src/core/worker/python.js'
import {parseResultFormat, resultIndices, selectionChunks, validateResult, validSizes} from '../../src/core/verify/result.js'
import type {SparseLoCoResultFormat} from '../../src/core/verify/sparseloco-result.js'

interface Vectors {
  format: unknown
  size: number
  cases: {hex: string; ok: boolean}[]
}

async function pythonVectors(seed: number, count: number): Promise<Vectors[]> {
  const script = join(projectRoot, 'test', 'verify', 'sparseloco_vectors.py')
  const r = await execa(workerPython(), [script, String(seed), String(count)], {env: pythonEnv(), maxBuffer: 1 << 28})
  return JSON.parse(r.stdout) as Vectors[]
}

const hex = (s: string) => Buffer.from(s, 'hex')

test('SparseLoCo: the TypeScript validator accepts exactly what the worker decoder accepts (valid, mutated, random; 4 configurations)', async () => {
  const sets = await pythonVectors(11, 1500)
  assert.equal(sets.length, 4)
  for (const set of sets) {
    const format = parseResultFormat(set.format) as SparseLoCoResultFormat
    assert.equal(format.format, 'sparseloco')
    assert.deepEqual(validSizes(format), [set.size])
    let accepted = 0
    for (const [i, c] of set.cases.entries()) {
      const v = validateResult(hex(c.hex), format)
      const label = `${format.value_bits}-bit chunk ${format.tensors[0].chunk} case ${i} (${c.hex.slice(0, 40)}…)`
      assert.equal(v.ok, c.ok, `${label}: python ${c.ok ? 'accepts' : 'rejects'}, TypeScript ${v.ok ? 'accepts' : `rejects: ${(v as {reason: string}).reason}`}`)
      if (v.ok) accepted++
    }
    // Both sides are exercised (a mutated code or level is still a valid result: many mutations stay valid).
    assert.ok(accepted >= 3 && set.cases.length - accepted >= set.cases.length / 5, `${accepted} of ${set.cases.length} accepted`)
  }
})

test('SparseLoCo: validation names what is wrong, never throws; copy detection reads the selected positions', async () => {
  const [set, , , dense] = await pythonVectors(5, 0)
  const format = parseResultFormat(set.format) as SparseLoCoResultFormat
  const valid = hex(set.cases[0].hex)
  assert.deepEqual(validateResult(valid, format), {ok: true})
  const reason = (b: Uint8Array) => {
    const v = validateResult(b, format)
    assert.equal(v.ok, false)
    return (v as {reason: string}).reason
  }
  assert.match(reason(valid.subarray(0, 10)), /truncated/)
  assert.match(reason(Buffer.concat([valid, Buffer.from([0])])), /exactly/)
  const magic = Buffer.from(valid)
  magic[0] = 0x41
  assert.match(reason(magic), /bad magic/)
  const version = Buffer.from(valid)
  version[4] = 2
  assert.match(reason(version), /unsupported version 2/)
  const bits = Buffer.from(valid)
  bits[5] = 3
  assert.match(reason(bits), /value_bits 3/)
  const other = Buffer.from(valid)
  other[9] ^= 1
  assert.match(reason(other), /layout id .* is not this run's/)
  const nan = Buffer.from(valid)
  nan.writeFloatLE(Number.NaN, 16)
  assert.match(reason(nan), /non-finite level/)
  // The first tensor's first chunk: an extra set bit in its index high parts.
  const levels = 16 + 4 * 2 ** format.value_bits * format.tensors.length
  const extra = Buffer.from(valid)
  let flipped = false
  for (let bit = 0; bit < 8 && !flipped; bit++) {
    if (((extra[levels] >> bit) & 1) === 0) {
      extra[levels] |= 1 << bit
      flipped = true
    }
  }
  assert.ok(flipped)
  assert.match(reason(extra), /exactly \d+ indices|not strictly increasing|out of range/)
  for (let i = 0; i < 2000; i++) {
    const junk = randomBytes(i % 200)
    assert.equal(validateResult(junk, format).ok, false)
  }
  // Every sparse chunk contributes exactly k positions; dense tensors none.
  const all = resultIndices(valid, format)
  const sparse = format.tensors.filter((t) => t.topk < t.chunk.reduce((a, c) => a * c, 1))
  const expected = sparse.reduce((a, t) => a + t.shape.reduce((acc, s, d) => acc * Math.floor(s / t.chunk[d]), 1) * t.topk, 0)
  assert.equal(all.size, expected)
  assert.equal(
    selectionChunks(format),
    sparse.reduce((a, t) => a + t.shape.reduce((acc, s, d) => acc * Math.floor(s / t.chunk[d]), 1), 0),
  )
  const sampled = resultIndices(valid, format, 3)
  assert.ok(sampled.size > 0 && sampled.size < all.size && [...sampled].every((p) => all.has(p)))
  // A configuration where every 2-D chunk is dense still validates (codes only).
  const denseFormat = parseResultFormat(dense.format)
  assert.deepEqual(validateResult(hex(dense.cases[0].hex), denseFormat), {ok: true})
})

test('SparseLoCo: parseResultFormat refuses a malformed format', () => {
  const good = {format: 'sparseloco', value_bits: 2, dct: false, layout_id: '00112233445566aa', tensors: [{name: 'w', shape: [8, 8], chunk: [4, 4], topk: 4}]}
  assert.equal(parseResultFormat(good).format, 'sparseloco')
  assert.throws(() => parseResultFormat({...good, format: 'lion'}), /unknown format/)
  assert.throws(() => parseResultFormat({...good, value_bits: 9}), /result_format/)
  assert.throws(() => parseResultFormat({...good, layout_id: 'xyz'}), /result_format/)
  assert.throws(() => parseResultFormat({...good, tensors: [{name: 'w', shape: [8, 8], chunk: [3, 4], topk: 4}]}), /tensor 0/)
  assert.throws(() => parseResultFormat({...good, tensors: [{name: 'w', shape: [8, 8], chunk: [4, 4], topk: 17}]}), /tensor 0/)
})
