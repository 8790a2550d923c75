import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import type {ResultProducer} from '../../src/core/client/runner.js'
import {Simulation, simRun, type SimClient} from './harness.js'

/**
 * Hostile clients among honest ones in the in-process simulation: the real client code (announcement intake,
 * equivocation proofs, replay checks, the coordinator's ejection rule) with a hostile result producer, as
 * test/adversarial/ runs them as separate processes (test:all). The attacks here are those the protocol catches
 * whatever the result's bytes mean; the ones that need real DisTrO results (garbage, scores, copies) stay there.
 */

/** Two different signed results for one step: the honest one, then one with a byte changed. */
const equivocator: ResultProducer = {
  async publish(ctx) {
    await ctx.publish(ctx.honest)
    const other = new Uint8Array(ctx.honest)
    other[0] ^= 0xff
    await ctx.publish(other)
    return ctx.honest
  },
}

/** Its first result again, in every later round. */
function replayer(): ResultProducer {
  let first: Uint8Array | undefined
  return {
    async publish(ctx) {
      first ??= ctx.honest
      await ctx.publish(first)
      return first
    },
  }
}

const rejections = (c: SimClient, attacker: SimClient, reason: RegExp) =>
  c.events.filter((e) => e.event === 'result_rejected' && e.client_id === attacker.identity.id && reason.test(e.reason))

describe('in-process simulation: hostile clients among honest ones', {timeout: 180_000}, () => {
  it('an equivocating client is proven and ejected, a replaying one is rejected; the honest replicas agree and keep training', async () => {
    const sim = new Simulation(simRun({total_steps: 6, init_min_clients: 5, min_clients: 2, epoch_time: 60}))
    const honest = [await sim.addClient('a'), await sim.addClient('b'), await sim.addClient('c')]
    const eq = await sim.addClient('equivocator', undefined, {producer: equivocator})
    const rp = await sim.addClient('replayer', undefined, {producer: replayer()})
    await sim.untilApplied(4, honest)

    for (const h of honest) {
      assert.ok(
        rejections(h, eq, /^equivocation: .* signed two different results for step \d+/).length > 0,
        `${h.name} rejected the equivocator's results: ${JSON.stringify(h.events.filter((e) => e.event === 'result_rejected'))}`,
      )
      assert.ok(
        rejections(h, rp, /^replay: the same result as its own for step \d+/).length > 0,
        `${h.name} rejected the replayed result: ${JSON.stringify(h.events.filter((e) => e.event === 'result_rejected'))}`,
      )
    }
    // The proof reached the coordinator, whose rule every replica applies: the equivocator is out of the run.
    const state = sim.coordinator.state
    const eqNow = [...state.epoch.clients, ...state.epoch.exited].find((x) => x.id === eq.identity.id)
    assert.equal(eqNow?.state, 'Ejected', `the equivocator's state: ${JSON.stringify(eqNow)}`)
    // The honest clients agree on every round and trained in it: work happened.
    const byStep = sim.hashesByStep(honest)
    for (const step of [2, 3, 4]) {
      const hashes = byStep.get(step)
      assert.ok(hashes && hashes.size === 3, `step ${step} applied by every honest client`)
      assert.equal(new Set(hashes.values()).size, 1, `step ${step}: honest replicas differ`)
    }
    const hashes = [1, 2, 3, 4].map((s) => [...(byStep.get(s)?.values() ?? [])][0])
    assert.equal(new Set(hashes).size, 4, 'the parameters changed every round')
    for (const h of honest)
      assert.ok(
        h.rounds.filter((r) => r.step <= 4).every((r) => r.loss !== null && r.peers_applied > 0),
        `${h.name} trained and applied peers' results`,
      )
    await sim.stop()
  })

  it('rewards: attacks earn nothing; honest clients earn per accepted batch, in proportion to their accepted rounds', async () => {
    const sim = new Simulation(simRun({total_steps: 5, init_min_clients: 5, min_clients: 2, epoch_time: 60, global_batch_size_start: 10, global_batch_size_end: 10}))
    const honest = [await sim.addClient('a'), await sim.addClient('b'), await sim.addClient('c')]
    const eq = await sim.addClient('equivocator', undefined, {producer: equivocator})
    const rp = await sim.addClient('replayer', undefined, {producer: replayer()})
    await sim.runUntil(() => sim.coordinator.state.run_state === 'Finished', {what: 'the run to finish'})
    const rows = new Map(sim.coordinator.rewardRows.map((r) => [r.client_id, r]))
    // The equivocator, proven in its first round, was ejected with no result accepted: it holds nothing.
    const equivocatorRow = rows.get(eq.identity.id)
    assert.equal(equivocatorRow?.earned ?? 0, 0, `the equivocator earned nothing: ${JSON.stringify(equivocatorRow)}`)
    assert.equal(equivocatorRow?.rounds ?? 0, 0)
    // The replayer's first round was honest work (there was nothing to replay yet); every replayed round earned nothing.
    const replayerRow = rows.get(rp.identity.id)!
    assert.equal(replayerRow.rounds, 1, `the replayer was paid for its one honest round only: ${JSON.stringify(replayerRow)}`)
    assert.equal(replayerRow.earned, replayerRow.batches * 1000)
    assert.ok(replayerRow.batches <= 5)
    const rounds = sim.coordinator.state.progress.step - 1
    for (const h of honest) {
      const r = rows.get(h.identity.id)!
      assert.equal(r.rounds, rounds, `${h.name} was accepted in every round`)
      assert.equal(r.slashed, 0)
      assert.equal(r.earned, r.batches * 1000, `${h.name}: no verifiers, so 1,000 points per accepted batch`)
      // The round's 10 batches split among at most 5 trainers: 2 to 5 each, so points track accepted rounds.
      assert.ok(r.batches >= 2 * rounds && r.batches <= 5 * rounds, `${h.name}: ${r.batches} batches in ${rounds} rounds`)
    }
    await sim.stop()
  })

  it('scoring is a bounded sample: each verifier scores at most verification_sample results a round, each trainer exactly K, and every report is taken', async () => {
    const sim = new Simulation(
      simRun({
        total_steps: 5,
        init_min_clients: 6,
        min_clients: 2,
        epoch_time: 60,
        global_batch_size_start: 12,
        global_batch_size_end: 12,
        verification_percent: 100,
        verification_sample: 2,
      }),
    )
    const clients: SimClient[] = []
    for (const name of ['a', 'b', 'c', 'd', 'e', 'f']) clients.push(await sim.addClient(name))
    await sim.runUntil(() => sim.coordinator.state.run_state === 'Finished', {what: 'the run to finish'})
    // By step: who scored whom (the client's `scored` events).
    const byStep = new Map<number, {from: string; of: string}[]>()
    for (const c of clients) {
      for (const e of c.events.filter((x) => x.event === 'scored')) {
        const list = byStep.get(e.step as number) ?? []
        list.push({from: c.identity.id, of: e.client_id as string})
        byStep.set(e.step as number, list)
      }
    }
    // Steps 1..4 are scored while the next round runs (step 5 is the last: no round after it).
    assert.deepEqual(
      [...byStep.keys()].sort((x, y) => x - y),
      [1, 2, 3, 4],
    )
    for (const [step, list] of byStep) {
      for (const c of clients) {
        const mine = list.filter((x) => x.from === c.identity.id)
        assert.equal(mine.length, 2, `step ${step}: ${c.name} scored ${mine.length} results, not K = 2`)
        assert.ok(!mine.some((x) => x.of === c.identity.id), `step ${step}: ${c.name} scored itself`)
      }
      // Every client verifies (100 %): each trainer is scored by exactly K of them.
      for (const c of clients) assert.equal(list.filter((x) => x.of === c.identity.id).length, 2, `step ${step}: ${c.name} scored by other than 2`)
    }
    // The ledger took every report (each names only assigned trainers), and scored every client.
    assert.deepEqual(
      sim.coordinator.refusals.filter((r) => r.type === 'scores'),
      [],
    )
    const rows = new Map(sim.coordinator.rewardRows.map((r) => [r.client_id, r]))
    for (const c of clients) assert.ok(Math.abs(rows.get(c.identity.id)!.score! - 1) < 1e-6, `${c.name}: scored as honest work: ${JSON.stringify(rows.get(c.identity.id))}`)
    // Scoring cost: 2 results per verifier and round, not 5.
    for (const c of clients) assert.equal(c.worker.scored, 8)
    await sim.stop()
  })
})
