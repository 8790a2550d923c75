import assert from 'node:assert/strict'
import {after, before, describe, it} from 'node:test'
import {ensureDemoCorpus} from '../../src/core/corpus.js'
import {tempDir} from '../helpers.js'
import {hashesByStep, startClient, startServer, writeE2eRun, type JsonProcess} from './helpers.js'

// The multi-process smoke run of `npm test` (test/tiers.mjs): the real CLI as separate processes, a server and three
// clients, each client with its own PyTorch worker, over TCP and libp2p on loopback. The rest of the multi-process
// tests are in test:all.

const meanLoss = (c: JsonProcess[], step: number) => {
  const losses = c.flatMap((p) =>
    p
      .rounds()
      .filter((r) => r.step === step && r.loss !== null)
      .map((r) => r.loss!),
  )
  return losses.reduce((a, b) => a + b, 0) / losses.length
}

describe('end to end: a coordinator and three clients, each with its own worker', {timeout: 240_000}, () => {
  const dir = tempDir('psyche-e2e-')
  const procs: JsonProcess[] = []
  before(async () => {
    await ensureDemoCorpus()
  })
  after(async () => {
    await Promise.all(procs.map((p) => p.stop()))
    dir.cleanup()
  })

  it('trains 6 rounds over 2 epochs: the loss falls and every client holds the same parameters after every round', async () => {
    // Warmup ends as soon as all three have loaded the model (no time lost when the machine is idle); its timeout is
    // long, so that a client slow to start its worker on a loaded machine still trains from round 1 (with 10 s, two
    // clients once missed round 1 and the epoch ended after a round without exchange).
    const state = writeE2eRun(dir.path, {roundsPerEpoch: 3, totalSteps: 6, lr: 1e-2, warmupTime: 60})
    const {server, port} = await startServer(state)
    procs.push(server)
    const clients = ['a', 'b', 'c'].map((name) => startClient(name, port, state))
    procs.push(...clients)
    for (const c of clients) await c.waitFor((e) => e.event === 'finished', 'the run to finish', 180_000)

    // Before the first epoch the clients said what they waited for (init_min_clients = 3), also under --json.
    const waits = clients.flatMap((c) => c.events.filter((e) => e.event === 'waiting'))
    assert.ok(
      waits.some((e) => e.reason === 'members' && /clients have joined/.test(String(e.detail))),
      `a client waiting for members says so: ${JSON.stringify(waits)}`,
    )

    const byStep = hashesByStep(clients)
    assert.deepEqual(
      [...byStep.keys()].sort((x, y) => x - y),
      [1, 2, 3, 4, 5, 6],
    )
    for (const [step, hashes] of byStep) {
      assert.equal(hashes.size, 3, `step ${step}: every client applied it`)
      assert.equal(new Set(hashes.values()).size, 1, `step ${step}: parameter hashes differ: ${JSON.stringify([...hashes])}`)
    }
    // training changed the parameters every round
    const roundsSeen = () => JSON.stringify(clients.map((c) => c.rounds().map((r) => ({...r, event: undefined}))))
    assert.equal(new Set([...byStep.values()].map((h) => [...h.values()][0])).size, 6, `a round changed no parameter: ${roundsSeen()}`)
    const epochs = new Set(clients[0].rounds().map((r) => r.epoch))
    assert.deepEqual([...epochs].sort(), [0, 1])
    // every client trained in every round, and every round applied all three results
    for (const c of clients) {
      for (const r of c.rounds()) {
        assert.equal(typeof r.loss, 'number', `${c.name} step ${r.step}: trained`)
        assert.equal(r.applied, 3, `${c.name} step ${r.step}: applied all results`)
      }
    }
    assert.ok(meanLoss(clients, 6) < meanLoss(clients, 1) - 0.05, `loss fell: ${meanLoss(clients, 1)} -> ${meanLoss(clients, 6)}`)
    // each client's result is a tiny fraction of its dense fp32 gradient
    const resultBytes = clients[0].rounds()[0].result_bytes ?? 0
    assert.ok(resultBytes > 0 && resultBytes < 20_000, `result of ${resultBytes} bytes`)
  })
})
