import assert from 'node:assert/strict'
import {join} from 'node:path'
import {after, before, describe, it} from 'node:test'
import {ModelLoading} from '../../src/core/client/model-loading.js'
import {HubServer} from '../../src/core/checkpoint/hub-server.js'
import {uploadCheckpoint} from '../../src/core/checkpoint/hub.js'
import type {CoordinatorState} from '../../src/core/coordinator/index.js'
import type {ModelSnapshot} from '../../src/core/p2p/index.js'
import {generateIdentity} from '../../src/core/protocol/identity.js'
import {tempDir} from '../helpers.js'
import {newRun} from '../coordinator/helpers.js'
import {DeterministicWorker} from '../sim/harness.js'
import {phaseWorld} from './helpers.js'

const DISTRO = {Distro: {compression_decay: 0.999, compression_topk: 8, compression_chunk: 64, quantize_1bit: true, weight_decay: 0}}
const TOKEN = 'hf_model_loading'

/** A run whose model is the plan's (a Dummy checkpoint), or `checkpoint`. */
function run(checkpoint: Record<string, unknown> = {Dummy: {repo_id: 'org/model'}}, over: Partial<CoordinatorState> = {}): CoordinatorState {
  return {...newRun({}, {checkpoint, optimizer: DISTRO} as never), ...over}
}

/** The model another replica serves at `step` (its exported parameters). */
async function served(step: number, o: {paramHash?: string} = {}): Promise<ModelSnapshot> {
  const other = new DeterministicWorker()
  await other.initFromConfig({other: true}, 3)
  const e = await other.exportParams()
  return {step, paramHash: o.paramHash ?? e.paramHash, frames: e.frames.map((f) => ({name: f.name!, dtype: f.dtype, shape: f.shape, data: f.data as Uint8Array}))}
}

describe('model loading', () => {
  it("the run's starting model: the plan's, set up with the run's optimizer and LR schedule; our model is at the step, and served", async () => {
    const state = run()
    const w = phaseWorld({identity: generateIdentity(), state, modelStep: null})
    assert.equal(await new ModelLoading(w.ctx).load(0, 'checkpoint'), true)
    assert.deepEqual(w.worker.configured!.optimizer, DISTRO, "the run's DisTrO settings, not the plan's")
    assert.deepEqual(w.worker.configured!.lr_schedule, state.model.LLM.lr_schedule)
    assert.equal(w.ctx.modelStep, 0)
    assert.equal(w.ctx.lastHash, w.worker.paramHash)
    assert.equal(w.ctx.snapshot?.step, 0)
    assert.equal(w.ctx.snapshot?.paramHash, w.worker.paramHash)
    const [loaded] = w.logged('model_loaded') as {source: string; param_hash: string}[]
    assert.equal(loaded.source, 'checkpoint')
    assert.ok(w.calls.flush >= 1, 'warmup_ready may be due now')
  })

  it("our peers' model at the epoch's step, with a fresh optimizer; another step or another hash is refused", async () => {
    const state = run({P2P: {repo_id: 'org/model'}})
    const me = generateIdentity()
    const peer = generateIdentity()
    const w = phaseWorld({identity: me, state, modelStep: null})
    const node = await w.peer(peer)
    let snapshot = await served(4)
    node.serveModel(async () => snapshot)
    const loading = new ModelLoading(w.ctx)
    assert.equal(await loading.load(4, [peer.id]), true)
    assert.equal(w.worker.paramHash, snapshot.paramHash, 'the peer’s parameters')
    assert.ok(w.worker.configured, 'the optimizer set up afresh')
    assert.equal(w.ctx.modelStep, 4)
    assert.deepEqual(w.ctx.snapshot, snapshot, 'served to joiners as fetched')
    assert.equal((w.logged('model_loaded')[0] as {source: string}).source, 'peers')

    w.ctx.modelStep = null
    snapshot = await served(3)
    assert.equal(await loading.load(4, [peer.id]), false)
    assert.match(String((w.logged('model_fetch_failed')[0] as {message: string}).message), /at step 3, the epoch starts after step 4/)
    snapshot = await served(4, {paramHash: 'ff'.repeat(32)})
    assert.equal(await loading.load(4, [peer.id]), false)
    assert.match(String((w.logged('model_fetch_failed')[1] as {message: string}).message), /the peer announced f{64}/)
    assert.equal(w.ctx.modelStep, null)
  })

  it('nobody serves the model and the P2P checkpoint names no Hub repository: not loaded, and said so', async () => {
    const w = phaseWorld({identity: generateIdentity(), state: run({P2P: {repo_id: ''}}), modelStep: null})
    assert.equal(await new ModelLoading(w.ctx).load(2, [generateIdentity().id]), false)
    assert.equal(w.logged('model_fetch_failed').length, 1)
    assert.equal(w.ctx.modelStep, null)
  })

  describe('a Hub checkpoint', () => {
    const tmp = tempDir('psyche-model-loading-')
    let hub: HubServer
    let revision = ''
    let hash = ''
    before(async () => {
      hub = await HubServer.start({root: join(tmp.path, 'hub')})
      const saved = new DeterministicWorker()
      await saved.initFromConfig({saved: true}, 1)
      await saved.save(join(tmp.path, 'model'))
      hash = saved.paramHash
      revision = (await uploadCheckpoint({repo: 'org/run', token: TOKEN, hubUrl: hub.url, dir: join(tmp.path, 'model')})).commit
    })
    after(async () => {
      await hub.close()
      tmp.cleanup()
    })

    const recorded = (paramHash: string) => ({checkpoint_hash: {repo: {repo_id: 'org/run', revision}, step: 9, param_hash: paramHash}})

    it('is loaded when its parameters hash to what the coordinator recorded with it', async () => {
      const w = phaseWorld({identity: generateIdentity(), state: run({Hub: {repo_id: 'org/run', revision}}, recorded(hash)), modelStep: null})
      w.ctx.opts.hub = {url: hub.url, cacheDir: join(tmp.path, 'cache-a')}
      assert.equal(await new ModelLoading(w.ctx).load(9, 'checkpoint'), true)
      assert.equal(w.worker.paramHash, hash)
      assert.equal(w.ctx.modelStep, 9)
      assert.equal(w.logged('checkpoint_downloaded').length, 1)
    })

    it('is refused when they do not: the repository’s owner cannot change the run’s model', async () => {
      const w = phaseWorld({identity: generateIdentity(), state: run({Hub: {repo_id: 'org/run', revision}}, recorded('ab'.repeat(32))), modelStep: null})
      w.ctx.opts.hub = {url: hub.url, cacheDir: join(tmp.path, 'cache-b')}
      assert.equal(await new ModelLoading(w.ctx).load(9, 'checkpoint'), false)
      const [rejected] = w.logged('checkpoint_rejected') as {expected: string; actual: string}[]
      assert.equal(rejected.expected, 'ab'.repeat(32))
      assert.equal(rejected.actual, hash)
      assert.equal(w.ctx.modelStep, null)
    })
  })
})
