import assert from 'node:assert/strict'
import {readFileSync} from 'node:fs'
import {join} from 'node:path'
import {SAVED_STATE_FILE} from '../../src/core/backend/centralized/server.js'
import {deserializeState} from '../../src/core/coordinator/index.js'
import {after, describe, it} from 'node:test'
import {HubServer} from '../../src/core/checkpoint/hub-server.js'
import {ensureDemoCorpus} from '../../src/core/corpus.js'
import {fieldOf, freePort, JsonProcess, startServer, writeE2eRun} from '../e2e/helpers.js'
import {tempDir} from '../helpers.js'

const TOKEN = 'hf_run_checkpoint'

function client(name: string, port: number, state: string, extra: string[] = []): JsonProcess {
  return new JsonProcess(name, ['join', '--server-addr', `127.0.0.1:${port}`, '--run-id', 'e2e', '--config', state, '--threads', '1', '--json', ...extra])
}

describe('Hub checkpoints in a run', {timeout: 600_000}, () => {
  const tmp = tempDir('psyche-run-ckpt-')
  const procs: JsonProcess[] = []
  let hub: HubServer | undefined
  after(async () => {
    await Promise.all(procs.map((p) => p.stop()))
    await hub?.close()
    delete process.env.HF_HUB_CACHE
    tmp.cleanup()
  })

  it('a checkpointer uploads after the epoch in the background and reports it; the whole run killed and restarted from its saved state loads that checkpoint (same parameter hash) and trains on from it', async () => {
    await ensureDemoCorpus()
    process.env.HF_HUB_CACHE = join(tmp.path, 'hf-cache') // the clients' Hub cache (inherited by the child processes)
    hub = await HubServer.start({root: join(tmp.path, 'hub')})
    const hubArgs = ['--hub-url', hub.url, '--hub-token', TOKEN, '--hub-revision', 'main']
    const state = writeE2eRun(tmp.path, {roundsPerEpoch: 2, totalSteps: 6, initMinClients: 2, cooldownTime: 30, warmupTime: 15, lr: 1e-2})
    const saveStateDir = join(tmp.path, 'saved')
    const port = await freePort()
    const first = await startServer(state, {port, saveStateDir})
    procs.push(first.server)
    const a = client('a', port, state, ['--hub-repo', 'e2e/run', ...hubArgs])
    const b = client('b', port, state, hubArgs)
    procs.push(a, b)

    // epoch 0 ends; the checkpointer uploads in the background and reports the commit (Cooldown ends early on it)
    const reported = await a.waitFor((e) => e.event === 'checkpoint', 'the checkpoint report', 240_000)
    const step = reported.step as number
    const commit = reported.revision as string
    assert.match(commit, /^[0-9a-f]{40}$/)
    const hashAt = (c: JsonProcess) => c.rounds().find((r) => r.step === step)?.param_hash
    assert.ok(hashAt(a) && hashAt(a) === hashAt(b), 'both clients hold the same model at the checkpoint step')
    const info = (await (await fetch(`${hub.url}/api/models/e2e/run`)).json()) as {sha: string; siblings: {rfilename: string}[]}
    assert.equal(info.sha, commit)
    assert.ok(['config.json', 'model.safetensors', 'tokenizer.json', 'README.md'].every((f) => info.siblings.some((s) => s.rfilename === f)))
    assert.ok(!b.events.some((e) => e.event === 'checkpoint_upload_started'), 'only the checkpointer uploads')

    // the next epoch's warmup (the coordinator ends Cooldown once it takes the checkpoint)
    const epoch = reported.epoch as number
    const trace = () =>
      a.events
        .filter((e) =>
          ['round', 'checkpoint', 'warmup_ready', 'model_loaded', 'checkpoint_uploaded', 'checkpoint_late', 'checkpoint_upload_started', 'rejected'].includes(e.event as string),
        )
        .map((e) => `${e.event}:${fieldOf(e, 'step')}:${fieldOf(e, 'epoch')}:${fieldOf(e, 'reason')}`)
        .join(' ')
    await a.waitFor((e) => e.event === 'warmup_ready' && e.epoch === epoch + 1, 'the next epoch', 150_000).catch((error: Error) => assert.fail(`${error.message}\n${trace()}`))
    assert.ok(!a.events.some((e) => e.event === 'rejected'), `the coordinator rejected nothing: ${trace()}`)
    const meta = (await (await fetch(`${hub.url}/e2e/run/resolve/${commit}/psyche-checkpoint.json`)).json()) as {step: number; param_hash: string}
    assert.equal(meta.step, step)
    assert.equal(meta.param_hash, hashAt(a), 'psyche-checkpoint.json records the parameter hash at the checkpoint step')
    // the report declared that hash, and the coordinator recorded it with the checkpoint: the hash the last round's
    // witnesses attested in Cooldown (the restarted clients below check what they load against it)
    assert.equal(reported.param_hash, hashAt(a))
    const saved = deserializeState((JSON.parse(readFileSync(join(saveStateDir, SAVED_STATE_FILE), 'utf8')) as {state: string}).state)
    assert.deepEqual(saved.checkpoint_hash, {repo: {repo_id: 'e2e/run', revision: commit}, step, param_hash: hashAt(a)})

    // the whole run is killed (coordinator and clients) before the next epoch trains, and restarted from the
    // coordinator's saved state with new clients: nobody holds the model but the Hub
    for (const p of [first.server, a, b]) p.kill('SIGKILL')
    await Promise.all([first.server, a, b].map((p) => p.proc))
    assert.ok(!a.rounds().some((r) => r.step > step), `no round after the checkpoint was applied before the kill: ${trace()}`)
    const second = await startServer(state, {port, saveStateDir})
    procs.push(second.server)
    const c = client('c', port, state, hubArgs)
    const d = client('d', port, state, hubArgs)
    procs.push(c, d)
    const traceOf = (x: JsonProcess) =>
      `${x.name}: ${x.events.map((e) => `${e.event}:${fieldOf(e, 'step')}${fieldOf(e, 'message') ? `(${String(fieldOf(e, 'message')).slice(0, 120)})` : ''}`).join(' ')}`
    let from = -1
    for (const x of [c, d]) {
      const loaded = await x
        .waitFor((e) => e.event === 'model_loaded', 'the model to load', 240_000)
        .catch((error: Error) => assert.fail(`${error.message}\n${traceOf(c)}\n${traceOf(d)}`))
      assert.equal(loaded.source, 'checkpoint', traceOf(x))
      assert.equal(loaded.param_hash, hashAt(a), `${x.name} loaded the Hub checkpoint's parameters`)
      assert.equal(x.events.find((e) => e.event === 'checkpoint_downloaded')?.revision, commit)
      // The restarted coordinator first closes the interrupted epoch (its clients are gone: a round nobody trains,
      // nothing applied), so its step may be past the checkpoint's; the client says so.
      const at = loaded.step as number
      assert.ok(at >= step, `${x.name} continues from step ${at} (checkpoint at ${step})`)
      if (at !== step) assert.equal(x.events.find((e) => e.event === 'checkpoint_step')?.checkpoint_step, step)
      assert.ok(from === -1 || from === at)
      from = at
    }
    // and trains on from there, the two replicas identical, each applying the other's results
    for (const x of [c, d])
      await x
        .waitFor((e) => e.event === 'round' && e.step === from + 2, `${x.name} to apply step ${from + 2}`, 240_000)
        .catch((error: Error) => assert.fail(`${error.message}\n${traceOf(c)}\n${traceOf(d)}`))
    for (const s of [from + 1, from + 2]) {
      const [rc, rd] = [c, d].map((x) => x.rounds().find((r) => r.step === s))
      assert.ok(rc && rd, `step ${s}: both applied it`)
      assert.equal(rc.param_hash, rd.param_hash, `step ${s}: c and d identical`)
      assert.ok(rc.peers_applied === 1 && rd.peers_applied === 1 && rc.loss !== null && rd.loss !== null, `step ${s}: both trained and applied the other's result`)
    }
    assert.notEqual(c.rounds().find((r) => r.step === from + 2)!.param_hash, hashAt(a), 'the model changed')
  })
})
