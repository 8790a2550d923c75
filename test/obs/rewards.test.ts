import assert from 'node:assert/strict'
import {after, describe, it} from 'node:test'
import {CoordinatorConnection} from '../../src/core/backend/index.js'
import {assignBatches, buildWitnessProof, type CoordinatorState} from '../../src/core/coordinator/index.js'
import {generateIdentity} from '../../src/core/protocol/index.js'
import {nextState, RUN_ID, startTestServer, writeRunConfig, type TestServer} from '../backend/helpers.js'
import {runCli, tempDir} from '../helpers.js'

describe('psyche rewards', () => {
  const dir = tempDir('psyche-rewards-')
  let t: TestServer | undefined
  const conns: CoordinatorConnection[] = []
  after(async () => {
    for (const c of conns) await c.close()
    await t?.server.stop()
    dir.cleanup()
  })

  it("--json: each client's score, weight, accepted rounds and points, as the server's ledger holds them; text is a table", async () => {
    t = await startTestServer(writeRunConfig(dir.path, {init_min_clients: 2, min_clients: 2, epoch_time: 6, verification_percent: 100}))
    const ids = [generateIdentity(), generateIdentity()]
    for (const identity of ids) conns.push(await CoordinatorConnection.connect({addr: t.addr, runId: RUN_ID, identity, p2pAddrs: [], join: true}))
    const [a, b] = conns
    t.clock.advance(2)
    await nextState(a, (s) => s.run_state === 'Warmup')
    for (const c of conns) c.sendWarmupReady()
    const batches = new Map<string, number>()
    const witnessRound = (s: CoordinatorState) => {
      const seen = [...assignBatches(s)].map(([id, range]) => ({id, range, commitment: Buffer.alloc(32, 1)}))
      for (const {id, range} of seen) batches.set(id, (batches.get(id) ?? 0) + range.end - range.start)
      for (const c of conns) assert.ok(c.sendWitness(s.epoch.round!.step, buildWitnessProof(s.config, s.epoch.round!, seen)))
    }
    witnessRound(await nextState(a, (s) => s.run_state === 'RoundTrain'))
    const round2 = await nextState(a, (s) => s.run_state === 'RoundTrain' && s.progress.step === 2)
    // Both verify (verification_percent 100): each scores the other's result of step 1.
    assert.ok(a.sendScores(1, [{client_id: ids[1].id, score: 0.5}]))
    assert.ok(b.sendScores(1, [{client_id: ids[0].id, score: -0.3}]))
    await t.waitLog({event: 'scores', client: ids[1].id})
    t.clock.advance(7) // the epoch's time is up: round 2 ends it
    witnessRound(round2)
    await nextState(a, (s) => s.run_state === 'Cooldown')
    t.clock.advance(3)
    await nextState(a, (s) => s.progress.epoch === 1)

    const r = await runCli(['rewards', '--server-addr', t.addr, '--json'])
    assert.equal(r.exitCode, 0, r.stderr)
    const out = JSON.parse(r.stdout)
    assert.equal(out.run_id, RUN_ID)
    assert.equal(out.epoch, 1)
    const byId = new Map(out.clients.map((c: {client_id: string}) => [c.client_id, c]))
    assert.deepEqual(byId.get(ids[0].id), {
      client_id: ids[0].id,
      score: -0.3,
      weight: 0,
      rounds: 2,
      batches: batches.get(ids[0].id),
      pending: 0,
      earned: 0, // a harmful update (score ≤ 0) earns nothing, though its results were applied
      slashed: 0,
      claimed: null,
    })
    assert.deepEqual(byId.get(ids[1].id), {
      client_id: ids[1].id,
      score: 0.5,
      weight: 1,
      rounds: 2,
      batches: batches.get(ids[1].id),
      pending: 0,
      earned: batches.get(ids[1].id)! * 1000,
      slashed: 0,
      claimed: null,
    })

    const text = await runCli(['rewards', '--server-addr', t.addr])
    assert.equal(text.exitCode, 0, text.stderr)
    assert.match(text.stdout, /client\s+score\s+weight\s+rounds\s+batches\s+earned\s+pending\s+slashed/)
    assert.match(text.stdout, new RegExp(`${ids[1].id.slice(0, 16)}…\\s+0\\.500\\s+1\\.00\\s+2\\s+${batches.get(ids[1].id)}\\s+${batches.get(ids[1].id)! * 1000}\\s+0\\s+0`))
    // status shows the points too.
    const status = await runCli(['status', '--server-addr', t.addr, '--json'])
    assert.deepEqual(
      JSON.parse(status.stdout)
        .rewards.map((x: {earned: number}) => x.earned)
        .sort(),
      out.clients.map((x: {earned: number}) => x.earned).sort(),
    )
  })
})
