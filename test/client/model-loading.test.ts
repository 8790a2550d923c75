import assert from 'node:assert/strict'
import {mkdirSync, writeFileSync} from 'node:fs'
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
async function served(step: number, o: {paramHash?: string; init?: number} = {}): Promise<ModelSnapshot> {
  const other = new DeterministicWorker()
  await other.initFromConfig({other: true}, o.init ?? 3)
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
    // a failed attempt is not repeated at once (the state named no other source): the next waits 2 s
    assert.equal(await loading.load(4, [peer.id]), false)
    assert.equal(w.logged('model_fetch_failed').length, 1)
    w.clock.advance(2000)
    assert.equal(await loading.load(4, [peer.id]), false)
    assert.match(String((w.logged('model_fetch_failed')[1] as {message: string}).message), /the peer announced f{64}/)
    assert.equal(w.ctx.modelStep, null)
  })

  it("a peer serving another model than the run's current one (the coordinator's record) is refused, whatever step it claims", async () => {
    const me = generateIdentity()
    const [honest, other] = [generateIdentity(), generateIdentity()]
    const current = await served(4)
    const stale = await served(4, {init: 7})
    const state = {...run({P2P: {repo_id: ''}}), current_model: {step: 4, param_hash: current.paramHash}}
    const w = phaseWorld({identity: me, state, modelStep: null})
    ;(await w.peer(other)).serveModel(async () => stale)
    const loading = new ModelLoading(w.ctx)
    // a lone answering peer with another model: refused (it used to decide alone: a majority of those who answer)
    assert.equal(await loading.load(4, [other.id]), false)
    assert.match(String((w.logged('model_fetch_failed')[0] as {message: string}).message), /serves another model than the run's/)
    ;(await w.peer(honest)).serveModel(async () => current)
    w.clock.advance(2000)
    assert.equal(await loading.load(4, [other.id, honest.id]), true)
    assert.equal(w.ctx.lastHash, current.paramHash)
  })

  it("a config's Local checkpoint counts only at step 0, or when its psyche-checkpoint.json records the run's step and hash", async () => {
    const tmp = tempDir('psyche-local-checkpoint-')
    try {
      const dir = join(tmp.path, 'model')
      mkdirSync(dir)
      writeFileSync(join(dir, 'config.json'), '{}')
      const world = (current: {step: number; param_hash: string | null} | null) =>
        phaseWorld({
          identity: generateIdentity(),
          state: {...run({Local: {path: dir}} as never), current_model: current},
          modelStep: null,
          opts: {plan: {model: {kind: 'config', configPath: join(dir, 'config.json'), config: {test: true}}, seqLen: 16, microBatch: 1, optimizer: 'adamw'} as never},
        })
      // step 0: no epoch recorded a model, the starting checkpoint is the run's model
      const fresh = world(null)
      assert.equal(await new ModelLoading(fresh.ctx).load(0, 'checkpoint'), true)
      const start = fresh.ctx.lastHash!
      // the run trained to step 61: the starting model does not stand for it (the issue: loss back from 6.73 to 8.32)
      const trained = world({step: 61, param_hash: 'ab'.repeat(32)})
      assert.equal(await new ModelLoading(trained.ctx).load(61, 'checkpoint'), false)
      assert.match(String((trained.logged('checkpoint_rejected')[0] as {message: string}).message), /cannot stand for the run's model at step 61: it is the run's starting model/)
      assert.equal(trained.ctx.modelStep, null)
      assert.equal(trained.logged('model_loaded').length, 0)
      // a --checkpoint-dir save that records the run's step and these parameters' hash does
      writeFileSync(join(dir, 'psyche-checkpoint.json'), JSON.stringify({step: 61, param_hash: start}))
      const saved = world({step: 61, param_hash: start})
      assert.equal(await new ModelLoading(saved.ctx).load(61, 'checkpoint'), true)
      // one that records another step, while no quorum agreed on the run's hash, does not
      writeFileSync(join(dir, 'psyche-checkpoint.json'), JSON.stringify({step: 60, param_hash: start}))
      const older = world({step: 61, param_hash: null})
      assert.equal(await new ModelLoading(older.ctx).load(61, 'checkpoint'), false)
      assert.match(String((older.logged('checkpoint_rejected')[0] as {message: string}).message), /it is the model at step 60, the run's model is at step 61/)
    } finally {
      tmp.cleanup()
    }
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
