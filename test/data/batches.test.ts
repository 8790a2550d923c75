import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import fc from 'fast-check'
import {SampleLayout, SeededPermutation, parseShuffle, windowsInFile} from '../../src/core/data/index.js'
import {PsycheError} from '../../src/core/errors.js'

const seed = (n: number) => Uint8Array.from({length: 32}, (_, i) => (i * 7 + n) % 256)

describe('batch id → window mapping', () => {
  it('cuts each file like Psyche: starts 0, s, 2s, … below numTokens - (s + 1)', () => {
    assert.equal(windowsInFile(10, 4), 2) // starts 0 and 4
    assert.equal(windowsInFile(9, 4), 1) // start 4 would fit exactly, Psyche's bound leaves it out
    assert.equal(windowsInFile(5, 4), 0)
    assert.equal(windowsInFile(0, 4), 0)
    assert.equal(windowsInFile(4097, 128), 31)
  })

  it('numbers windows file by file and never spans two files, skipping files too short for a sample', () => {
    const layout = new SampleLayout([10, 3, 0, 14], 4)
    assert.equal(layout.numSamples, 2 + 0 + 0 + 3)
    assert.deepEqual(
      [0, 1, 2, 3, 4].map((b) => layout.locate(b, 'd')),
      [
        {file: 0, start: 0, length: 5},
        {file: 0, start: 4, length: 5},
        {file: 3, start: 0, length: 5},
        {file: 3, start: 4, length: 5},
        {file: 3, start: 8, length: 5},
      ],
    )
  })

  it('fails a batch past the end naming it, or wraps around when configured', () => {
    const layout = new SampleLayout([10], 4)
    assert.throws(
      () => layout.locate(2, 'data/x'),
      (e: Error) => e instanceof PsycheError && /data\/x: batch 2 is past the end .*2 samples.*wrap-around is off/.test(e.message),
    )
    assert.deepEqual(layout.locate(5, 'd', true), {file: 0, start: 4, length: 5})
    assert.deepEqual(new SampleLayout([10], 4, {wrap: true}).locate(4, 'd'), {file: 0, start: 0, length: 5})
    assert.throws(() => layout.locate(-1, 'd'), /batch -1: a batch id is a non-negative integer/)
    assert.throws(() => layout.locate(1.5, 'd'), /batch 1.5/)
    assert.throws(() => new SampleLayout([3], 4).locate(0, 'tiny'), /tiny: batch 0: no file holds a whole sample of 5 tokens/)
  })

  it('shuffles with a seed: a deterministic bijection that depends on the seed', () => {
    fc.assert(
      fc.property(fc.integer({min: 1, max: 3000}), fc.uint8Array({minLength: 32, maxLength: 32}), (size, bytes) => {
        const perm = new SeededPermutation(size, bytes)
        const seen = new Uint8Array(size)
        for (let i = 0; i < size; i++) {
          const j = perm.apply(i)
          assert.ok(j >= 0 && j < size && seen[j] === 0)
          seen[j] = 1
        }
      }),
      {numRuns: 60},
    )
    const order = (s: Uint8Array) => Array.from({length: 1000}, (_, i) => new SeededPermutation(1000, s).apply(i))
    assert.deepEqual(order(seed(1)), order(seed(1)))
    assert.notDeepEqual(order(seed(1)), order(seed(2)))
    assert.ok(order(seed(1)).filter((v, i) => v === i).length < 20, 'a shuffle moves nearly everything')
  })

  it('applies the shuffle on top of wrap-around and file boundaries', () => {
    const plain = new SampleLayout([26, 18], 4)
    const shuffled = new SampleLayout([26, 18], 4, {shuffleSeed: seed(3), wrap: true})
    const starts = (l: SampleLayout, ids: number[]) => ids.map((b) => JSON.stringify(l.locate(b, 'd')))
    const all = [...Array(plain.numSamples).keys()]
    assert.deepEqual(new Set(starts(shuffled, all)), new Set(starts(plain, all)))
    assert.notDeepEqual(starts(shuffled, all), starts(plain, all))
    assert.deepEqual(starts(shuffled, [plain.numSamples + 2]), starts(shuffled, [2]))
  })

  it('reads every spelling of a Psyche shuffle and rejects malformed seeds', () => {
    assert.equal(parseShuffle('DontShuffle', 'x'), undefined)
    assert.equal(parseShuffle(undefined, 'x'), undefined)
    assert.deepEqual(parseShuffle({Seeded: [...seed(1)]}, 'x'), seed(1))
    assert.deepEqual(parseShuffle([...seed(1)], 'x'), seed(1))
    assert.throws(() => parseShuffle([1, 2, 3], 'data.toml: shuffle_seed'), /data.toml: shuffle_seed: a shuffle seed is exactly 32 integers in 0..255 \(got 3 values\)/)
    assert.throws(() => parseShuffle([...seed(1).slice(1), 256], 'x'), /exactly 32 integers/)
    assert.throws(() => parseShuffle('Shuffle' as never, 'x'), /expected "DontShuffle"/)
  })
})
