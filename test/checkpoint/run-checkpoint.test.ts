import assert from 'node:assert/strict'
import {join} from 'node:path'
import {after, describe, it} from 'node:test'
import {HubServer} from '../../src/core/checkpoint/hub-server.js'
import {ensureDemoCorpus} from '../../src/core/corpus.js'
import {freePort, JsonProcess, startServer, writeE2eRun} from '../e2e/helpers.js'
import {tempDir} from '../helpers.js'

const TOKEN = 'hf_run_checkpoint'

function client(name: string, port: number, state: string, extra: string[] = []): JsonProcess {
  return new JsonProcess(name, ['join', '--server-addr', `127.0.0.1:${port}`, '--run-id', 'e2e', '--config', state, '--threads', '1', '--json', ...extra])
}

describe('Hub checkpoints in a run', () => {
  const tmp = tempDir('psyche-run-ckpt-')
  const procs: JsonProcess[] = []
  let hub: HubServer | undefined
  after(async () => {
    await Promise.all(procs.map((p) => p.stop()))
    await hub?.close()
    delete process.env.HF_HUB_CACHE
    tmp.cleanup()
  })

  it('a checkpointer uploads after the epoch and reports it; the whole run killed and restarted loads that checkpoint and goes on from it', async () => {
    await ensureDemoCorpus()
    process.env.HF_HUB_CACHE = join(tmp.path, 'hf-cache') // the clients' Hub cache (inherited by the child processes)
    hub = await HubServer.start({root: join(tmp.path, 'hub')})
    const hubArgs = ['--hub-url', hub.url, '--hub-token', TOKEN, '--hub-revision', 'main']
    const state = writeE2eRun(tmp.path, {roundsPerEpoch: 2, totalSteps: 6, initMinClients: 2, cooldownTime: 60, warmupTime: 15, lr: 1e-2})
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
    const trace = () => a.events.filter((e) => ['round', 'checkpoint', 'warmup_ready', 'model_loaded', 'checkpoint_uploaded', 'checkpoint_not_reported', 'checkpoint_upload_started', 'rejected'].includes(e.event as string)).map((e) => `${e.event}:${e.step ?? ''}:${e.epoch ?? ''}:${e.reason ?? ''}`).join(' ')
    await a.waitFor((e) => e.event === 'warmup_ready' && (e.epoch as number) === epoch + 1, 'the next epoch', 150_000).catch((error: Error) => assert.fail(`${error.message}\n${trace()}`))
    // kill the whole run before the next epoch trains
    for (const p of [first.server, a, b]) p.kill('SIGKILL')
    await Promise.all([first.server, a, b].map((p) => p.proc))
    assert.ok(!a.rounds().some((r) => r.step > step), `no round after the checkpoint was applied before the kill: ${trace()}`)

    const second = await startServer(state, {port, saveStateDir})
    procs.push(second.server)
    const c = client('c', port, state, hubArgs)
    const d = client('d', port, state, hubArgs)
    procs.push(c, d)
    let from = -1
    for (const x of [c, d]) {
      const loaded = await x.waitFor((e) => e.event === 'model_loaded', 'the model to load', 240_000)
      assert.equal(loaded.source, 'checkpoint')
      assert.equal(loaded.param_hash, hashAt(a), `${x.name} loaded the Hub checkpoint's parameters`)
      // the coordinator's step goes on from where it was saved: the checkpoint's step, or one past it when the
      // restarted coordinator first closed the interrupted epoch with a round nobody trained (nothing applied)
      assert.ok((loaded.step as number) >= step && (loaded.step as number) <= step + 1, `${x.name} continues from step ${loaded.step} (checkpoint at ${step})`)
      assert.ok(from === -1 || from === loaded.step)
      from = loaded.step as number
    }
    // and trains on from there, the two replicas identical
    await c.waitFor((e) => e.event === 'round' && (e.step as number) === from + 1, `step ${from + 1}`, 240_000)
    await d.waitFor((e) => e.event === 'round' && (e.step as number) === from + 1, `step ${from + 1}`, 60_000)
    const next = (x: JsonProcess) => x.rounds().find((r) => r.step === from + 1)!
    assert.equal(next(c).param_hash, next(d).param_hash)
    assert.notEqual(next(c).param_hash, hashAt(a), 'the model changed')
  })
})
