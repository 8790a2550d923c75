import assert from 'node:assert/strict'
import {createServer, request, type Server} from 'node:http'
import {join} from 'node:path'
import {after, describe, it} from 'node:test'
import {HubServer} from '../../src/core/checkpoint/hub-server.js'
import {ensureDemoCorpus} from '../../src/core/corpus.js'
import {generateIdentity, saveIdentity} from '../../src/core/protocol/identity.js'
import {fieldOf, JsonProcess, startServer, writeE2eRun} from '../e2e/helpers.js'
import {runCli, tempDir} from '../helpers.js'

const TOKEN = 'hf_holders_vanish'

/** An HTTP proxy in front of the Hub that holds every request until released: an upload that takes as long as we like. */
async function heldProxy(target: string): Promise<{url: string; release: () => void; close: () => Promise<void>}> {
  let release!: () => void
  const open = new Promise<void>((resolve) => (release = resolve))
  const server: Server = createServer((req, res) => {
    void open.then(() => {
      const upstream = request(`${target}${req.url}`, {method: req.method, headers: req.headers}, (r) => {
        res.writeHead(r.statusCode ?? 502, r.headers)
        r.pipe(res)
      })
      upstream.on('error', () => res.destroy())
      req.pipe(upstream)
    })
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const {port} = server.address() as {port: number}
  return {url: `http://127.0.0.1:${port}`, release, close: () => new Promise((resolve) => server.close(() => resolve()))}
}

function client(name: string, port: number, state: string, extra: string[] = []): JsonProcess {
  return new JsonProcess(name, [
    'join',
    '--server-addr',
    `127.0.0.1:${port}`,
    '--run-id',
    'e2e',
    '--config',
    state,
    '--threads',
    '1',
    '--p2p-listen',
    '/ip4/127.0.0.1/tcp/0',
    '--json',
    ...extra,
  ])
}

describe('every model a client trains from is the run’s current model', {timeout: 400_000}, () => {
  const tmp = tempDir('psyche-holders-vanish-')
  const procs: JsonProcess[] = []
  let hub: HubServer | undefined
  let proxy: Awaited<ReturnType<typeof heldProxy>> | undefined
  after(async () => {
    proxy?.release()
    for (const p of procs) if (!p.exited) p.kill('SIGCONT')
    await Promise.all(procs.map((p) => p.stop()))
    await proxy?.close()
    await hub?.close()
    delete process.env.HF_HUB_CACHE
    tmp.cleanup()
  })

  it('all model holders vanish: the joiner waits ("no member holds step N", in status too), then resumes from a designated checkpointer’s upload of that step, never from step 0', async () => {
    await ensureDemoCorpus()
    process.env.HF_HUB_CACHE = join(tmp.path, 'hf-cache')
    hub = await HubServer.start({root: join(tmp.path, 'hub')})
    proxy = await heldProxy(hub.url)
    const identity = generateIdentity()
    const idPath = join(tmp.path, 'a.json')
    await saveIdentity(identity, idPath)
    // One holder, the run's designated checkpointer. Short Warmups; a longer wait for members, in which it comes back.
    const state = writeE2eRun(tmp.path, {
      roundsPerEpoch: 2,
      totalSteps: 8,
      initMinClients: 1,
      minClients: 1,
      warmupTime: 4,
      cooldownTime: 3,
      waitingExtraTime: 6,
      lr: 1e-2,
      checkpointers: [identity.id],
    })
    const {server, port} = await startServer(state)
    procs.push(server)
    const a = client('a', port, state, ['--identity', idPath, '--hub-repo', 'e2e/run', '--hub-url', proxy.url, '--hub-token', TOKEN, '--hub-revision', 'main'])
    procs.push(a)
    let c: JsonProcess | undefined
    const trace = () =>
      [a, c, server]
        .filter((x) => x)
        .map((x) => `${x!.name}: ${x!.events.map((e) => `${e.event}:${fieldOf(e, 'step')}:${fieldOf(e, 'to')}${fieldOf(e, 'reason')}`).join(' ')}`)
        .join('\n')
    const start = (await a.waitFor((e) => e.event === 'model_loaded', 'a to load the starting model', 120_000)).param_hash as string

    // Epoch 0 (steps 1-2) ends; its model's hash is attested in Cooldown, and the checkpointer's upload starts (held).
    const attested = await a.waitFor((e) => e.event === 'cooldown_witness' && e.step === 2, "a to attest step 2's parameters", 120_000)
    const hash = fieldOf(attested, 'param_hash') as string
    await a.waitFor((e) => e.event === 'checkpoint_upload_started', 'the upload to start', 60_000)
    assert.notEqual(hash, start, 'the model changed in epoch 0')
    // The only holder vanishes (its connection stays open: it is still a member, serving nothing), and a client joins.
    a.kill('SIGSTOP')
    c = client('c', port, state, ['--hub-url', hub.url])
    procs.push(c)

    // The joiner waits, saying why: no member holds step 2. It loads nothing, and the run trains nothing.
    const waiting = await c
      .waitFor((e) => e.event === 'waiting' && e.reason === 'model', 'c to wait for the model', 120_000)
      .catch((error: Error) => assert.fail(`${error.message}\n${trace()}`))
    assert.match(String(fieldOf(waiting, 'detail')), /^no member holds step 2 \(the run's model, parameter hash [0-9a-f]{12}…\)/)
    const status = await runCli(['status', '--server-addr', `127.0.0.1:${port}`, '--json'])
    assert.equal(status.exitCode, 0, status.stderr)
    const summary = JSON.parse(status.stdout) as {step: number; model_wanted: {step: number; param_hash: string; detail: string} | null}
    assert.equal(summary.model_wanted?.step, 2, status.stdout)
    assert.equal(summary.model_wanted?.param_hash, hash)
    assert.equal(summary.step, 3, 'the run is still at step 3: no round ran without the model')
    assert.ok(!c.events.some((e) => e.event === 'model_loaded'), `c loaded no model: ${trace()}`)

    // The checkpointer comes back in a wait for members; its upload goes through and it reports it (late: after its
    // Cooldown, but of the run's current model), then vanishes for good before the next epoch. (The joiner is held
    // meanwhile: its request to the stopped holder is still open, and the holder's return would answer it.)
    const waitingForMembers = server.events.length
    await server.waitFor((e) => server.events.indexOf(e) >= waitingForMembers && e.event === 'transition' && e.to === 'WaitingForMembers', 'a wait for members', 60_000)
    c.kill('SIGSTOP')
    proxy.release()
    a.kill('SIGCONT')
    const reported = await a
      .waitFor((e) => e.event === 'checkpoint' || e.event === 'checkpoint_late', 'the checkpoint report', 60_000)
      .catch((error: Error) => assert.fail(`${error.message}\n${trace()}`))
    a.kill('SIGKILL')
    await a.proc
    c.kill('SIGCONT')
    assert.equal(reported.event, 'checkpoint', JSON.stringify(reported))
    assert.equal(reported.param_hash, hash)
    assert.equal(fieldOf(reported, 'late'), true)

    // The joiner resumes from that upload: the model at step 2, checked against the run's recorded hash, and trains on.
    const loaded = await c.waitFor((e) => e.event === 'model_loaded', 'c to load the model', 120_000).catch((error: Error) => assert.fail(`${error.message}\n${trace()}`))
    // (the epoch's checkpoint, or the fallback to it when the request to the vanished holder fails)
    assert.ok(['checkpoint', 'hub_fallback'].includes(loaded.source as string), JSON.stringify(loaded))
    assert.equal(loaded.param_hash, hash, 'the model at step 2, not the starting one')
    assert.ok(!c.events.some((e) => e.event === 'model_loaded' && e.param_hash === start), 'never the step-0 model')
    const round = await c
      .waitFor((e) => e.event === 'round' && e.step === 4, 'c to train steps 3 and 4', 120_000)
      .catch((error: Error) => assert.fail(`${error.message}\n${trace()}`))
    assert.deepEqual(
      c.rounds().map((r) => r.step),
      [3, 4],
      'c trained on from step 3',
    )
    assert.ok(c.rounds().every((r) => r.loss !== null && r.applied === 1))
    assert.notEqual(fieldOf(round, 'param_hash'), hash, 'the model changed')
  })
})
