import assert from 'node:assert/strict'
import {mkdirSync, readdirSync, readFileSync, writeFileSync} from 'node:fs'
import {join} from 'node:path'
import {after, before, describe, it} from 'node:test'
import {openDataServer} from '../../src/core/data/serve.js'
import {runCli, tempDir, tinyModelConfig} from '../helpers.js'
import {writeChatDataset} from './chat.js'
import {serveBucket, serveDirectory, tokens, writeTokenFiles} from './fixtures.js'

// Done-when of the data half of issue 35: every real Psyche config (test/fixtures/psyche-configs, unchanged copies of
// Psyche's config/ folder), with its data replaced by a local server of the same location kind and its model by a tiny
// Llama, trains 2 steps with `psyche train --config`, and the model changes. Consilience names HfDeepseek: its model is
// a tiny DeepSeek-V3, trained with its config's DisTrO.

const FIXTURES = 'test/fixtures/psyche-configs'
const SEQ = 32
const tmp = tempDir('psyche-configs-')
after(() => tmp.cleanup())

/** Every state.toml / config.toml of the fixtures, by kind of data location. */
function configs(): string[] {
  return readdirSync(FIXTURES, {recursive: true, encoding: 'utf8'})
    .filter((f) => /(state|config)\.toml$|-config(-gcs)?\.toml$/.test(f) && !f.endsWith('data.toml'))
    .sort()
}

const model = join(tmp.path, 'model')
const tokensDir = join(tmp.path, 'tokens')
const ids = tokens(4000, 4096, 3)
// The servers live for the whole file (registered at its top level, so they stop after it).
mkdirSync(model)
writeFileSync(join(model, 'config.json'), JSON.stringify(tinyModelConfig))
const deepseek = join(tmp.path, 'deepseek')
mkdirSync(deepseek)
const tinyDeepseek = (JSON.parse(readFileSync('test/fixtures/tiny-architectures.json', 'utf8')) as Record<string, {config: object}>).deepseek_v3.config
writeFileSync(join(deepseek, 'config.json'), JSON.stringify(tinyDeepseek))
mkdirSync(tokensDir)
await writeTokenFiles(tokensDir, [{name: '000.ds', ids, tokenSize: 2}])
// Http and WeightedHttp: files, and a mixture of two NumberedFiles sources, on one server
const web = join(tmp.path, 'web')
mkdirSync(join(web, 'a'), {recursive: true})
mkdirSync(join(web, 'b'))
await writeTokenFiles(join(web, 'a'), [
  {name: '000.ds', ids: ids.slice(0, 2000), tokenSize: 2},
  {name: '001.ds', ids: ids.slice(2000), tokenSize: 2},
])
await writeTokenFiles(join(web, 'b'), [{name: '000.ds', ids: tokens(3000, 4096, 4), tokenSize: 2}])
const http = (await serveDirectory(web)).base
const source = (s: string, n: number) => ({
  location: {NumberedFiles: {url_template: `${http}/${s}/{}.ds`, start_index: 0, n_left_pad_zeros: 3, num_files: n}},
  token_size_in_bytes: 'TwoBytes',
  shuffle: 'DontShuffle',
})
writeFileSync(
  join(web, 'mix.json'),
  JSON.stringify({
    shuffle: {Seeded: Array.from({length: 32}, (_, i) => i)},
    providers: [
      [source('a', 2), 0.7],
      [source('b', 1), 0.3],
    ],
  }),
)
// Gcp: the bucket and prefix the configs name, on a local Cloud Storage endpoint
const bucket = join(tmp.path, 'bucket')
mkdirSync(join(bucket, 'fineweb-edu-tokenized-llama2'), {recursive: true})
await writeTokenFiles(join(bucket, 'fineweb-edu-tokenized-llama2'), [
  {name: '00000.ds', ids: ids.slice(0, 1500), tokenSize: 2},
  {name: '00001.ds', ids: ids.slice(1500), tokenSize: 2},
])
const gcsEndpoint = (await serveBucket(bucket, 'nous-pretraining-public-us')).endpoint

// Two runs at a time: each worker uses one thread.
describe("Psyche's run configs train with their data from a local server of the same kind", {concurrency: 2}, () => {
  const initialHash: Record<string, string> = {}
  before(async () => {
    // the tiny Llama every run starts from (random weights, seed 0), the tiny DeepSeek-V3 consilience starts from,
    // and their parameter hashes
    const inits = await Promise.all([model, deepseek].map((out) => runCli(['model', 'init', '--out', out, '--json'])))
    for (const [i, out] of [model, deepseek].entries()) {
      assert.equal(inits[i].exitCode, 0, inits[i].stderr)
      initialHash[out] = JSON.parse(inits[i].stdout).param_hash
    }
  })

  /** Trains 2 steps of `text` (a rewritten config) and checks the run: finite losses, and the model changed. */
  async function train(name: string, text: string, env: Record<string, string> = {}, from = model): Promise<Record<string, number>> {
    const file = join(tmp.path, `${name.replace(/\//g, '-')}`)
    writeFileSync(file, text)
    const r = await runCli(
      [
        'train',
        '--config',
        file,
        '--model',
        from,
        '--steps',
        '2',
        '--seq-len',
        String(SEQ),
        '--total-batch',
        '4',
        '--micro-batch',
        '4',
        '--threads',
        '1',
        '--metrics',
        join(tmp.path, `${name.replace(/\//g, '-')}.jsonl`),
        '--json',
      ],
      {env},
    )
    assert.equal(r.exitCode, 0, `${name}: ${r.stdout} ${r.stderr}`)
    const summary = JSON.parse(r.stdout)
    assert.equal(summary.steps, 2, name)
    assert.ok(Number.isFinite(summary.first_loss) && Number.isFinite(summary.last_loss), name)
    assert.notEqual(summary.param_hash, initialHash[from], `${name}: the model changed`)
    return summary
  }

  for (const config of configs()) {
    it(config, async () => {
      let text = readFileSync(join(FIXTURES, config), 'utf8')
      if (/data_location = "Dummy"/.test(text)) {
        // Psyche's test placeholder: no data at all, refused by the support table
        const file = join(tmp.path, 'dummy.toml')
        writeFileSync(file, text)
        const r = await runCli(['train', '--config', file, '--model', model, '--steps', '2', '--json'])
        // the optimizer is Dummy too; whichever placeholder is named first, training is refused
        assert.notEqual(r.exitCode, 0)
        assert.match(r.stdout + r.stderr, /= \\"Dummy\\"/)
        return
      }
      if (/Server = "/.test(text)) {
        const dataToml = join(tmp.path, `${config.replace(/\//g, '-')}.data.toml`)
        const original = readFileSync(join(FIXTURES, config.replace(/state\.toml$/, 'data.toml')), 'utf8')
        writeFileSync(dataToml, original.replace(/dir = ".*"/, `dir = ${JSON.stringify(tokensDir)}`).replace(/seq_len = \d+/, `seq_len = ${SEQ}`))
        const served = await openDataServer(dataToml, {host: '127.0.0.1', port: 0})
        try {
          text = text.replace(/Server = "[^"]*"/, `Server = "127.0.0.1:${served.server.port}"`)
          await train(config, text)
        } finally {
          await served.close()
        }
        return
      }
      if (/WeightedHttp = "/.test(text)) {
        // consilience: HfDeepseek, a tiny DeepSeek-V3 (DisTrO over its fused 3-D experts, as the config says)
        assert.match(text, /architecture = "HfDeepseek"/)
        text = text.replace(/WeightedHttp = "[^"]*"/, `WeightedHttp = "${http}/mix.json"`)
        const summary = await train(config, text, {}, deepseek)
        const distro = summary.distro as unknown as {result_bytes: number; dense_bytes: number}
        assert.ok(distro && distro.result_bytes > 0 && distro.result_bytes < distro.dense_bytes / 100, `consilience trained with DisTrO: ${JSON.stringify(distro)}`)
        return
      }
      if (/location\.Gcp\]/.test(text)) {
        // the bucket and prefix stay as Psyche wrote them: only the Cloud Storage endpoint is local
        await train(config, text, {PSYCHE_GCS_ENDPOINT: gcsEndpoint})
        return
      }
      if (/SingleUrl = "/.test(text)) {
        text = text.replace(/SingleUrl = "[^"]*"/, `SingleUrl = "${http}/a/000.ds"`)
        await train(config, text)
        return
      }
      assert.fail(`${config}: a data location this test does not know`)
    })
  }

  it('a Finetuning run on Preprocessed chat examples (Psyche config, data_type and data replaced)', async () => {
    writeChatDataset(join(tmp.path, 'chat'), SEQ, 2)
    const text = readFileSync(join(FIXTURES, 'llama2-20m-dolma-noverify-first-checkpointer/state.toml'), 'utf8')
      .replace('data_type = "Pretraining"', 'data_type = "Finetuning"')
      .replace(/\[model\.LLM\.data_location\]\nServer = "[^"]*"/, `[model.LLM.data_location]\nPreprocessed = "chat"`)
    const summary = await train('finetune.toml', text)
    assert.ok(summary.last_loss > 0)
    // the same run on a token stream is refused: it has no loss masks
    const stream = join(tmp.path, 'finetune-stream.toml')
    writeFileSync(stream, text.replace('Preprocessed = "chat"', `Local = ${JSON.stringify(tokensDir)}`))
    const r = await runCli(['train', '--config', stream, '--model', model, '--steps', '2'])
    assert.notEqual(r.exitCode, 0)
    assert.match(r.stderr, /model\.LLM\.data_type = "Finetuning": Finetuning trains on examples with loss masks, which only Preprocessed data carries/)
  })
})
