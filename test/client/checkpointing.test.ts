import assert from 'node:assert/strict'
import {existsSync, readFileSync} from 'node:fs'
import {join} from 'node:path'
import {after, before, describe, it} from 'node:test'
import {CHECKPOINT_META_FILE} from '../../src/core/checkpoint/checkpointer.js'
import {HubServer} from '../../src/core/checkpoint/hub-server.js'
import {Checkpointing} from '../../src/core/client/checkpointing.js'
import {applyEvent, type CoordinatorState} from '../../src/core/coordinator/index.js'
import {generateIdentity} from '../../src/core/protocol/identity.js'
import {attestParams, witnessAll} from '../coordinator/helpers.js'
import {tempDir} from '../helpers.js'
import {DeterministicWorker} from '../sim/harness.js'
import {firstRound, phaseWorld, type PhaseWorld} from './helpers.js'

const TOKEN = 'hf_checkpointing'

/** A one-round epoch run to its Cooldown (its last round applied, step 1): where checkpoints are taken. */
function cooldown(): {state: CoordinatorState; now: number} {
  const run = firstRound(3, {rounds_per_epoch: 1})
  let {state, now} = run
  const round = state.epoch.round!
  state = witnessAll(state, now)
  for (let i = 0; i < 100 && state.run_state !== 'Cooldown'; i++) state = applyEvent(state, {type: 'tick'}, (now += 1000)).state
  assert.equal(state.run_state, 'Cooldown')
  assert.equal(state.epoch.round!.step, round.step)
  return {state, now}
}

/** Our model after applying the epoch's last round: at its step, with the worker's hash. */
async function applied(w: PhaseWorld): Promise<void> {
  await w.worker.initFromConfig({trained: true}, 1)
  w.ctx.modelStep = 1
  w.ctx.lastHash = w.worker.paramHash
}

describe('checkpointing', () => {
  const tmp = tempDir('psyche-checkpointing-')
  let hub: HubServer
  before(async () => {
    hub = await HubServer.start({root: join(tmp.path, 'hub')})
  })
  after(async () => {
    await hub.close()
    tmp.cleanup()
  })

  it("--checkpoint-dir: in the epoch's Cooldown the model is saved once, with its step, epoch and parameter hash", async () => {
    const {state} = cooldown()
    const dir = join(tmp.path, 'saved')
    const w = phaseWorld({identity: generateIdentity(), state, opts: {checkpointDir: dir}})
    await applied(w)
    const c = new Checkpointing(w.ctx)
    await c.afterApply(state.epoch.round!)
    await c.afterApply(state.epoch.round!)
    assert.equal(w.logged('checkpoint_saved').length, 1, 'once per epoch')
    assert.deepEqual(readFileSync(join(dir, 'params.bin')), w.worker.params)
    const meta = JSON.parse(readFileSync(join(dir, CHECKPOINT_META_FILE), 'utf8'))
    assert.deepEqual(meta, {run_id: state.run_id, step: 1, epoch: state.progress.epoch, param_hash: w.worker.paramHash})
  })

  it('saves nothing outside the Cooldown, and a failed save is loud', async () => {
    const {state} = firstRound(3)
    const dir = join(tmp.path, 'never')
    const w = phaseWorld({identity: generateIdentity(), state, opts: {checkpointDir: dir}})
    await new Checkpointing(w.ctx).afterApply(state.epoch.round!)
    assert.equal(existsSync(dir), false)

    class Full extends DeterministicWorker {
      async save(): Promise<void> {
        throw new Error('no space left on device')
      }
    }
    const cool = cooldown()
    const f = phaseWorld({identity: generateIdentity(), state: cool.state, worker: new Full(), opts: {checkpointDir: dir}})
    await new Checkpointing(f.ctx).afterApply(cool.state.epoch.round!)
    const [failed] = f.logged('checkpoint_save_failed') as {message: string}[]
    assert.match(failed.message, /no space left on device/)
    assert.ok(failed.message.startsWith(dir), 'names the directory')
  })

  it('a checkpointer without a Hub token, or with a worker that cannot save, is refused at once', () => {
    const {state} = firstRound(3)
    const noToken = phaseWorld({identity: generateIdentity(), state, opts: {hub: {repo: 'org/run'}}})
    assert.throws(() => new Checkpointing(noToken.ctx), /needs a Hub token/)
    const worker = new DeterministicWorker() as DeterministicWorker & {save?: unknown}
    Object.defineProperty(worker, 'save', {value: undefined})
    const cannot = phaseWorld({identity: generateIdentity(), state, worker, opts: {checkpointDir: tmp.path}})
    assert.throws(() => new Checkpointing(cannot.ctx), /cannot save models \(--checkpoint-dir\)/)
  })

  it("a checkpointer uploads to the Hub, and reports the checkpoint with the hash the last round's witnesses agreed on, once they have", async () => {
    const cool = cooldown()
    const w = phaseWorld({
      identity: generateIdentity(),
      state: cool.state,
      opts: {hub: {url: hub.url, token: TOKEN, repo: 'org/run', stagingDir: join(tmp.path, 'staging')}},
    })
    await applied(w)
    const c = new Checkpointing(w.ctx)
    await c.afterApply(cool.state.epoch.round!)
    await c.idle()
    assert.deepEqual(w.conn.of('checkpoint'), [], 'no quorum of witnesses attested a parameter hash yet')
    w.ctx.state = attestParams(cool.state, cool.now, w.ctx.lastHash!)
    c.onState()
    const [[repo, paramHash]] = w.conn.of('checkpoint') as [{repo_id: string; revision: string}, string][]
    assert.equal(repo.repo_id, 'org/run')
    assert.match(repo.revision, /^[0-9a-f]{40}$/)
    assert.equal(paramHash, w.worker.paramHash)
    assert.equal(w.logged('checkpoint').length, 1)
  })

  it("an upload that finishes after the Cooldown is reported if it is the run's current model (a waiting run resumes from it)", async () => {
    const cool = cooldown()
    const w = phaseWorld({
      identity: generateIdentity(),
      state: cool.state,
      opts: {hub: {url: hub.url, token: TOKEN, repo: 'org/late-current', stagingDir: join(tmp.path, 'staging-late-current')}},
    })
    await applied(w)
    const c = new Checkpointing(w.ctx)
    await c.afterApply(cool.state.epoch.round!)
    // the Cooldown ended before the upload did; the coordinator recorded these parameters as the run's model
    w.ctx.state = {...cool.state, run_state: 'WaitingForMembers', current_model: {step: 1, param_hash: w.ctx.lastHash!}}
    await c.idle()
    const [[repo, paramHash]] = w.conn.of('checkpoint') as [{repo_id: string; revision: string}, string][]
    assert.equal(repo.repo_id, 'org/late-current')
    assert.equal(paramHash, w.worker.paramHash)
    assert.equal((w.logged('checkpoint')[0] as {late?: boolean}).late, true)
    assert.deepEqual(w.logged('checkpoint_late'), [])
  })

  it('an upload that finishes after the Cooldown is not reported: it is late, and said so', async () => {
    const cool = cooldown()
    const w = phaseWorld({
      identity: generateIdentity(),
      state: cool.state,
      opts: {hub: {url: hub.url, token: TOKEN, repo: 'org/late', stagingDir: join(tmp.path, 'staging-late')}},
    })
    await applied(w)
    const c = new Checkpointing(w.ctx)
    await c.afterApply(cool.state.epoch.round!)
    w.ctx.state = {...cool.state, run_state: 'WaitingForMembers'}
    await c.idle()
    assert.deepEqual(w.conn.of('checkpoint'), [])
    assert.match(String((w.logged('checkpoint_late')[0] as {reason: string}).reason), /after the Cooldown .* not the run's current model/)
  })
})
