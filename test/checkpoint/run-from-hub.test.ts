import assert from 'node:assert/strict'
import {readFileSync, writeFileSync} from 'node:fs'
import {join} from 'node:path'
import {after, before, describe, it} from 'node:test'
import {execa} from 'execa'
import {uploadCheckpoint} from '../../src/core/checkpoint/hub.js'
import {HubServer} from '../../src/core/checkpoint/hub-server.js'
import {demoCorpusDir, ensureDemoCorpus} from '../../src/core/corpus.js'
import {createModelFromTemplate} from '../../src/core/model.js'
import {templateStatePath} from '../../src/core/train/plan.js'
import {cliPath, tempDir} from '../helpers.js'

const TOKEN = 'hf_run_token'

describe('a run config whose checkpoint is a Hub repository', () => {
  const tmp = tempDir('psyche-run-hub-')
  let hub: HubServer
  let commit: string
  let paramHash: string

  before(async () => {
    await ensureDemoCorpus()
    hub = await HubServer.start({root: join(tmp.path, 'hub')})
    const created = await createModelFromTemplate({template: 'tiny-demo', out: join(tmp.path, 'model'), seed: 11, tokenizer: join(demoCorpusDir, 'tokenizer.json')})
    paramHash = created.paramHash
    commit = (await uploadCheckpoint({dir: join(tmp.path, 'model'), repo: 'runs/tiny', token: TOKEN, hubUrl: hub.url, message: 'seed 11'})).commit
    // a later commit on main: the config pins the first one by revision
    await createModelFromTemplate({template: 'tiny-demo', out: join(tmp.path, 'model'), seed: 12, force: true})
    await uploadCheckpoint({dir: join(tmp.path, 'model'), repo: 'runs/tiny', token: TOKEN, hubUrl: hub.url, message: 'seed 12'})
    const state = readFileSync(templateStatePath('tiny-demo'), 'utf8')
      .replace('[model.LLM.checkpoint.Local]\npath = "model"', `[model.LLM.checkpoint.Hub]\nrepo_id = "runs/tiny"\nrevision = "${commit}"`)
      .replace(/data_location = .*/, `data_location = { Local = ${JSON.stringify(join(demoCorpusDir, 'train'))} }`)
    assert.match(state, /checkpoint\.Hub/)
    writeFileSync(join(tmp.path, 'state.toml'), state)
  })
  after(async () => {
    await hub.close()
    tmp.cleanup()
  })

  it('downloads the pinned revision from HF_ENDPOINT into the cache and trains from it', async () => {
    const cache = join(tmp.path, 'cache')
    const args = [
      cliPath,
      'train',
      '--config',
      join(tmp.path, 'state.toml'),
      '--steps',
      '1',
      '--total-batch',
      '1',
      '--seq-len',
      '8',
      '--lr',
      '1e-30',
      '--json',
      '--threads',
      '1',
      '--eval-batches',
      '1',
      '--metrics',
      join(tmp.path, 'm.jsonl'),
    ]
    const r = await execa(process.execPath, args, {env: {HF_ENDPOINT: hub.url, HF_HUB_CACHE: cache, CI: '1'}, reject: false})
    assert.equal(r.exitCode, 0, String(r.stderr))
    // a step at lr 1e-30 moves no float32 parameter: the hash is the uploaded model's
    assert.equal(JSON.parse(String(r.stdout)).param_hash, paramHash)
    assert.equal(readFileSync(join(cache, 'models--runs--tiny', 'snapshots', commit, 'config.json'), 'utf8'), readFileSync(join(tmp.path, 'model', 'config.json'), 'utf8'))
    // an unreachable Hub is one clear error naming the repository
    const down = await execa(process.execPath, args, {env: {HF_ENDPOINT: 'http://127.0.0.1:9', HF_HUB_CACHE: join(tmp.path, 'empty'), CI: '1'}, reject: false})
    assert.equal(down.exitCode, 3)
    assert.match(String(down.stdout) + String(down.stderr), /runs\/tiny/)
  })
})
