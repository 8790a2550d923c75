import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import type {HeldResult} from '../../src/core/client/decide.js'
import {Verification} from '../../src/core/client/verification.js'
import {type ClientId, type CoordinatorState, type Round} from '../../src/core/coordinator/index.js'
import type {Identity} from '../../src/core/protocol/identity.js'
import {DeterministicWorker} from '../sim/harness.js'
import {firstRound, phaseWorld, rangeOf, witnessAndAdvance} from './helpers.js'

/** A worker whose every scored result raises the loss on its own batches (a harmful result): scores below zero. */
class HarmedWorker extends DeterministicWorker {
  async scoreResults(_step: number, results: Uint8Array[], batches: {tokens: Uint32Array; rows: number}[]) {
    this.scored += results.length
    return {before: batches.map(() => 2), after: results.map((): [number, number] => [2.1, 2])}
  }
}

/** Every client verifies. Rounds 1..`rounds` are witnessed (each trainer's result: one byte); returns the state after them. */
function verifiedRun(rounds = 1): {identities: Identity[]; ids: ClientId[]; state: CoordinatorState; final: Round[]} {
  const run = firstRound(3, {verification_percent: 100})
  let {state, now} = run
  const final: Round[] = []
  for (let i = 0; i < rounds; i++) {
    const next = witnessAndAdvance(state, now, new Map(run.ids.map((id, j) => [id, `${j}${i}`.padStart(64, '0')])))
    ;({state, now} = next)
    final.push(next.previous)
  }
  return {...run, state, final}
}

/** The collected results of `round` as round-results.ts hands them over: each trainer's, with its bytes. */
function collected(state: CoordinatorState, round: Round, ids: ClientId[]): HeldResult[] {
  return ids.map((id) => {
    const r = rangeOf(state, id, round)
    return {client_id: id, step: round.step, batch_start: r.start, batch_end: r.end, commitment: '00'.repeat(32), bytes: new Uint8Array([ids.indexOf(id)])}
  })
}

describe('verification (the score job)', () => {
  it("scores the peers' results assigned to it before they are applied, reports the scores, and the job is done", async () => {
    const run = verifiedRun()
    const w = phaseWorld({identity: run.identities[0], state: run.state})
    const [previous] = run.final
    await new Verification(w.ctx).score(previous, run.state.epoch.round!, collected(run.state, previous, run.ids))
    assert.equal(w.worker.scored, 2, 'the two peers, not our own result')
    const scored = w.logged('scored') as {client_id: string; score: number; count: number}[]
    assert.deepEqual(scored.map((e) => e.client_id).sort(), run.ids.slice(1).sort())
    assert.ok(
      scored.every((e) => e.score > 0.9 && e.count === 1),
      'honest work scores high',
    )
    const [[step, reported]] = w.conn.of('scores') as [number, {client_id: string; score: number}[]][]
    assert.equal(step, 1)
    assert.deepEqual(reported.map((e) => e.client_id).sort(), run.ids.slice(1).sort())
    assert.equal(w.ctx.ledger.get(1)!.scored, true)
    assert.deepEqual(w.conn.of('accuse'), [])
  })

  it('a peer whose results score low over the window is accused of low_score, once', async () => {
    const run = verifiedRun(2)
    const w = phaseWorld({identity: run.identities[0], state: run.state, worker: new HarmedWorker()})
    const v = new Verification(w.ctx)
    const [first, second] = run.final
    const current = run.state.epoch.round!
    await v.score(first, second, collected(run.state, first, run.ids))
    assert.deepEqual(w.conn.of('accuse'), [], 'one low score is not yet a pattern')
    await v.score(second, current, collected(run.state, second, run.ids))
    const accused = w.conn.of('accuse') as [number, string, string][]
    assert.deepEqual(
      accused.map(([step, , reason]) => `${step} ${reason}`),
      ['3 low_score', '3 low_score'],
    )
    assert.deepEqual(accused.map(([, id]) => id).sort(), run.ids.slice(1).sort())
    await v.score(second, current, collected(run.state, second, run.ids))
    assert.equal(w.conn.of('accuse').length, 2, 'not accused twice in a round')
  })

  it("the run's agreed average (every verifier's reports) gets a low scorer accused without a window of our own", async () => {
    const run = verifiedRun()
    const w = phaseWorld({identity: run.identities[0], state: run.state})
    const low = run.ids[1]
    w.conn.agreed.set(low, {average: -0.5, count: 3, last_step: 0})
    await new Verification(w.ctx).score(run.final[0], run.state.epoch.round!, collected(run.state, run.final[0], run.ids))
    const [[, accused, reason]] = w.conn.of('accuse') as [number, string, string][]
    assert.equal(accused, low)
    assert.equal(reason, 'low_score')
    assert.match(String((w.logged('accused')[0] as {reason: string}).reason), /agreed moving average -0\.500 over 3 reports/)
  })

  it('a scoring that fails is logged and never stops the round: the job is done', async () => {
    class Failing extends DeterministicWorker {
      async scoreResults(): Promise<never> {
        throw new Error('out of memory')
      }
    }
    const run = verifiedRun()
    const w = phaseWorld({identity: run.identities[0], state: run.state, worker: new Failing()})
    await new Verification(w.ctx).score(run.final[0], run.state.epoch.round!, collected(run.state, run.final[0], run.ids))
    assert.match(String((w.logged('verify_failed')[0] as {message: string}).message), /out of memory/)
    assert.equal(w.ctx.ledger.get(1)!.scored, true)
  })
})
