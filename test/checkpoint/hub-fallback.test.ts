import assert from 'node:assert/strict'
import {mkdirSync, writeFileSync} from 'node:fs'
import {createServer, request as httpRequest} from 'node:http'
import type {AddressInfo} from 'node:net'
import {join} from 'node:path'
import {after, describe, it} from 'node:test'
import {CHECKPOINT_META_FILE, readCheckpointMeta} from '../../src/core/checkpoint/checkpointer.js'
import {uploadCheckpoint} from '../../src/core/checkpoint/hub.js'
import {HubServer} from '../../src/core/checkpoint/hub-server.js'
import {isCheckpointP2P} from '../../src/core/coordinator/index.js'
import {generateIdentity} from '../../src/core/protocol/identity.js'
import {tempDir} from '../helpers.js'
import {settle, simRun, Simulation, type SimClient} from '../sim/harness.js'

const TOKEN = 'hf_sim_fallback'

/**
 * Advances the virtual clock while real I/O (the Hub's HTTP) makes progress: a little virtual time per real
 * millisecond, so an upload or download takes a plausible share of a phase.
 */
async function paced(sim: Simulation, until: () => boolean, what: string, virtualPerStepMs = 20, maxSteps = 50_000): Promise<void> {
  for (let i = 0; !until(); i++) {
    if (i >= maxSteps) throw new Error(`not reached: ${what} (run state ${sim.coordinator.state.run_state}, step ${sim.coordinator.state.progress.step})`)
    await new Promise((resolve) => setTimeout(resolve, 1))
    sim.clock.advance(virtualPerStepMs)
    sim.coordinator.tick()
    await settle()
  }
}

/** Stops every client; a checkpointer finishes its upload first (real I/O), so time is paced meanwhile. */
async function stopPaced(sim: Simulation): Promise<void> {
  for (const c of sim.clients) c.client.stop()
  let all = false
  void Promise.all(sim.clients.map((c) => c.done)).then(() => (all = true))
  await paced(sim, () => all, 'every client to stop')
}

/**
 * A proxy in front of the Hub server that holds every commit request (POST .../commit/...) until release(): an
 * upload that finishes exactly when a test wants it to.
 */
async function commitGate(target: string): Promise<{url: string; held: () => number; release: () => void; close: () => Promise<void>}> {
  const upstream = new URL(target)
  let open = false
  let held = 0
  const waiting: (() => void)[] = []
  const server = createServer((req, res) => {
    const forward = () => {
      const out = httpRequest({host: upstream.hostname, port: upstream.port, path: req.url, method: req.method, headers: req.headers}, (up) => {
        res.writeHead(up.statusCode ?? 502, up.headers)
        up.pipe(res)
      })
      out.on('error', (error) => res.destroy(error))
      req.pipe(out)
    }
    if (!open && req.method === 'POST' && /\/commit\//.test(req.url ?? '')) {
      held++
      req.pause()
      waiting.push(forward)
    } else forward()
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const {port} = server.address() as AddressInfo
  return {
    url: `http://127.0.0.1:${port}`,
    held: () => held,
    release: () => {
      open = true
      for (const f of waiting.splice(0)) f()
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections()
        server.close(() => resolve())
      }),
  }
}

const hashAt = (c: SimClient, step: number) => c.rounds.find((r) => r.step === step)?.param_hash

describe('Hub checkpoints with the in-process simulation', () => {
  const tmp = tempDir('psyche-hub-fallback-')
  let hub: HubServer | undefined
  after(async () => {
    await hub?.close()
    tmp.cleanup()
  })

  it('a client that finds nobody to fetch from in a P2P epoch falls back to the last reported Hub checkpoint (the model at that step)', async () => {
    hub = await HubServer.start({root: join(tmp.path, 'hub')})
    const cacheDir = join(tmp.path, 'cache')
    const sim = new Simulation(simRun({total_steps: 40, epoch_time: 60, rounds_per_epoch: 3, cooldown_time: 60, witness_nodes: 0}))
    const checkpointer = {url: hub.url, token: TOKEN, repo: 'sim/run', cacheDir, stagingDir: join(tmp.path, 'staging')}
    const a = await sim.addClient('a', undefined, {hub: checkpointer})
    const b = await sim.addClient('b', undefined, {hub: {url: hub.url, cacheDir}})
    const c = await sim.addClient('c', undefined, {hub: {url: hub.url, cacheDir}})
    // epoch 0 starts from the plan's model (Dummy); the checkpoint a reports at the end of epoch 1 is the one a
    // P2P epoch names
    const reported = () => a.events.find((e) => e.event === 'checkpoint' && e.epoch >= 1)
    await paced(sim, () => reported() !== undefined, 'the checkpoint of epoch 1')
    const {step, revision} = reported() as {step: number; revision: string}
    assert.match(revision, /^[0-9a-f]{40}$/)

    // nobody serves the model any more (each peer's model server fails), and a new client arrives
    for (const x of [a, b, c]) x.p2p.serveModel(async () => Promise.reject(new Error('not serving (test)')))
    const d = await sim.addClient('d', undefined, {hub: {url: hub.url, cacheDir: join(tmp.path, 'cache-d')}})
    const loaded = () => d.events.find((e) => e.event === 'model_loaded')
    await paced(sim, () => loaded() !== undefined, 'd to load the model', 5).catch((error: Error) =>
      assert.fail(`${error.message}\n${d.events.map((e) => JSON.stringify(e)).join('\n')}`),
    )
    const checkpoint = sim.coordinator.state.model.LLM.checkpoint
    assert.ok(isCheckpointP2P(checkpoint) && checkpoint.P2P.revision === revision, `a P2P epoch naming the reported revision: ${JSON.stringify(checkpoint)}`)
    assert.ok(
      d.events.some((e) => e.event === 'model_fetch_failed'),
      'd tried its peers first',
    )
    const got = loaded()!
    assert.equal(got.source, 'hub_fallback', JSON.stringify(got))
    assert.equal(got.step, step)
    assert.equal(got.param_hash, hashAt(a, step), 'the Hub checkpoint is the peers’ model at that step')
    // the coordinator recorded it with the hash the epoch's witnesses agreed on, which is what d checked it against
    assert.deepEqual(sim.coordinator.state.checkpoint_hash, {repo: {repo_id: 'sim/run', revision}, step, param_hash: hashAt(a, step)})
    assert.equal((reported() as {param_hash?: string}).param_hash, hashAt(a, step), 'the report declares the uploaded parameters’ hash')
    assert.ok(
      [a, b, c].some((x) => x.events.some((e) => e.event === 'cooldown_witness' && e.step === step && e.param_hash === hashAt(a, step))),
      'the last round’s witnesses attested the parameters',
    )
    assert.equal(d.events.find((e) => e.event === 'checkpoint_downloaded')?.revision, revision)

    // and it trains with them, identical
    await paced(sim, () => d.rounds.some((r) => r.step >= step + 2), 'd to apply two rounds', 50)
    for (const s of [step + 1, step + 2]) {
      assert.equal(hashAt(d, s), hashAt(a, s), `step ${s}: d and a identical`)
      assert.equal(hashAt(d, s), hashAt(b, s), `step ${s}: d and b identical`)
    }
    assert.ok(
      d.rounds.some((r) => r.peers_applied > 0 && r.loss !== null),
      'd trained and applied its peers’ results',
    )
    await stopPaced(sim)
  })

  it('an upload that finishes after the Cooldown, once the run moved past its model, is reported (checkpoint_late, with its revision), and the commit is on the Hub', async () => {
    hub ??= await HubServer.start({root: join(tmp.path, 'hub')})
    // The upload's commit is held until the run recorded a later model: a late upload of the run's current model is
    // still taken (test/client/checkpointing.test.ts), so only one that the run moved past is late.
    const gate = await commitGate(hub.url)
    try {
      const sim = new Simulation(simRun({total_steps: 40, epoch_time: 60, rounds_per_epoch: 3, cooldown_time: 1}))
      const a = await sim.addClient('a', undefined, {hub: {url: gate.url, token: TOKEN, repo: 'sim/late', cacheDir: join(tmp.path, 'c2'), stagingDir: join(tmp.path, 's2')}})
      await sim.addClient('b')
      await sim.addClient('c')
      const started = () => a.events.find((e) => e.event === 'checkpoint_upload_started') as {step: number} | undefined
      await sim.runUntil(() => started() !== undefined, {what: 'the upload to start'})
      const step = started()!.step
      await paced(sim, () => gate.held() > 0, 'the commit to reach the Hub', 1)
      await sim.runUntil(() => (sim.coordinator.state.current_model?.step ?? 0) > step, {what: 'the run to record a later model'})
      assert.equal(a.events.filter((e) => e.event === 'checkpoint' || e.event === 'checkpoint_late').length, 0, 'nothing reported while the commit is held')
      gate.release()
      await paced(sim, () => a.events.some((e) => e.event === 'checkpoint_late'), 'the late upload', 20, 5000)
      const late = a.events.find((e) => e.event === 'checkpoint_late')!
      assert.equal(late.step, step)
      assert.match(String(late.revision), /^[0-9a-f]{40}$/)
      assert.equal(late.repo_id, 'sim/late')
      assert.match(String(late.reason), /after the Cooldown the coordinator takes checkpoints in, and it is not the run's current model/)
      assert.ok(!a.events.some((e) => e.event === 'checkpoint'), 'not sent to the coordinator')
      const info = (await (await fetch(`${hub.url}/api/models/sim/late`)).json()) as {sha: string; siblings: {rfilename: string}[]}
      assert.equal(info.sha, late.revision, 'the late commit is the branch head')
      assert.ok(info.siblings.some((s) => s.rfilename === CHECKPOINT_META_FILE))
      await stopPaced(sim)
    } finally {
      gate.release()
      await gate.close()
    }
  })

  it('the fallback refuses a Hub checkpoint that is not the model at the epoch’s step (it would fork from the peers)', async () => {
    hub ??= await HubServer.start({root: join(tmp.path, 'hub')})
    const sim = new Simulation(simRun({total_steps: 40, epoch_time: 60, rounds_per_epoch: 3, cooldown_time: 1, witness_nodes: 0}))
    const [a, b, c] = [await sim.addClient('a'), await sim.addClient('b'), await sim.addClient('c')]
    await sim.untilApplied(4) // into epoch 1: the checkpoint is P2P now
    // a Hub revision at another step, named by the P2P checkpoint, and nobody serving the model
    const dir = join(tmp.path, 'stale')
    mkdirSync(dir, {recursive: true})
    writeFileSync(join(dir, 'params.bin'), Buffer.alloc(32, 7))
    writeFileSync(join(dir, 'config.json'), '{"sim": true}')
    writeFileSync(join(dir, CHECKPOINT_META_FILE), JSON.stringify({step: 1, epoch: 0}))
    const {commit} = await uploadCheckpoint({dir, repo: 'sim/stale', hubUrl: hub.url, token: TOKEN})
    const llm = sim.coordinator.state.model.LLM
    assert.ok(isCheckpointP2P(llm.checkpoint))
    sim.coordinator.state = {...sim.coordinator.state, model: {LLM: {...llm, checkpoint: {P2P: {repo_id: 'sim/stale', revision: commit}}}}}
    for (const x of [a, b, c]) x.p2p.serveModel(async () => Promise.reject(new Error('not serving (test)')))
    const d = await sim.addClient('d', undefined, {hub: {url: hub.url, cacheDir: join(tmp.path, 'cache-stale')}})
    await paced(sim, () => d.events.some((e) => e.event === 'checkpoint_rejected'), 'd to refuse the stale checkpoint', 5)
    const rejected = d.events.find((e) => e.event === 'checkpoint_rejected')!
    // checked against the run's current model, as the coordinator recorded it at the last epoch's end (its hash)
    assert.match(
      String(rejected.message),
      /^sim\/stale@[0-9a-f]{40} is not the run's current model: its parameters hash to (07){32}, the run's model \(step \d+\) to [0-9a-f]{64}$/,
    )
    assert.ok(!d.events.some((e) => e.event === 'model_loaded'), 'd loaded nothing')
    await stopPaced(sim)
  })

  it('a designated checkpointer that uploads other weights than the epoch’s is caught by honest clients loading its checkpoint', async () => {
    hub ??= await HubServer.start({root: join(tmp.path, 'hub')})
    const hostile = generateIdentity()
    const sim = new Simulation(simRun({total_steps: 40, epoch_time: 60, rounds_per_epoch: 3, cooldown_time: 60, witness_nodes: 0, checkpointers: [hostile.id]}))
    const a = await sim.addClient('a', hostile, {hub: {url: hub.url, token: TOKEN, repo: 'sim/hostile', cacheDir: join(tmp.path, 'c3'), stagingDir: join(tmp.path, 's3')}})
    const b = await sim.addClient('b')
    const c = await sim.addClient('c')
    // a trains honestly (its replicas agree), but what it uploads is other weights
    const honestSave = a.worker.save.bind(a.worker)
    a.worker.save = async (dir, options) => {
      await honestSave(dir, options)
      writeFileSync(join(dir, 'params.bin'), Buffer.alloc(32, 0xee))
    }
    const reported = () => a.events.find((e) => e.event === 'checkpoint')
    await paced(sim, () => reported() !== undefined, 'the hostile checkpoint to be reported')
    const {step, revision} = reported() as {step: number; revision: string}
    // the coordinator took it (the declared hash is the agreed one: a lie about the upload), with the agreed hash
    assert.deepEqual(sim.coordinator.state.checkpoint_hash, {repo: {repo_id: 'sim/hostile', revision}, step, param_hash: hashAt(b, step)})

    for (const x of [a, b, c]) x.p2p.serveModel(async () => Promise.reject(new Error('not serving (test)')))
    const d = await sim.addClient('d', undefined, {hub: {url: hub.url, cacheDir: join(tmp.path, 'cache-hostile')}})
    await paced(sim, () => d.events.some((e) => e.event === 'checkpoint_rejected'), 'd to refuse the hostile checkpoint', 5)
    const refused = d.events.find((e) => e.event === 'checkpoint_rejected') as Record<string, unknown>
    assert.equal(refused.repo_id, 'sim/hostile')
    assert.equal(refused.revision, revision)
    assert.equal(refused.expected, hashAt(b, step))
    assert.equal(refused.actual, 'ee'.repeat(32))
    assert.match(String(refused.message), new RegExp(`sim/hostile@${revision}: its parameters hash to e{64}, but the coordinator recorded ${hashAt(b, step)}`))
    assert.ok(!d.events.some((e) => e.event === 'model_loaded'), 'd loaded nothing')
    await stopPaced(sim)
  })

  it('the recorded hash is checked even when the repository’s own psyche-checkpoint.json agrees with its weights', async () => {
    hub ??= await HubServer.start({root: join(tmp.path, 'hub')})
    const sim = new Simulation(simRun({total_steps: 40, epoch_time: 60, rounds_per_epoch: 3, cooldown_time: 1, witness_nodes: 0}))
    const [a, b, c] = [await sim.addClient('a'), await sim.addClient('b'), await sim.addClient('c')]
    await sim.untilApplied(4) // into epoch 1: the checkpoint is P2P now
    // the epoch's Cooldown, once a has applied its last round: a client joining now loads the model at that step
    const last = () => sim.coordinator.state.epoch.round!.step
    await sim.runUntil(() => sim.coordinator.state.run_state === 'Cooldown' && hashAt(a, last()) !== undefined, {what: 'the Cooldown of epoch 1', stepMs: 20})
    const step = last()
    const agreed = hashAt(a, step)!
    // the repository a hostile checkpointer controls: other weights, and a psyche-checkpoint.json that matches them
    const dir = join(tmp.path, 'consistent')
    mkdirSync(dir, {recursive: true})
    writeFileSync(join(dir, 'params.bin'), Buffer.alloc(32, 0xee))
    writeFileSync(join(dir, 'config.json'), '{"sim": true}')
    writeFileSync(join(dir, CHECKPOINT_META_FILE), JSON.stringify({step, epoch: 0, param_hash: 'ee'.repeat(32)}))
    const {commit} = await uploadCheckpoint({dir, repo: 'sim/consistent', hubUrl: hub.url, token: TOKEN})
    // what the coordinator holds after that checkpointer reported the repository with the hash the witnesses agreed on
    const repo = {repo_id: 'sim/consistent', revision: commit}
    const llm = sim.coordinator.state.model.LLM
    sim.coordinator.state = {...sim.coordinator.state, model: {LLM: {...llm, checkpoint: {P2P: repo}}}, checkpoint_hash: {repo, step, param_hash: agreed}}
    for (const x of [a, b, c]) x.p2p.serveModel(async () => Promise.reject(new Error('not serving (test)')))
    const d = await sim.addClient('d', undefined, {hub: {url: hub.url, cacheDir: join(tmp.path, 'cache-consistent')}})
    await paced(sim, () => d.events.some((e) => e.event === 'checkpoint_rejected'), 'd to refuse the checkpoint', 5)
    const refused = d.events.find((e) => e.event === 'checkpoint_rejected') as Record<string, unknown>
    assert.deepEqual([refused.expected, refused.actual], [agreed, 'ee'.repeat(32)], String(refused.message))
    assert.ok(!d.events.some((e) => e.event === 'model_loaded'), 'd loaded nothing')
    await stopPaced(sim)
  })

  it('psyche-checkpoint.json from the Hub is checked', async () => {
    const dir = join(tmp.path, 'meta')
    mkdirSync(dir, {recursive: true})
    assert.equal(await readCheckpointMeta(dir), undefined)
    const write = (v: unknown) => writeFileSync(join(dir, CHECKPOINT_META_FILE), typeof v === 'string' ? v : JSON.stringify(v))
    write({step: 4, epoch: 1, param_hash: 'ab', run_id: 'r'})
    assert.deepEqual(await readCheckpointMeta(dir), {step: 4, epoch: 1, param_hash: 'ab', run_id: 'r'})
    for (const [bad, reason] of [
      ['{', /not JSON/],
      ['[1]', /not a JSON object/],
      [{step: -1}, /step is not a non-negative integer/],
      [{step: 1, param_hash: 5}, /param_hash/],
      [{step: 1, epoch: 'x'}, /epoch/],
    ] as const) {
      write(bad)
      await assert.rejects(readCheckpointMeta(dir), reason)
    }
  })
})
