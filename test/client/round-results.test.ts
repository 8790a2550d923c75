import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import {Checkpointing} from '../../src/core/client/checkpointing.js'
import {FORMAT_INVALID, trainersWithBatches} from '../../src/core/client/decide.js'
import {Evaluation} from '../../src/core/client/evaluation.js'
import {ExchangeHealth} from '../../src/core/client/exchange-health.js'
import {RoundResults} from '../../src/core/client/round-results.js'
import type {ClientId} from '../../src/core/coordinator/index.js'
import type {RoundEvent} from '../../src/core/events.js'
import {signAnnouncement} from '../../src/core/primitives/announcement.js'
import {resultCommitment} from '../../src/core/primitives/pieces.js'
import {LoadTestWorker, loadTestResultFormat} from '../../src/core/worker/load-test-worker.js'
import {WorkerRequestError} from '../../src/core/worker/client.js'
import {DeterministicWorker} from '../sim/harness.js'
import {commitmentsOf, firstRound, phaseWorld, rangeOf, settle, witnessAndAdvance, type PhaseWorld} from './helpers.js'

const RESULT_BYTES = 300
const FORMAT = loadTestResultFormat(RESULT_BYTES)

/** A valid result of the load-test format (a well-formed DisTrO result), different for each `seed`. */
async function validResult(seed: string): Promise<Uint8Array> {
  const w = new LoadTestWorker({purpose: 'load-test', resultBytes: RESULT_BYTES, computeMs: 0})
  await w.initFromConfig({seed}, 0)
  await w.beginRound(new Uint32Array([1, 2, 3]), 1, 1)
  return (await w.finishRound(1)).result
}

/** The same selected positions with one sign flipped: other bytes, other commitment, a copy all the same. */
function signFlipped(bytes: Uint8Array): Uint8Array {
  const out = new Uint8Array(bytes)
  out[out.length - 1] ^= 1
  return out
}

function roundResults(w: PhaseWorld<never> | PhaseWorld): RoundResults {
  const results = new RoundResults(w.ctx, new Evaluation(w.ctx), new ExchangeHealth(w.ctx), new Checkpointing(w.ctx))
  w.p2p.onAnnouncement((a) => results.onAnnouncement(a))
  return results
}

/**
 * Three clients at round 1 (we are the first): each publishes `bytes[i]` (ours recorded as our own); the witnesses
 * attest them; the run moves on to round 2, round 1 final.
 */
async function witnessedRound(bytes: Uint8Array[], o: {format?: boolean; worker?: DeterministicWorker; announce?: boolean[]} = {}) {
  const run = firstRound(bytes.length)
  const [me, ...others] = run.identities
  const w = phaseWorld({identity: me, state: run.state, worker: o.worker})
  if (o.format) w.ctx.resultFormat = FORMAT
  const results = roundResults(w)
  const round = run.state.epoch.round!
  const mine = rangeOf(run.state, me.id)
  const own = signAnnouncement(me, {
    run_id: run.state.run_id,
    step: 1,
    client_id: me.id,
    batch_start: mine.start,
    batch_end: mine.end,
    commitment: resultCommitment(bytes[0]),
    size: bytes[0].length,
  })
  results.own(own, bytes[0])
  for (const [i, peer] of others.entries()) {
    if (o.announce?.[i + 1] === false) continue
    const node = await w.peer(peer)
    const r = rangeOf(run.state, peer.id, round)
    await node.publishResult(1, r.start, r.end, bytes[i + 1])
  }
  await settle()
  const byId = new Map<ClientId, Uint8Array>(run.ids.map((id, i) => [id, bytes[i]]))
  const next = witnessAndAdvance(run.state, run.now, commitmentsOf(byId))
  w.ctx.state = next.state
  return {...run, w, results, previous: next.previous, byId}
}

describe('round results: intake of announcements and bytes', () => {
  it("a peer's announcement is recorded and its bytes fetched at once; past steps and batches not its own are ignored", async () => {
    const {identities, state} = firstRound(3)
    const [me, bob, carol] = identities
    const w = phaseWorld({identity: me, state, modelStep: 0})
    roundResults(w)
    const bobNode = await w.peer(bob)
    const carolNode = await w.peer(carol)
    const b = rangeOf(state, bob.id)
    const bytes = new Uint8Array([1, 2, 3])
    await bobNode.publishResult(1, b.start, b.end, bytes)
    await bobNode.publishResult(0, b.start, b.end, new Uint8Array([9])) // a step our model is past
    await carolNode.publishResult(1, b.start, b.end, new Uint8Array([4])) // bob's batches
    await settle()
    const held = w.ctx.ledger.get(1)!.results
    assert.deepEqual([...held.keys()], [bob.id])
    assert.deepEqual(held.get(bob.id)!.bytes, bytes)
    assert.equal(held.get(bob.id)!.invalid, undefined)
    assert.equal(w.ctx.ledger.get(0), undefined)
    assert.equal(w.logged('announcement_ignored').length, 1)
    assert.ok(w.calls.poke >= 1 && w.calls.flush >= 1, 'a download wakes the work loop and the messages due')
  })

  it('an equivocation is reported once, with its proof, and neither of its results counts', async () => {
    const {identities, state} = firstRound(3)
    const [me, bob] = identities
    const w = phaseWorld({identity: me, state})
    roundResults(w)
    const node = await w.peer(bob)
    const b = rangeOf(state, bob.id)
    await node.publishResult(1, b.start, b.end, new Uint8Array([1]))
    await settle()
    await node.publishResult(1, b.start, b.end, new Uint8Array([2]))
    await node.publishResult(1, b.start, b.end, new Uint8Array([3]))
    await settle()
    assert.equal(w.conn.of('equivocation').length, 1)
    assert.match(String(w.ctx.ledger.get(1)!.results.get(bob.id)!.invalid), /^equivocation: /)
    assert.equal(w.logged('equivocation_reported').length, 1)
  })

  it("against the model's result format: a size no result has is refused without a download, bytes that do not decode once downloaded", async () => {
    const {identities, state} = firstRound(3)
    const [me, bob, carol] = identities
    const w = phaseWorld({identity: me, state})
    w.ctx.resultFormat = FORMAT
    roundResults(w)
    const good = await validResult('a')
    const badMagic = new Uint8Array(good)
    badMagic[0] = 0x51
    const b = rangeOf(state, bob.id)
    const c = rangeOf(state, carol.id)
    await (await w.peer(bob)).publishResult(1, b.start, b.end, new Uint8Array(good.length + 1))
    await (await w.peer(carol)).publishResult(1, c.start, c.end, badMagic)
    await settle()
    const held = w.ctx.ledger.get(1)!.results
    assert.match(String(held.get(bob.id)!.invalid), new RegExp(`^${FORMAT_INVALID}announced size ${good.length + 1} bytes`))
    assert.equal(held.get(bob.id)!.bytes!.length, 0, 'not downloaded')
    assert.match(String(held.get(carol.id)!.invalid), new RegExp(`^${FORMAT_INVALID}bad magic`))
    assert.equal(w.logged('result_rejected').length, 2)
  })
})

describe('round results: collection of a final round', () => {
  it('the accepted results in canonical order, less those whose bytes are invalid and the later of two near copies; collected once', async () => {
    const a = await validResult('a')
    const b = await validResult('b')
    const broken = new Uint8Array(a.length) // the right size, and no valid result
    const r = await witnessedRound([a, b, signFlipped(b), broken], {format: true})
    const [me, bob, carol, dave] = r.ids
    const collected = await r.results.collect(r.previous)
    assert.ok(collected)
    const order = trainersWithBatches(r.w.ctx.state, r.previous).map((t) => t.id)
    const copy = order.indexOf(bob) < order.indexOf(carol) ? carol : bob
    assert.deepEqual(
      collected.results.map((x) => x.client_id),
      order.filter((id) => id !== dave && id !== copy),
    )
    assert.deepEqual(
      collected.results.map((x) => x.bytes),
      order.filter((id) => id !== dave && id !== copy).map((id) => r.byId.get(id)),
    )
    assert.equal(collected.peers, 1)
    assert.equal(collected.peersAccepted, 2, "the witnessed results of others that decode: bob's and carol's")
    const dropped = new Map(r.w.logged('result_dropped').map((e) => [(e as {client_id: string}).client_id, String((e as {reason: string}).reason)]))
    assert.match(dropped.get(dave)!, new RegExp(`^${FORMAT_INVALID}`))
    assert.match(dropped.get(copy)!, /^copy: index overlap 1\.000/)
    assert.equal(dropped.has(me), false)
    assert.equal(await r.results.collect(r.previous), collected, 'kept until applied: the score job and the apply see one list')
    assert.equal(r.w.logged('result_dropped').length, 2, 'logged once')
  })

  it('waits for a witnessed result it has no announcement of, then gives up on the epoch rather than fork', async () => {
    const r = await witnessedRound([new Uint8Array([1]), new Uint8Array([2]), new Uint8Array([3])], {announce: [true, true, false]})
    r.w.ctx.opts.missingResultWaitMs = 5_000
    assert.equal(await r.results.collect(r.previous), undefined)
    assert.equal(r.w.ctx.modelStep, 0, 'still waiting')
    r.w.clock.advance(5_000)
    assert.equal(await r.results.collect(r.previous), undefined)
    const [event] = r.w.logged('out_of_sync') as {unannounced: string[]}[]
    assert.deepEqual(event.unannounced, [r.ids[2]])
    assert.equal(r.w.ctx.modelStep, null, 'the model is dropped until the next epoch')
  })
})

describe('round results: apply and its bookkeeping', () => {
  it('applied alone: the worker applies the collected results; our model moves to the step, and the round is logged', async () => {
    const worker = new DeterministicWorker()
    const r = await witnessedRound([new Uint8Array([1]), new Uint8Array([2]), new Uint8Array([3])], {worker})
    const before = worker.paramHash
    assert.equal(await r.results.applyAlone(r.previous), true)
    assert.deepEqual(worker.applies, [{step: 1, results: 3}])
    assert.notEqual(worker.paramHash, before, 'the model changed')
    assert.equal(r.w.ctx.modelStep, 1)
    assert.equal(r.w.ctx.lastHash, worker.paramHash)
    assert.equal(r.w.ctx.roundsApplied, 1)
    const [event] = r.w.logged('round') as RoundEvent[]
    assert.equal(event.step, 1)
    assert.equal(event.param_hash, worker.paramHash)
    assert.equal(event.applied, 3)
    assert.equal(event.peers_applied, 2)
    assert.equal(event.peers_accepted, 2)
    assert.equal(event.other_trainers, 2)
    assert.equal(event.rounds_without_exchange, 0)
    assert.equal(r.w.ctx.snapshot, undefined, 'in a round phase the served model is not replaced')
  })

  it("the worker's refusal is data: the result at the refused index is dropped, and the apply goes again without it", async () => {
    class Refusing extends DeterministicWorker {
      refusals = 1
      async applyResults(step: number, results: Uint8Array[]): Promise<string> {
        // The message names another result: the index, not the text, says which one.
        if (this.refusals-- > 0) throw new WorkerRequestError('bad_result', 'worker: apply_results: rejected result: result 0: bad magic', 'apply_results', 1)
        return super.applyResults(step, results)
      }
    }
    const worker = new Refusing()
    const r = await witnessedRound([new Uint8Array([1]), new Uint8Array([2]), new Uint8Array([3])], {worker})
    const listed = (await r.results.collect(r.previous))!.results.map((x) => x.client_id)
    assert.equal(await r.results.applyAlone(r.previous), false)
    const [dropped] = r.w.logged('result_dropped') as {client_id: string; reason: string}[]
    assert.equal(dropped.client_id, listed[1])
    assert.match(dropped.reason, new RegExp(`^${FORMAT_INVALID}the worker refused it: `))
    assert.equal(r.w.ctx.modelStep, 0)
    assert.equal(await r.results.applyAlone(r.previous), true)
    assert.deepEqual(worker.applies, [{step: 1, results: 2}])
    assert.equal((r.w.logged('round')[0] as RoundEvent).applied, 2)
  })

  it('a refusal that names no result is an error, not a drop', async () => {
    class Refusing extends DeterministicWorker {
      async applyResults(): Promise<string> {
        throw new WorkerRequestError('bad_result', 'worker: apply_results: rejected result: result 1: bad magic', 'apply_results')
      }
    }
    const r = await witnessedRound([new Uint8Array([1]), new Uint8Array([2]), new Uint8Array([3])], {worker: new Refusing()})
    await assert.rejects(r.results.applyAlone(r.previous), WorkerRequestError)
    assert.equal(r.w.logged('result_dropped').length, 0)
  })

  it('with training: the results go to the training call in order; the round event waits for report()', async () => {
    const r = await witnessedRound([new Uint8Array([1]), new Uint8Array([2]), new Uint8Array([3])])
    const expected = (await r.results.collect(r.previous))!.results.map((x) => x.bytes)
    let handed: Uint8Array[] = []
    const out = await r.results.applyWithTraining(r.previous, async (results) => {
      handed = results
      return {paramHash: 'ab'.repeat(32), loss: 2}
    })
    assert.equal(out.status, 'applied')
    assert.deepEqual(handed, expected)
    assert.equal(r.w.ctx.modelStep, 1)
    assert.equal(r.w.logged('round').length, 0, 'not logged before our own result is out')
    if (out.status === 'applied') await r.results.report(out.event)
    assert.equal((r.w.logged('round')[0] as RoundEvent).param_hash, 'ab'.repeat(32))
  })
})
