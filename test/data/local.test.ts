import assert from 'node:assert/strict'
import {mkdir, truncate, writeFile} from 'node:fs/promises'
import {join} from 'node:path'
import {describe, it} from 'node:test'
import {LocalTokenDataset, openDataProvider, windowsInFile} from '../../src/core/data/index.js'
import {tempDir, tokens, writeTokenFiles} from './fixtures.js'

const SEQ = 8

/** The expected samples worked out from the raw ids, independently of the providers' code. */
function expectedRows(files: Uint32Array[], seqLen: number): Uint32Array[] {
  const rows: Uint32Array[] = []
  for (const ids of files) for (let start = 0; start < ids.length - (seqLen + 1); start += seqLen) rows.push(ids.slice(start, start + seqLen + 1))
  return rows
}

async function mixedDir(tokenSize: 2 | 4) {
  const dir = await tempDir()
  const files = [tokens(100, 1000, 1), tokens(7, 1000, 2), tokens(61, 1000, 3)]
  await writeTokenFiles(dir, [
    {name: 'a.bin', ids: files[0], tokenSize},
    {name: 'b.ds', ids: files[1], tokenSize},
    {name: 'c.npy', ids: files[2], tokenSize},
  ])
  await writeFile(join(dir, 'notes.txt'), 'not tokens')
  return {dir, files}
}

describe('local data provider', () => {
  for (const tokenSize of [2, 4] as const) {
    it(`reads .bin, .ds and .npy files of ${tokenSize}-byte ids as Psyche cuts them`, async () => {
      const {dir, files} = await mixedDir(tokenSize)
      const provider = await openDataProvider({Local: dir}, {seqLen: SEQ, tokenSize})
      const rows = expectedRows(files, SEQ)
      assert.equal(provider.numSamples(), rows.length)
      assert.equal(rows.length, windowsInFile(100, SEQ) + windowsInFile(61, SEQ))
      const ids = [...rows.keys()].reverse()
      const got = await provider.getSamples(ids)
      assert.equal(got.length, ids.length * (SEQ + 1))
      ids.forEach((b, row) => assert.deepEqual(got.subarray(row * (SEQ + 1), (row + 1) * (SEQ + 1)), rows[b]))
      await provider.close()
    })
  }

  it('resolves a relative directory against baseDir and uses train/ of a corpus directory', async () => {
    const root = await tempDir()
    await mkdir(join(root, 'corpus', 'train'), {recursive: true})
    const ids = tokens(50, 300)
    await writeTokenFiles(join(root, 'corpus', 'train'), [{name: '0.bin', ids, tokenSize: 2}])
    const provider = await openDataProvider({Local: 'corpus'}, {seqLen: SEQ, baseDir: root})
    assert.deepEqual(await provider.getSamples([1]), ids.slice(SEQ, 2 * SEQ + 1))
    await provider.close()
  })

  it('fails batches past the end or wraps them, as configured', async () => {
    const {dir, files} = await mixedDir(2)
    const n = expectedRows(files, SEQ).length
    const strict = await openDataProvider({Local: dir}, {seqLen: SEQ})
    await assert.rejects(strict.getSamples([0, n]), new RegExp(`${dir}: batch ${n} is past the end of the data \\(${n} samples`))
    const wrapping = await openDataProvider({Local: dir}, {seqLen: SEQ, wrap: true})
    assert.deepEqual(await wrapping.getSamples([n + 3]), await strict.getSamples([3]))
    await Promise.all([strict.close(), wrapping.close()])
  })

  it("rejects ids beyond the model's vocabulary naming the batch and file", async () => {
    const dir = await tempDir()
    const ids = tokens(40, 100)
    ids[SEQ + 3] = 5000
    await writeTokenFiles(dir, [{name: 'x.bin', ids, tokenSize: 2}])
    const provider = await openDataProvider({Local: dir}, {seqLen: SEQ, vocabSize: 100})
    assert.deepEqual((await provider.getSamples([0])).length, SEQ + 1)
    await assert.rejects(provider.getSamples([0, 1]), new RegExp(`x.bin: batch 1: token id 5000 at position 3 is beyond the model's vocabulary \\(100\\)`))
    await provider.close()
  })

  it('rejects truncated files and token sizes that do not divide the file size', async () => {
    const dir = await tempDir()
    await writeTokenFiles(dir, [{name: 'x.bin', ids: tokens(40, 100), tokenSize: 4}])
    await truncate(join(dir, 'x.bin'), 158)
    await assert.rejects(openDataProvider({Local: dir}, {seqLen: SEQ, tokenSize: 4}), /x.bin: size 158 bytes is not a multiple of the token size \(4 bytes\)/)
    const npyDir = await tempDir()
    await writeTokenFiles(npyDir, [{name: 'y.npy', ids: tokens(40, 100), tokenSize: 2}])
    await truncate(join(npyDir, 'y.npy'), 128 + 60)
    await assert.rejects(openDataProvider({Local: npyDir}, {seqLen: SEQ}), /y.npy: header says 40 ids of 2 bytes but the file holds 60 data bytes/)
    const wrongDtype = await tempDir()
    await writeTokenFiles(wrongDtype, [{name: 'z.npy', ids: tokens(40, 100), tokenSize: 4}])
    await assert.rejects(openDataProvider({Local: wrongDtype}, {seqLen: SEQ, tokenSize: 2}), /z.npy: holds 4-byte ids but the token size is 2 bytes/)
    await assert.rejects(openDataProvider({Local: join(dir, 'missing')}, {seqLen: SEQ}), /missing: cannot read data directory \(ENOENT\)/)
  })

  it('checks manifest.json against the files and the model', async () => {
    const dir = await tempDir()
    const ids = tokens(64, 500)
    await writeTokenFiles(dir, [{name: 'train-0.bin', ids, tokenSize: 2}])
    const manifest = {format: 'psyche-tokens/1', token_size: 2, vocab_size: 500, tokens: 64, files: ['train-0.bin'], tokenizer: 't.json', tokenizer_sha256: 'ab'}
    await writeFile(join(dir, 'manifest.json'), JSON.stringify(manifest))
    const provider = await openDataProvider({Local: dir}, {seqLen: SEQ, vocabSize: 512})
    assert.equal(provider.vocabSize(), 500)
    await provider.close()
    await assert.rejects(openDataProvider({Local: dir}, {seqLen: SEQ, vocabSize: 400}), /manifest.json: data tokenized with a vocabulary of 500 ids, larger than the model's 400/)
    await assert.rejects(LocalTokenDataset.open(dir, {tokenizerSha256: 'cd'}), /manifest.json: tokenized with tokenizer sha256 ab, but the model's tokenizer is cd/)
    await writeFile(join(dir, 'manifest.json'), JSON.stringify({...manifest, tokens: 65}))
    await assert.rejects(openDataProvider({Local: dir}, {seqLen: SEQ}), /manifest.json: says 65 tokens but the files hold 64/)
    await writeFile(join(dir, 'manifest.json'), JSON.stringify({...manifest, token_size: 4}))
    await assert.rejects(openDataProvider({Local: dir}, {seqLen: SEQ}), /train-0.bin: size 128 bytes is not a multiple|says 64 tokens but the files hold 32/)
  })

  it('keeps LocalTokenDataset.getSamples(batchIds, seqLen) wrapping around as before', async () => {
    const dir = await tempDir()
    const ids = tokens(30, 100)
    await writeTokenFiles(dir, [{name: 'a.bin', ids, tokenSize: 2}])
    const dataset = await LocalTokenDataset.open(dir)
    assert.equal(dataset.numSamples(SEQ), 3)
    assert.deepEqual(await dataset.getSamples([4], SEQ), ids.slice(SEQ, 2 * SEQ + 1))
    await dataset.close()
  })
})
