import assert from 'node:assert/strict'
import {writeFile} from 'node:fs/promises'
import {join} from 'node:path'
import {describe, it} from 'node:test'
import {DataServer, LocalTokenDataset, openDataProvider, parseShuffle, type DataLocation, type DataProvider} from '../../src/core/data/index.js'
import {serveDirectory, tempDir, tokens, writeTokenFiles} from './fixtures.js'

const SEQ = 32
const SEED = Array.from({length: 32}, (_, i) => i + 1)

describe('one dataset through all three providers', () => {
  for (const shuffled of [false, true]) {
    it(`gives identical token ids for the same batch ids (${shuffled ? 'seeded shuffle' : 'DontShuffle'}, wrap-around on)`, async () => {
      const dir = await tempDir()
      const names = ['000.ds', '001.ds', '002.ds']
      const files = [tokens(1000, 32000, 1), tokens(517, 32000, 2), tokens(2049, 32000, 3)]
      await writeTokenFiles(
        dir,
        names.map((name, i) => ({name, ids: files[i], tokenSize: 2 as const})),
      )
      await writeFile(join(dir, 'manifest.json'), JSON.stringify({format: 'psyche-tokens/1', token_size: 2, vocab_size: 32000, tokens: 1000 + 517 + 2049, files: names}))

      const {base} = await serveDirectory(dir)
      const dataset = await LocalTokenDataset.open(dir)
      const server = await DataServer.start(dataset.provider({seqLen: SEQ, shuffleSeed: shuffled ? parseShuffle(SEED, 'seed') : undefined}), {host: '127.0.0.1', port: 0})
      const common = {seqLen: SEQ, vocabSize: 32000, wrap: true}
      const locations: DataLocation[] = [
        {Local: dir},
        {
          Http: {
            location: {NumberedFiles: {url_template: `${base}/{}.ds`, start_index: 0, n_left_pad_zeros: 3, num_files: 3}},
            token_size_in_bytes: 'TwoBytes',
            shuffle: shuffled ? {Seeded: SEED} : 'DontShuffle',
          },
        },
        {Server: `127.0.0.1:${server.port}`},
      ]
      const providers: DataProvider[] = []
      for (const location of locations) providers.push(await openDataProvider(location, {...common, shuffleSeed: shuffled ? SEED : undefined}))
      try {
        const total = providers[0].numSamples()!
        assert.equal(total, 31 + 16 + 63)
        for (const p of providers) assert.equal(p.numSamples(), total)
        const batchIds = [0, 1, 2, 30, 31, 46, 47, 109, 5, 5, total, total + 17, 3 * total - 1]
        const answers = await Promise.all(providers.map((p) => p.getSamples(batchIds)))
        assert.equal(answers[0].length, batchIds.length * (SEQ + 1))
        assert.deepEqual(answers[1], answers[0], 'HTTP = Local')
        assert.deepEqual(answers[2], answers[0], 'TCP data server = Local')
        // Check a row against the raw files, not just provider against provider.
        const row = (b: number) => answers[0].subarray(batchIds.indexOf(b) * (SEQ + 1), (batchIds.indexOf(b) + 1) * (SEQ + 1))
        if (!shuffled) {
          assert.deepEqual(row(31), files[1].slice(0, SEQ + 1))
          assert.deepEqual(row(47), files[2].slice(0, SEQ + 1))
        } else {
          assert.notDeepEqual(row(0), files[0].slice(0, SEQ + 1))
        }
      } finally {
        await Promise.all(providers.map((p) => p.close()))
        await server.close()
        await dataset.close()
      }
    })
  }
})
