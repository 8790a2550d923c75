import assert from 'node:assert/strict'
import {existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync} from 'node:fs'
import {join} from 'node:path'
import {after, before, describe, it} from 'node:test'
import {CHECKPOINT_META_FILE} from '../../src/core/checkpoint/checkpointer.js'
import {HubServer} from '../../src/core/checkpoint/hub-server.js'
import {DEFAULT_KEEP_CHECKPOINTS, pruneCheckpoints} from '../../src/core/checkpoint/retention.js'
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
    assert.deepEqual(readFileSync(join(dir, 'step-1', 'params.bin')), w.worker.params)
    const meta = JSON.parse(readFileSync(join(dir, 'step-1', CHECKPOINT_META_FILE), 'utf8'))
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
    assert.ok(failed.message.startsWith(join(dir, 'step-1')), 'names the directory')
  })

  /** A saved checkpoint of `runId` at `step` in `dir`/step-S, as --checkpoint-dir writes it. */
  function fakeSave(dir: string, runId: string, step: number): void {
    mkdirSync(join(dir, `step-${step}`), {recursive: true})
    writeFileSync(join(dir, `step-${step}`, 'params.bin'), 'x')
    writeFileSync(join(dir, `step-${step}`, CHECKPOINT_META_FILE), JSON.stringify({run_id: runId, step, epoch: 0}))
  }

  it("--keep-checkpoints: after a save the run's older saves beyond the last N go; another run's, other files and the run's current model stay", async () => {
    const cool = cooldown()
    const dir = join(tmp.path, 'keep')
    fakeSave(dir, cool.state.run_id, 0)
    fakeSave(dir, 'another-run', 5)
    mkdirSync(join(dir, 'notes'))
    const w = phaseWorld({identity: generateIdentity(), state: cool.state, opts: {checkpointDir: dir, keepCheckpoints: 1}})
    await applied(w)
    const checkpointing = new Checkpointing(w.ctx)
    await checkpointing.afterApply(cool.state.epoch.round!)
    await checkpointing.idle()
    assert.deepEqual(readdirSync(dir).sort(), ['notes', 'step-1', 'step-5'])
    assert.deepEqual(
      w.logged('checkpoint_pruned').map((e) => (e as {step: number}).step),
      [0],
    )

    // The run's current model (recorded at the last epoch's end) is never removed, whatever N.
    const kept = join(tmp.path, 'keep-current')
    fakeSave(kept, cool.state.run_id, 0)
    const c = phaseWorld({identity: generateIdentity(), state: {...cool.state, current_model: {step: 0, param_hash: 'h'}}, opts: {checkpointDir: kept, keepCheckpoints: 1}})
    await applied(c)
    const kept1 = new Checkpointing(c.ctx)
    await kept1.afterApply(cool.state.epoch.round!)
    await kept1.idle()
    assert.deepEqual(readdirSync(kept).sort(), ['step-0', 'step-1'])
    assert.equal(c.logged('checkpoint_pruned').length, 0)

    // Without --keep-checkpoints: the last 3.
    const three = join(tmp.path, 'keep-default')
    for (const step of [0]) fakeSave(three, cool.state.run_id, step)
    const d = phaseWorld({identity: generateIdentity(), state: cool.state, opts: {checkpointDir: three}})
    await applied(d)
    const kept3 = new Checkpointing(d.ctx)
    await kept3.afterApply(cool.state.epoch.round!)
    await kept3.idle()
    assert.deepEqual(readdirSync(three).sort(), ['step-0', 'step-1'], `${DEFAULT_KEEP_CHECKPOINTS} kept: nothing to remove yet`)
  })

  it('pruning keeps the save just made and the newest N-1 by step, never a protected step or directory, and reads only step-S directories of the run', async () => {
    const dir = join(tmp.path, 'prune')
    for (const step of [10, 20, 30, 40, 50, 60]) fakeSave(dir, 'run', step)
    mkdirSync(join(dir, 'step-7')) // no psyche-checkpoint.json: not known to be ours
    fakeSave(dir, 'run', 3)
    writeFileSync(join(dir, 'step-3', CHECKPOINT_META_FILE), JSON.stringify({run_id: 'run', step: 4})) // its name and its record disagree
    const events: {event: string}[] = []
    const removed = await pruneCheckpoints({
      checkpointDir: dir,
      runId: 'run',
      keep: 2,
      saved: 50, // a restart from an older state: step 60 is from before it
      protect: [20],
      protectDirs: [join(dir, 'step-10')],
      log: (e) => events.push(e),
    })
    assert.deepEqual(
      removed.sort((a, b) => a - b),
      [30, 40],
    )
    assert.deepEqual(readdirSync(dir).sort(), ['step-10', 'step-20', 'step-3', 'step-50', 'step-60', 'step-7'])
    assert.deepEqual(
      events.map((e) => e.event),
      ['checkpoint_pruned', 'checkpoint_pruned'],
    )
    const missing: {event: string}[] = []
    assert.deepEqual(await pruneCheckpoints({checkpointDir: join(tmp.path, 'none'), runId: 'run', keep: 1, saved: 1, protect: [], log: (e) => missing.push(e)}), [])
    assert.equal(missing[0].event, 'checkpoint_prune_failed')
  })

  it('--checkpoint-dir with --hub-repo: the save is uploaded from its step directory, which stays after the upload (no second copy)', async () => {
    const cool = cooldown()
    const dir = join(tmp.path, 'saved-and-uploaded')
    const staging = join(tmp.path, 'staging-unused')
    const w = phaseWorld({identity: generateIdentity(), state: cool.state, opts: {checkpointDir: dir, hub: {url: hub.url, token: TOKEN, repo: 'org/saved', stagingDir: staging}}})
    await applied(w)
    const c = new Checkpointing(w.ctx)
    await c.afterApply(cool.state.epoch.round!)
    await c.idle()
    assert.equal(w.logged('checkpoint_uploaded').length, 1, JSON.stringify(w.logged('checkpoint_upload_failed')))
    assert.deepEqual(readFileSync(join(dir, 'step-1', 'params.bin')), w.worker.params, 'the save stays after its upload')
    assert.equal(existsSync(staging), false, 'no staging copy')
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
