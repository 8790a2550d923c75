import assert from 'node:assert/strict'
import {after, before, describe, it} from 'node:test'
import {ensureDemoCorpus} from '../../src/core/corpus.js'
import {runCli, tempDir} from '../helpers.js'
import {hashesByStep, startClient, startServer, writeE2eRun, type JsonProcess} from './helpers.js'

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
    const state = writeE2eRun(dir.path, {roundsPerEpoch: 3, totalSteps: 6, lr: 1e-2})
    const {server, port} = await startServer(state)
    procs.push(server)
    const clients = ['a', 'b', 'c'].map((name) => startClient(name, port, state))
    procs.push(...clients)
    for (const c of clients) await c.waitFor((e) => e.event === 'finished', 'the run to finish', 180_000)

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
    assert.equal(new Set([...byStep.values()].map((h) => [...h.values()][0])).size, 6)
    const epochs = new Set(clients[0].rounds().map((r) => r.epoch))
    assert.deepEqual([...epochs].sort(), [0, 1])
    // every client trained in every round, and every round applied all three results
    for (const c of clients) {
      for (const r of c.rounds()) {
        assert.equal(typeof r.loss, 'number', `${c.name} step ${r.step}: trained`)
        assert.equal((r as unknown as {applied: number}).applied, 3, `${c.name} step ${r.step}: applied all results`)
      }
    }
    assert.ok(meanLoss(clients, 6) < meanLoss(clients, 1) - 0.05, `loss fell: ${meanLoss(clients, 1)} -> ${meanLoss(clients, 6)}`)
    // each client's result is a tiny fraction of its dense fp32 gradient
    const resultBytes = (clients[0].rounds()[0] as unknown as {result_bytes: number}).result_bytes
    assert.ok(resultBytes > 0 && resultBytes < 20_000, `result of ${resultBytes} bytes`)
  })

  it('psyche testnet --json: starts the processes itself and summarizes rounds, hashes and bytes', async () => {
    const run = tempDir('psyche-testnet-')
    try {
      writeE2eRun(run.path, {roundsPerEpoch: 2, totalSteps: 100})
      const r = await runCli(['testnet', '--clients', '3', '--config', run.path, '--rounds', '3', '--threads', '1', '--timeout', '150', '--json'], {timeoutMs: 180_000})
      assert.equal(r.exitCode, 0, r.stderr)
      const summary = JSON.parse(r.stdout)
      assert.equal(summary.ended, 'rounds')
      assert.deepEqual(summary.clients, ['client-0', 'client-1', 'client-2'])
      assert.deepEqual(
        summary.rounds.map((x: {step: number}) => x.step),
        [1, 2, 3],
      )
      for (const round of summary.rounds) {
        assert.equal(Object.keys(round.clients).length, 3)
        assert.equal(round.hashes_equal, true, JSON.stringify(round))
      }
      assert.deepEqual(summary.kills, [])
      for (const b of Object.values(summary.bytes) as {in: number; out: number}[]) assert.ok(b.in > 0 && b.out > 0)
      assert.ok(summary.result_bytes_per_round > 0)
    } finally {
      run.cleanup()
    }
  })

  it("psyche testnet --random-kill-num 1: killed clients are restarted, rejoin at an epoch boundary, and every round's hashes agree", async () => {
    const run = tempDir('psyche-testnet-kill-')
    try {
      writeE2eRun(run.path, {roundsPerEpoch: 4, totalSteps: 100, maxRoundTrainTime: 4, minClients: 2, initMinClients: 2, lr: 1e-2})
      const r = await runCli(
        [
          'testnet',
          '--clients',
          '3',
          '--config',
          run.path,
          '--rounds',
          '12',
          '--random-kill-num',
          '1',
          '--random-kill-interval',
          '12',
          '--threads',
          '1',
          '--timeout',
          '150',
          '--json',
        ],
        {timeoutMs: 180_000},
      )
      assert.equal(r.exitCode, 0, r.stderr)
      const summary = JSON.parse(r.stdout)
      assert.equal(summary.ended, 'rounds')
      assert.ok(summary.kills.length >= 1, JSON.stringify(summary.kills))
      const rejoined = summary.rejoins.filter((x: {first_step: number | null}) => x.first_step !== null)
      assert.ok(rejoined.length >= 1, JSON.stringify(summary.rejoins))
      for (const x of rejoined) {
        // a rejoiner's first round is the first of an epoch, and it agrees with everyone there
        const round = summary.rounds.find((y: {step: number}) => y.step === x.first_step)
        const before = summary.rounds.find((y: {step: number}) => y.step === x.first_step - 1)
        if (round && before) assert.equal(round.epoch, before.epoch + 1, JSON.stringify({x, round, before}))
        if (round) assert.equal(round.clients[x.client].param_hash, x.param_hash)
      }
      for (const round of summary.rounds) assert.equal(round.hashes_equal, true, JSON.stringify(round))
      assert.ok(summary.rounds.length >= 12)
    } finally {
      run.cleanup()
    }
  })
})
