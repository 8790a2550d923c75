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
})
