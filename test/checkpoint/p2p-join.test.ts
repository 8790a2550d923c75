import assert from 'node:assert/strict'
import {after, describe, it} from 'node:test'
import {ensureDemoCorpus} from '../../src/core/corpus.js'
import {fieldOf, startClient, startServer, writeE2eRun, type JsonProcess} from '../e2e/helpers.js'
import {tempDir} from '../helpers.js'

describe('a client joining a run takes the model from its peers', {timeout: 400_000}, () => {
  const tmp = tempDir('psyche-p2p-join-')
  const procs: JsonProcess[] = []
  after(async () => {
    await Promise.all(procs.map((p) => p.stop()))
    tmp.cleanup()
  })

  it('after two epochs a new client loads a model bit-identical to the others (attested by both), then trains and applies their results', async () => {
    await ensureDemoCorpus()
    const state = writeE2eRun(tmp.path, {roundsPerEpoch: 2, totalSteps: 8, initMinClients: 2, minClients: 2, warmupTime: 20, cooldownTime: 2, lr: 1e-2})
    const {server, port} = await startServer(state)
    procs.push(server)
    const a = startClient('a', port, state)
    const b = startClient('b', port, state)
    procs.push(a, b)
    const trace = () =>
      [a, b, c]
        .filter((x) => x)
        .map((x) => `${x!.name}: ${x!.events.map((e) => `${e.event}:${fieldOf(e, 'step')}`).join(' ')}`)
        .join('\n')
    let c: JsonProcess | undefined
    // epoch 0 is steps 1-2, epoch 1 steps 3-4: the new client comes during epoch 1 and enters at the next one
    await a.waitFor((e) => e.event === 'round' && e.step >= 3, 'a to apply step 3', 180_000)
    c = startClient('c', port, state)
    procs.push(c)
    const loaded = await c.waitFor((e) => e.event === 'model_loaded', 'c to load the model', 180_000).catch((error: Error) => assert.fail(`${error.message}\n${trace()}`))
    const at = loaded.step as number
    assert.equal(loaded.source, 'peers', JSON.stringify(loaded))
    assert.ok(at >= 4, `c loads the model after two epochs (at step ${at})`)
    const fetched = c.events.find((e) => e.event === 'model_fetched')!
    assert.equal(fetched.step, at)
    assert.equal(fetched.attesters, 2, 'both peers signed the manifest c loaded')
    assert.ok((fetched.bytes as number) > 0)
    // bit-identical before it trains: its hash is the others' hash at that step
    const hashAt = (x: JsonProcess, step: number) => x.rounds().find((r) => r.step === step)?.param_hash
    assert.ok(hashAt(a, at), `a applied step ${at}`)
    assert.equal(loaded.param_hash, hashAt(a, at))
    assert.equal(loaded.param_hash, hashAt(b, at))
    assert.ok(!c.rounds().some((r) => r.step <= at), 'c applied no round before it loaded')

    // then it trains with them: every following round, all three identical and each applied both peers' results
    const last = at + 2
    for (const x of [a, b, c])
      await x
        .waitFor((e) => e.event === 'round' && e.step === last, `${x.name} to apply step ${last}`, 180_000)
        .catch((error: Error) => assert.fail(`${error.message}\n${trace()}`))
    for (let step = at + 1; step <= last; step++) {
      assert.equal(hashAt(c, step), hashAt(a, step), `step ${step}: c and a identical`)
      assert.equal(hashAt(c, step), hashAt(b, step), `step ${step}: c and b identical`)
      for (const x of [a, b, c]) {
        const r = x.rounds().find((q) => q.step === step)
        assert.ok(r, `step ${step}: ${x.name} applied it`)
        assert.equal(r.peers_applied, 2, `step ${step}: ${x.name} applied both peers' results`)
        assert.ok(r.loss !== null, `step ${step}: ${x.name} trained`)
      }
    }
    assert.notEqual(hashAt(c, last), loaded.param_hash, 'the model changed')
  })
})
