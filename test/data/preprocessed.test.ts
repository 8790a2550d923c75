import assert from 'node:assert/strict'
import {mkdir, readFile, readdir, writeFile} from 'node:fs/promises'
import {join} from 'node:path'
import {describe, it} from 'node:test'
import {createRepo, uploadFiles} from '@huggingface/hub'
import {HubServer} from '../../src/core/checkpoint/hub-server.js'
import {openDataProvider} from '../../src/core/data/index.js'
import {MaskedSamples} from '../../src/core/data/provider.js'
import {resolveTrainPlan} from '../../src/core/train/plan.js'
import {ModelWorker} from '../../src/core/worker/model-worker.js'
import {parquetOf, writeChatDataset} from './chat.js'
import {tempDir} from './fixtures.js'

// Psyche's Preprocessed data (Parquet rows of inputs and labels) with loss masks, on a tiny chat dataset made with a
// tokenizer's chat template: only the assistant's tokens count toward the loss.

const L = 24

describe('Preprocessed: pre-tokenized examples with loss masks', () => {
  it("gives each example's ids and a loss mask of exactly its labelled (assistant) targets", async () => {
    const base = await tempDir()
    const rows = writeChatDataset(join(base, 'chat'), L)
    const provider = await openDataProvider({Preprocessed: 'chat'}, {seqLen: L, baseDir: base, requireLossMasks: true})
    assert.equal(provider.numSamples(), 4)
    assert.match(provider.description, /chat \(4 examples of 24 tokens, with loss masks\)$/)
    const got = await provider.getSamples([0, 1, 2, 3])
    assert.ok(got instanceof MaskedSamples)
    for (let r = 0; r < 4; r++) {
      assert.deepEqual([...got.subarray(r * L, (r + 1) * L)], rows.inputs[r])
      const mask: number[] = [...got.lossMask.subarray(r * (L - 1), (r + 1) * (L - 1))]
      assert.deepEqual(
        mask,
        rows.labels[r].slice(1).map((label) => (label === -100 ? 0 : 1)),
      )
      // the mask counts the assistant's tokens (the reply and its end-of-text), nothing of the prompt
      const assistant = rows.examples[r].assistant.slice(1, L)
      assert.deepEqual(mask.slice(0, assistant.length), assistant)
      assert.ok(mask.some(Boolean) && !mask.every(Boolean))
    }
    // shuffled by the run's seed: the same examples, another order; past the end with wrap: the start again
    const shuffled = await openDataProvider({Preprocessed: join(base, 'chat')}, {seqLen: L, shuffleSeed: Array.from({length: 32}, (_, i) => i + 1), wrap: true})
    const order = await shuffled.getSamples([0, 1, 2, 3])
    const key = (s: Uint32Array) => Array.from({length: 4}, (_, r) => s.subarray(r * L, (r + 1) * L).join(','))
    assert.deepEqual(key(order).sort(), key(got).sort())
    assert.deepEqual(await shuffled.getSamples([5]), await shuffled.getSamples([1]))
    // the same examples in a gzip-compressed file read the same
    await mkdir(join(base, 'gzip'))
    await writeFile(join(base, 'gzip', 'train.parquet'), parquetOf({inputs: rows.inputs, labels: rows.labels}, 'GZIP'))
    const gzip = await openDataProvider({Preprocessed: 'gzip'}, {seqLen: L, baseDir: base})
    const again = (await gzip.getSamples([0, 1, 2, 3])) as MaskedSamples
    assert.deepEqual([...again], [...got])
    assert.deepEqual([...again.lossMask], [...got.lossMask])
  })

  it('the mask reaches the worker: masked-out targets change nothing, counted ones do', async () => {
    const base = await tempDir()
    writeChatDataset(join(base, 'chat'), L)
    const provider = await openDataProvider({Preprocessed: 'chat'}, {seqLen: L, baseDir: base})
    const masked = (await provider.getSamples([0, 1, 2, 3])) as MaskedSamples
    // the last id of a row is only a target, and padding there is masked out: change it
    const changed = new MaskedSamples(masked.length, masked.lossMask)
    changed.set(masked)
    for (let r = 0; r < 4; r++) changed[(r + 1) * L - 1] = (changed[(r + 1) * L - 1] + 7) % 40
    const plain = Uint32Array.from(masked)
    const worker = await ModelWorker.start({threads: 1, device: 'cpu'})
    try {
      await worker.initFromConfig(
        {
          architectures: ['LlamaForCausalLM'],
          model_type: 'llama',
          vocab_size: 64,
          hidden_size: 32,
          intermediate_size: 64,
          num_hidden_layers: 1,
          num_attention_heads: 2,
          num_key_value_heads: 2,
          max_position_embeddings: 64,
        },
        1,
      )
      await worker.configure({optimizer: {AdamW: {betas: [0.9, 0.95], weight_decay: 0, eps: 1e-8}}, micro_batch: 2})
      const a = await worker.evaluate(masked, 4)
      const b = await worker.evaluate(changed, 4)
      const c = await worker.evaluate(plain, 4)
      assert.equal(a.loss, b.loss, 'a masked-out target does not count')
      assert.notEqual(a.loss, c.loss, 'without the mask every target counts')
      const step = await worker.trainStep(masked, 4, 0)
      assert.ok(Number.isFinite(step.loss) && step.loss > 0)
    } finally {
      await worker.shutdown()
    }
  })

  it('refuses bad datasets before training, naming the file, the row and the column', async () => {
    const base = await tempDir()
    const rows = writeChatDataset(join(base, 'good'), L)
    const open = (dir: string, extra = {}) => openDataProvider({Preprocessed: dir}, {seqLen: L, baseDir: base, ...extra})
    const bad = async (name: string, columns: Record<string, number[][]>) => {
      await mkdir(join(base, name))
      await writeFile(join(base, name, 'train-0.parquet'), parquetOf(columns))
      return join(base, name, 'train-0.parquet')
    }
    // a truncated file
    const whole = await readFile(join(base, 'good', 'train.parquet'))
    await mkdir(join(base, 'cut'))
    await writeFile(join(base, 'cut', 'train.parquet'), whole.subarray(0, whole.length - 40))
    await assert.rejects(open('cut'), new RegExp(`${join(base, 'cut', 'train.parquet')}: not a readable Parquet file`))
    // a row of the wrong length
    const short = await bad('short', {inputs: rows.inputs.map((r, i) => (i === 2 ? r.slice(1) : r)), labels: rows.labels})
    await assert.rejects(open('short'), new RegExp(`${short}: row 2: inputs has 23 ids instead of max_seq_len 24`))
    // a label that is neither the input id nor -100
    const wrong = rows.labels.map((r) => [...r])
    wrong[1][10] = (rows.inputs[1][10] + 1) % 40
    const mislabelled = await bad('mislabelled', {inputs: rows.inputs, labels: wrong})
    await assert.rejects(open('mislabelled'), new RegExp(`${mislabelled}: row 1: labels\\[10\\] = \\d+ differs from inputs\\[10\\] = \\d+`))
    // packed sequences: refused by the support table
    const packed = await bad('packed', {inputs: rows.inputs, labels: rows.labels, position_ids: rows.inputs.map((r) => r.map((_, i) => i))})
    await assert.rejects(open('packed'), new RegExp(`${packed}: column position_ids: packed sequences \\(position_ids\\) need attention masked per packed example`))
    // Finetuning without labels
    await bad('unlabelled', {inputs: rows.inputs})
    await assert.rejects(open('unlabelled', {requireLossMasks: true}), /data_type Finetuning needs loss masks, but .*unlabelled has no labels column/)
    assert.equal((await open('unlabelled')).numSamples(), 4, 'without labels (Pretraining) every target counts')
    // ids beyond the model's vocabulary, no train split, no directory
    await assert.rejects(open('good', {vocabSize: 10}), /train\.parquet: batch 0: token id \d+ at position \d+ is beyond the model's vocabulary \(10\)/)
    await mkdir(join(base, 'nosplit'))
    await writeFile(join(base, 'nosplit', 'test.parquet'), whole)
    await assert.rejects(open('nosplit'), /data_location\.Preprocessed: .*nosplit holds no train split/)
    await assert.rejects(open('missing'), /data_location\.Preprocessed: .*missing is not a directory/)
  })

  it('a Finetuning run (psyche train, psyche join) is refused at its plan when the dataset has no labels', async () => {
    const base = await tempDir()
    const rows = writeChatDataset(join(base, 'chat'), L)
    await mkdir(join(base, 'plain'))
    await writeFile(join(base, 'plain', 'train.parquet'), parquetOf({inputs: rows.inputs}))
    await mkdir(join(base, 'model'))
    await writeFile(join(base, 'model', 'config.json'), '{"model_type": "llama"}')
    const config = (data: string) =>
      readFile('templates/tiny-demo/state.toml', 'utf8').then((text) =>
        text.replace('data_type = "Pretraining"', 'data_type = "Finetuning"').replace(/data_location = \{[^}]*\}/, `data_location = {Preprocessed = "${data}"}`),
      )
    await writeFile(join(base, 'plain.toml'), await config('plain'))
    await assert.rejects(
      resolveTrainPlan({config: join(base, 'plain.toml')}),
      /plain\.toml: model\.LLM\.data_location\.Preprocessed: data_type Finetuning needs loss masks, but .*plain\/train\.parquet has no labels column/,
    )
    await writeFile(join(base, 'chat.toml'), await config('chat'))
    const plan = await resolveTrainPlan({config: join(base, 'chat.toml')})
    assert.equal(plan.dataType, 'Finetuning')
    assert.deepEqual(plan.data, {Preprocessed: join(base, 'chat')})
  })

  it('a Preprocessed location that names a Hub dataset repository is downloaded (its Parquet files only, hash-checked) from a Hub on 127.0.0.1 and read', async () => {
    const base = await tempDir()
    const hub = await HubServer.start({root: join(base, 'hub')})
    try {
      const rows = writeChatDataset(join(base, 'local'), L)
      const parquet = await readFile(join(base, 'local', 'train.parquet'))
      const accessToken = 'hf_datasetwriter'
      const upload = async (name: string, files: Record<string, Uint8Array | string>) => {
        await createRepo({repo: {type: 'dataset', name}, accessToken, hubUrl: hub.url})
        await uploadFiles({
          repo: {type: 'dataset', name},
          accessToken,
          hubUrl: hub.url,
          files: Object.entries(files).map(([path, content]) => ({path, content: new Blob([typeof content === 'string' ? content : Buffer.from(content)])})),
        })
      }
      // Hugging Face's layout: data/{split}-NNNNN-of-NNNNN.parquet, beside a README; a model repository of the same name is another repository
      await upload('me/chat', {
        'README.md': '# chat\n',
        'data/train-00000-of-00001.parquet': parquet,
        'data/test-00000-of-00001.parquet': parquetOf({inputs: rows.inputs.slice(0, 1)}),
      })
      await upload('me/nosplit', {'data/validation.parquet': parquet})
      await upload('me/truncated', {'train.parquet': parquet.subarray(0, parquet.length - 40)})
      const config = (data: string) =>
        readFile('templates/tiny-demo/state.toml', 'utf8').then((text) =>
          text.replace('data_type = "Pretraining"', 'data_type = "Finetuning"').replace(/data_location = \{[^}]*\}/, `data_location = {Preprocessed = "${data}"}`),
        )
      const cacheDir = join(base, 'cache')
      const plan = async (data: string) => {
        await writeFile(join(base, 'run.toml'), await config(data))
        await mkdir(join(base, 'model'), {recursive: true})
        await writeFile(join(base, 'model', 'config.json'), '{"model_type": "llama"}')
        return resolveTrainPlan({config: join(base, 'run.toml'), model: join(base, 'model'), hub: {url: hub.url, cacheDir}})
      }
      const got = await plan('me/chat')
      const dir = (got.data as {Preprocessed: string}).Preprocessed
      assert.match(dir, /datasets--me--chat\/snapshots\/[0-9a-f]{40}\/data$/)
      assert.deepEqual((await readdir(dir)).sort(), ['test-00000-of-00001.parquet', 'train-00000-of-00001.parquet'], 'the Parquet files only: no README')
      const provider = await openDataProvider(got.data as {Preprocessed: string}, {seqLen: L, requireLossMasks: true})
      const local = await openDataProvider({Preprocessed: join(base, 'local')}, {seqLen: L, requireLossMasks: true})
      assert.equal(provider.numSamples(), 4, 'the train split only')
      const [a, b] = [(await provider.getSamples([0, 1, 2, 3])) as MaskedSamples, (await local.getSamples([0, 1, 2, 3])) as MaskedSamples]
      assert.deepEqual([...a], [...b])
      assert.deepEqual([...a.lossMask], [...b.lossMask])
      // a second plan uses the cache: the same directory, nothing fetched again
      assert.equal(((await plan('me/chat')).data as {Preprocessed: string}).Preprocessed, dir)
      // bad input, each named
      await assert.rejects(plan('me/nosplit'), /the Hub dataset me\/nosplit@[0-9a-f]{40} holds no train split/)
      await assert.rejects(plan('me/missing'), /me\/missing@main: the Hub answered 404/)
      await assert.rejects(plan('not a repo'), /data_location\.Preprocessed = "not a repo": no such directory .*and not a Hub dataset repository id/)
      await assert.rejects(plan('me/truncated'), /datasets--me--truncated\/snapshots\/[0-9a-f]{40}\/train\.parquet: not a readable Parquet file/)
    } finally {
      await hub.close()
    }
  })
})
