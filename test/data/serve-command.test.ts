import assert from 'node:assert/strict'
import {writeFile} from 'node:fs/promises'
import {join} from 'node:path'
import {createInterface} from 'node:readline'
import {describe, it} from 'node:test'
import {execa} from 'execa'
import {LocalTokenDataset, TcpDataProvider, parseShuffle} from '../../src/core/data/index.js'
import {nonSnakeKeys} from '../../src/core/cli/json.js'
import {tempDir, tokens, writeTokenFiles} from './fixtures.js'

const SEED = Array.from({length: 32}, (_, i) => 32 - i)

describe('psyche data serve', () => {
  it("serves a data.toml's directory, shuffled by its seed, until interrupted", async () => {
    const dir = await tempDir()
    await writeTokenFiles(join(dir, '.'), [{name: 'x.ds', ids: tokens(3000, 30000), tokenSize: 2}])
    await writeFile(join(dir, 'data.toml'), `dir = "."\ntoken_size = "TwoBytes"\nseq_len = 64\nshuffle_seed = [${SEED.join(', ')}]\n`)
    const child = execa('node', ['bin/psyche.js', 'data', 'serve', '--data-config', join(dir, 'data.toml'), '--port', '0', '--host', '127.0.0.1', '--json'], {reject: false})
    try {
      const first = await new Promise<string>((resolve) => createInterface({input: child.stdout!}).once('line', resolve))
      const {listening} = JSON.parse(first)
      assert.equal(listening.samples, 46)
      assert.equal(listening.seq_len, 64)
      assert.deepEqual(nonSnakeKeys(listening), [], 'every --json key is snake_case')
      const client = await TcpDataProvider.connect(`127.0.0.1:${listening.port}`, {seqLen: 64})
      const dataset = await LocalTokenDataset.open(dir)
      const local = dataset.provider({seqLen: 64, shuffleSeed: parseShuffle(SEED, 'seed')})
      assert.deepEqual(await client.getSamples([0, 9, 45]), await local.getSamples([0, 9, 45]))
      await client.close()
      await dataset.close()
    } finally {
      child.kill('SIGINT')
    }
    const result = await child
    assert.equal(result.exitCode, 0, result.stderr)
  })

  it('names the data.toml field that is wrong', async () => {
    const dir = await tempDir()
    await writeFile(join(dir, 'data.toml'), `dir = "."\ntoken_size = "ThreeBytes"\nseq_len = 64\nshuffle_seed = [${SEED.join(', ')}]\n`)
    const result = await execa('node', ['bin/psyche.js', 'data', 'serve', '--data-config', join(dir, 'data.toml')], {reject: false})
    assert.equal(result.exitCode, 1)
    assert.match(result.stderr, /data.toml.*token_size/)
    assert.doesNotMatch(result.stderr, /at .*\.ts:\d+/)
  })
})
