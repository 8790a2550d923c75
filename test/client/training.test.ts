import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import {Checkpointing} from '../../src/core/client/checkpointing.js'
import {Evaluation} from '../../src/core/client/evaluation.js'
import {ExchangeHealth} from '../../src/core/client/exchange-health.js'
import {RoundResults} from '../../src/core/client/round-results.js'
import {Training} from '../../src/core/client/training.js'
import type {ClientId, Round} from '../../src/core/coordinator/index.js'
import type {RoundEvent} from '../../src/core/events.js'
import type {ResultAnnouncement} from '../../src/core/p2p/index.js'
import {WorkerRequestError} from '../../src/core/worker/client.js'
import {DeterministicWorker} from '../sim/harness.js'
import {commitmentsOf, firstRound, phaseWorld, rangeOf, settle, witnessAndAdvance} from './helpers.js'

/** The deterministic worker, counting forward/backward passes; `refuse`: finish_round refuses the result at that index once. */
class CountingWorker extends DeterministicWorker {
  begins = 0
  refuse: number | undefined
  async beginRound(tokens: Uint32Array, rows: number, step: number): Promise<{loss: number; grad_norm: number}> {
    this.begins++
    return super.beginRound(tokens, rows, step)
  }
  async finishRound(step: number, previous?: {applyStep: number; results: Uint8Array[]}) {
    if (previous && this.refuse !== undefined) {
      const index = this.refuse
      this.refuse = undefined
      await super.finishRound(step) // the forward/backward is consumed, as the real worker's is
      throw new WorkerRequestError('bad_result', 'worker: finish_round: rejected result: bad magic', 'finish_round', index)
    }
    return super.finishRound(step, previous)
  }
}

/**
 * Three clients train round 1 (we are the first, through Training; the two others publish results of their own);
 * `announced` of the others reach us. The witnesses attest all three; the run moves to round 2 (round 1 final).
 */
async function afterFirstRound(o: {announced?: number} = {}) {
  const run = firstRound(3)
  const [me, ...others] = run.identities
  const worker = new CountingWorker()
  const w = phaseWorld({identity: me, state: run.state, worker})
  const results = new RoundResults(w.ctx, new Evaluation(w.ctx), new ExchangeHealth(w.ctx), new Checkpointing(w.ctx))
  w.p2p.onAnnouncement((a) => results.onAnnouncement(a))
  const training = new Training(w.ctx, results)
  const gossip: ResultAnnouncement[] = []
  const bytes = new Map<ClientId, Uint8Array>()
  for (const [i, peer] of others.entries()) {
    const node = await w.peer(peer)
    node.onAnnouncement((a) => gossip.push(a))
    const blob = new Uint8Array([i + 10, 1, 2])
    bytes.set(peer.id, blob)
    if (i < (o.announced ?? others.length)) {
      const r = rangeOf(run.state, peer.id)
      await node.publishResult(1, r.start, r.end, blob)
    }
  }
  const round1 = run.state.epoch.round!
  assert.equal(await training.train(round1, rangeOf(run.state, me.id)), true)
  await settle()
  bytes.set(me.id, w.ctx.ledger.get(1)!.results.get(me.id)!.bytes!)
  const next = witnessAndAdvance(run.state, run.now, commitmentsOf(bytes))
  w.ctx.state = next.state
  const round2: Round = next.state.epoch.round!
  return {...run, me, w, worker, training, results, gossip, round1, round2, previous: next.previous, range2: rangeOf(next.state, me.id)}
}

describe('training', () => {
  it("a round without a previous one: our batches' forward/backward, our result published and kept as our own", async () => {
    const t = await afterFirstRound()
    assert.equal(t.worker.begins, 1)
    assert.deepEqual(t.worker.applies, [], 'nothing to apply in the first round of an epoch')
    const record = t.w.ctx.ledger.get(1)!
    assert.ok(record.own, 'our announcement is kept (re-announced to late peers)')
    assert.deepEqual(
      t.gossip.map((a) => a.client_id),
      [t.me.id, t.me.id],
      'both peers received our announcement',
    )
    assert.equal(record.results.get(t.me.id)!.commitment, record.own.commitment)
    assert.equal(t.w.ctx.trainedStep, 1)
    const [trained] = t.w.logged('trained') as {step: number; batches: number; loss: number; result_bytes: number}[]
    const range = rangeOf(t.state, t.me.id)
    assert.equal(trained.step, 1)
    assert.equal(trained.batches, range.end - range.start)
    assert.equal(typeof trained.loss, 'number')
    assert.equal(record.trained!.loss, trained.loss)
    assert.equal(t.w.logged('round').length, 0)
  })

  it("the previous round's results are applied by the training call itself; its round event comes once our result is out", async () => {
    const t = await afterFirstRound()
    assert.equal(await t.training.train(t.round2, t.range2, t.previous), true)
    assert.equal(t.worker.begins, 2)
    assert.deepEqual(t.worker.applies, [{step: 1, results: 3}], 'one call: apply round 1, produce round 2')
    assert.equal(t.w.ctx.modelStep, 1)
    assert.equal(t.w.ctx.trainedStep, 2)
    assert.ok(t.w.ctx.ledger.get(2)!.own)
    const kinds = t.w.events.filter((e) => e.event === 'round' || e.event === 'trained').map((e) => `${e.event} ${(e as {step: number}).step}`)
    assert.deepEqual(kinds, ['trained 1', 'round 1', 'trained 2'])
    const round = t.w.logged('round')[0] as RoundEvent
    assert.equal(round.loss, t.w.ctx.ledger.get(1)!.trained!.loss, 'the round event carries our loss of that round')
    assert.equal(round.peers_applied, 2)
    assert.equal(round.param_hash, t.worker.paramHash)
  })

  it("begun ahead (a verifier's score job begins it, overlapping the downloads), the round is not begun again", async () => {
    const t = await afterFirstRound()
    await t.training.begin(t.round2, t.range2)
    assert.equal(t.worker.begins, 2)
    assert.equal(await t.training.train(t.round2, t.range2, t.previous), true)
    assert.equal(t.worker.begins, 2)
    assert.deepEqual(t.worker.applies, [{step: 1, results: 3}])
  })

  it('while a result of the previous round is missing, the forward/backward runs once and the round is tried again later', async () => {
    const t = await afterFirstRound({announced: 1})
    t.w.ctx.opts.missingResultWaitMs = 60_000
    assert.equal(await t.training.train(t.round2, t.range2, t.previous), false)
    assert.equal(await t.training.train(t.round2, t.range2, t.previous), false)
    assert.equal(t.worker.begins, 2, 'round 2 begun once')
    assert.deepEqual(t.worker.applies, [])
    assert.equal(t.w.ctx.modelStep, 0)
    assert.equal(t.w.logged('trained').length, 1)
  })

  it('a result the worker refuses is dropped by its index; the retry begins the round again and applies the rest', async () => {
    const t = await afterFirstRound()
    const listed = (await t.results.collect(t.previous))!.results.map((r) => r.client_id)
    t.worker.refuse = 2
    assert.equal(await t.training.train(t.round2, t.range2, t.previous), false)
    assert.equal((t.w.logged('result_dropped')[0] as {client_id: string}).client_id, listed[2])
    assert.equal(await t.training.train(t.round2, t.range2, t.previous), true)
    assert.equal(t.worker.begins, 3, 'finish_round consumed the first forward/backward of round 2')
    assert.deepEqual(t.worker.applies, [{step: 1, results: 2}])
  })
})
