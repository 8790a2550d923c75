import type {EventLine} from '../../src/core/events.js'
import assert from 'node:assert/strict'
import {existsSync, readdirSync} from 'node:fs'
import {join} from 'node:path'
import {after, before, describe, it} from 'node:test'
import {Checkpointer} from '../../src/core/checkpoint/checkpointer.js'
import {downloadCheckpoint} from '../../src/core/checkpoint/hub.js'
import {HubServer} from '../../src/core/checkpoint/hub-server.js'
import {ModelWorker} from '../../src/core/worker/model-worker.js'
import {tempDir, tinyModelConfig} from '../helpers.js'

const TOKEN = 'hf_ckpt_token'

describe('checkpointer: save on the training path, upload in the background', () => {
  const tmp = tempDir('psyche-checkpointer-')
  let hub: HubServer
  let worker: ModelWorker

  before(async () => {
    hub = await HubServer.start({root: join(tmp.path, 'hub')})
    worker = await ModelWorker.start({threads: 1, device: 'cpu'})
  })
  after(async () => {
    await worker.shutdown()
    await hub.close()
    tmp.cleanup()
  })

  it('uploads each epoch end as a commit and reports it; the newest checkpoint is what the branch holds', async () => {
    const reported: {step: number; revision: string}[] = []
    const hashes = new Map<number, string>()
    const checkpointer = new Checkpointer({
      repo: 'run/ckpt',
      revision: 'main',
      hubUrl: hub.url,
      token: TOKEN,
      stagingDir: join(tmp.path, 'staging'),
      save: (dir, card) => worker.save(dir, {card}),
      onUploaded: (c) => reported.push({step: c.step, revision: c.revision}),
    })
    for (const [step, seed] of [
      [10, 1],
      [20, 2],
      [30, 3],
    ] as const) {
      hashes.set(step, (await worker.initFromConfig(tinyModelConfig, seed)).param_hash)
      await checkpointer.checkpoint(step, step / 10)
      assert.ok(
        reported.every((r) => r.step !== step),
        'checkpoint() returns before its upload is reported',
      )
    }
    await checkpointer.idle()
    const steps = reported.map((r) => r.step)
    assert.equal(steps.at(-1), 30, 'the newest checkpoint is uploaded')
    assert.deepEqual(
      [...steps].sort((a, b) => a - b),
      steps,
      'in order',
    )
    assert.deepEqual(readdirSync(join(tmp.path, 'staging')), [], 'staging directories are removed')
    const down = await downloadCheckpoint({repo: 'run/ckpt', revision: reported.at(-1)!.revision, out: join(tmp.path, 'out'), cacheDir: join(tmp.path, 'cache'), hubUrl: hub.url})
    assert.ok(existsSync(join(down.dir, 'tokenizer.json')) && existsSync(join(down.dir, 'README.md')))
    assert.equal((await worker.load(down.dir)).param_hash, hashes.get(30))
    const info = (await (await fetch(`${hub.url}/api/models/run/ckpt`)).json()) as {sha: string}
    assert.equal(info.sha, reported.at(-1)!.revision)
  })

  it('a save that is not its own (--checkpoint-dir) is uploaded from where it is and never removed, superseded or not; uploading names the steps whose directories must stay', async () => {
    const events: EventLine[] = []
    const checkpointer = new Checkpointer({
      repo: 'run/kept',
      hubUrl: hub.url,
      token: TOKEN,
      stagingDir: join(tmp.path, 'staging-unused'),
      save: () => assert.fail('upload() saves nothing'),
      onUploaded: () => {},
      log: (e) => events.push(e),
    })
    const dirs = [1, 2, 3].map((step) => join(tmp.path, 'kept', `step-${step}`))
    for (const dir of dirs) await worker.save(dir, {card: {}})
    await checkpointer.upload(1, 0, dirs[0])
    await checkpointer.upload(2, 1, dirs[1])
    await checkpointer.upload(3, 2, dirs[2]) // supersedes step 2, waiting behind step 1's upload
    assert.deepEqual(checkpointer.uploading, [1, 3])
    await checkpointer.idle()
    assert.deepEqual(checkpointer.uploading, [])
    assert.deepEqual(
      events.filter((e) => e.event === 'checkpoint_uploaded').map((e) => e.step),
      [1, 3],
    )
    assert.ok(events.some((e) => e.event === 'checkpoint_superseded' && e.step === 2 && e.by === 3))
    for (const dir of dirs) assert.ok(existsSync(join(dir, 'config.json')), `${dir} stays`)
    assert.equal(existsSync(join(tmp.path, 'staging-unused')), false)
  })

  it('a failed upload is logged, not thrown: training goes on', async () => {
    const events: EventLine[] = []
    const checkpointer = new Checkpointer({
      repo: 'run/other',
      hubUrl: 'http://127.0.0.1:9',
      token: TOKEN,
      stagingDir: join(tmp.path, 'staging2'),
      save: (dir, card) => worker.save(dir, {card}),
      onUploaded: () => assert.fail('nothing was uploaded'),
      log: (e) => events.push(e),
    })
    await checkpointer.checkpoint(5, 1)
    await checkpointer.idle()
    assert.ok(events.some((e) => e.event === 'checkpoint_upload_failed' && e.step === 5))
  })
})
