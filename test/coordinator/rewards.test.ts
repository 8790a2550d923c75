import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import {applyEvent, assignBatches, selectWitnesses, type CoordinatorEvent, type CoordinatorState} from '../../src/core/coordinator/index.js'
import {
  acceptedResults,
  checkLedger,
  emptyLedger,
  FULL_WEIGHT_SCORE,
  observeTransition,
  pointsFor,
  POINTS_PER_BATCH,
  recordScores,
  rewardRows,
  rewardWeight,
  scoreRows,
  type RewardsLedger,
} from '../../src/core/coordinator/rewards.js'
import {Scorer} from '../../src/core/verify/score.js'
import {honestProof, newRun, ok, S} from './helpers.js'

/** A coordinator with the rewards ledger following every state it adopts, as the server keeps it. */
class Run {
  ledger: RewardsLedger = emptyLedger()
  now = 0
  /** Accepted batches per client, counted independently from each closing round's assignment. */
  readonly batches = new Map<string, number>()

  constructor(public state: CoordinatorState) {}

  private adopt(next: CoordinatorState): void {
    this.ledger = observeTransition(this.ledger, this.state, next)
    this.state = next
  }

  apply(event: CoordinatorEvent): void {
    this.adopt(ok(this.state, event, this.now))
    this.adopt(applyEvent(this.state, {type: 'tick'}, this.now).state)
  }

  tick(): void {
    this.adopt(applyEvent(this.state, {type: 'tick'}, (this.now += S)).state)
  }

  until(phase: string, limit = 200): void {
    for (let i = 0; i < limit && this.state.run_state !== phase; i++) this.tick()
    assert.equal(this.state.run_state, phase)
  }

  /** The round's witnesses attest the results of `saw` (default: every trainer); counts what they attest as accepted. */
  witness(saw?: string[]): void {
    const round = this.state.epoch.round!
    for (const [id, r] of assignBatches(this.state)) if ((!saw || saw.includes(id)) && r.end > r.start) this.batches.set(id, (this.batches.get(id) ?? 0) + r.end - r.start)
    const proof = honestProof(this.state, saw)
    for (const w of selectWitnesses(this.state))
      if (this.state.epoch.round?.step === round.step && this.state.run_state !== 'Cooldown') this.apply({type: 'witness', from: w, step: round.step, proof})
  }
}

const row = (r: Run, id: string) => rewardRows(r.ledger, r.state).find((x) => x.client_id === id)

describe('rewards ledger (coordinator/rewards.ts)', () => {
  it('credits accepted results per batch, settles each epoch, slashes the ejected, and counts a late joiner only for what it trained', () => {
    const run = new Run(newRun({init_min_clients: 4, min_clients: 2, witness_nodes: 0, rounds_per_epoch: 3, global_batch_size_start: 10, global_batch_size_end: 10}))
    for (const id of ['a', 'b', 'c', 'x']) run.apply({type: 'join', id})
    run.until('RoundTrain')
    // Round 1: every result witnessed. Round 2: nobody saw c's result (not accepted). Then x is ejected (authority).
    run.witness()
    run.until('RoundTrain')
    assert.equal(run.state.progress.step, 2)
    run.witness(['a', 'b', 'x'])
    run.until('RoundTrain')
    run.apply({type: 'eject', id: 'x'})
    // A late joiner waits for the next epoch.
    run.apply({type: 'join', id: 'late'})
    run.witness(['a', 'b', 'c', 'x'])
    run.until('Cooldown')
    const before = rewardRows(run.ledger, run.state)
    assert.ok(
      before.every((r) => r.earned === 0),
      'nothing is earned before the epoch ends',
    )
    assert.ok(row(run, 'a')!.pending > 0, 'the open epoch shows as pending')
    assert.equal(row(run, 'x')!.pending, 0, 'an ejected client has nothing pending')
    run.until('WaitingForMembers')
    assert.equal(run.ledger.epochs, 1)
    for (const id of ['a', 'b', 'c']) {
      const r = row(run, id)!
      assert.equal(r.batches, run.batches.get(id), `${id}: accepted batches`)
      assert.equal(r.earned, run.batches.get(id)! * POINTS_PER_BATCH, `${id}: earned (no verifiers: weight 1)`)
      assert.equal(r.slashed, 0)
      assert.equal(r.pending, 0)
    }
    assert.equal(row(run, 'a')!.rounds, 3)
    assert.equal(row(run, 'c')!.rounds, 2, "c's unwitnessed result of round 2 earns nothing")
    const x = row(run, 'x')!
    assert.equal(x.earned, 0, 'the ejected client earns nothing for its epoch')
    assert.ok(x.slashed > 0 && x.slashed === run.batches.get('x')! * POINTS_PER_BATCH, `x slashed ${x.slashed}`)
    assert.equal(row(run, 'late'), undefined, 'the late joiner trained nothing yet')

    // Epoch 2: the late joiner trains one round (its results seen), then the epoch ends.
    const lateBefore = 0
    run.until('RoundTrain')
    assert.ok(run.state.epoch.clients.some((c) => c.id === 'late'))
    run.witness()
    run.until('RoundTrain')
    run.witness()
    run.until('RoundTrain')
    run.witness()
    run.until('WaitingForMembers')
    const late = row(run, 'late')!
    assert.equal(late.rounds, 3)
    assert.equal(late.earned - lateBefore, run.batches.get('late')! * POINTS_PER_BATCH)
    assert.equal(row(run, 'a')!.earned, run.batches.get('a')! * POINTS_PER_BATCH)
    assert.equal(row(run, 'x')!.slashed, x.slashed, 'x (banned for this epoch) trained nothing more')
  })

  it('acceptedResults: an excluded result or one below the witness quorum is not accepted', () => {
    const run = new Run(newRun({init_min_clients: 3, min_clients: 2, witness_nodes: 3}))
    for (const id of ['a', 'b', 'c']) run.apply({type: 'join', id})
    run.until('RoundTrain')
    const round = run.state.epoch.round!
    const [w1, w2] = selectWitnesses(run.state)
    let s = ok(run.state, {type: 'witness', from: w1, step: round.step, proof: honestProof(run.state)}, run.now)
    s = ok(s, {type: 'witness', from: w2, step: round.step, proof: honestProof(s, ['a', 'b'])}, run.now)
    // Quorum of 3 witnesses is 2: a and b were seen by both, c by one.
    const accepted = acceptedResults(s, s.epoch.round!)
    assert.deepEqual([...accepted.keys()].sort(), ['a', 'b'])
    const excluded = {...s.epoch.round!, excluded: ['a']}
    assert.deepEqual([...acceptedResults(s, excluded).keys()], ['b'])
  })

  it("scores: per client, a moving average over steps of each step's mean report (the verifiers' own Scorer rule)", () => {
    let ledger = emptyLedger()
    const scorer = new Scorer()
    for (const [i, score] of [0.05, 0.15, -0.02].entries()) {
      // Three verifiers report the same score for the step.
      for (const v of ['v1', 'v2', 'v3']) ledger = recordScores(ledger, v, i + 1, [{client_id: 'x', score}])!
      scorer.add('x', score)
    }
    const [x] = scoreRows(ledger)
    assert.equal(x.count, 9)
    assert.equal(x.verifiers, 3)
    assert.equal(x.last_step, 3)
    assert.ok(Math.abs(x.last + 0.02) < 1e-12)
    assert.ok(Math.abs(x.average - scorer.get('x')!.average) < 1e-12, `${x.average} vs ${scorer.get('x')!.average}`)
    // Disagreeing verifiers: the step's mean counts.
    ledger = recordScores(ledger, 'v1', 4, [{client_id: 'y', score: 0.4}])!
    ledger = recordScores(ledger, 'v2', 4, [{client_id: 'y', score: 0.2}])!
    assert.ok(Math.abs(scoreRows(ledger).find((e) => e.client_id === 'y')!.average - 0.3) < 1e-12)
    // A verifier reports a step once; an older step than one already scored no longer counts; nobody scores itself;
    // a client listed twice in one report counts once.
    assert.equal(recordScores(ledger, 'v1', 4, [{client_id: 'y', score: -1}]), undefined)
    ledger = recordScores(ledger, 'v4', 3, [{client_id: 'y', score: -1}])!
    ledger = recordScores(ledger, 'y', 5, [{client_id: 'y', score: 1}])!
    ledger = recordScores(ledger, 'v3', 4, [
      {client_id: 'y', score: 0.3},
      {client_id: 'y', score: 0.3},
    ])!
    const y = scoreRows(ledger).find((e) => e.client_id === 'y')!
    assert.equal(y.count, 3)
    assert.equal(y.verifiers, 3)
    // Reports are remembered a few steps back only (the server refuses older steps anyway).
    ledger = recordScores(ledger, 'v1', 20, [])!
    assert.deepEqual(ledger.reported, ['20:v1'])
  })

  it('weights: nothing at or below zero, linear up to FULL_WEIGHT_SCORE, capped at 1; unscored earns nothing when the run has verifiers', () => {
    assert.equal(rewardWeight(-0.5, true), 0)
    assert.equal(rewardWeight(0, true), 0)
    assert.equal(rewardWeight(null, true), 0)
    assert.equal(rewardWeight(FULL_WEIGHT_SCORE / 2, true), 0.5)
    assert.equal(rewardWeight(0.9, true), 1)
    assert.equal(rewardWeight(null, false), 1)
    assert.equal(rewardWeight(-1, false), 1)
    assert.equal(pointsFor(3, 0.5), 1500)
    // Splitting 10 batches among identities of the same score earns what one identity earns for them (floor aside).
    assert.equal(pointsFor(4, 0.8) + pointsFor(6, 0.8), pointsFor(10, 0.8))
  })

  it('a run with verifiers: a negative-scored client earns nothing for accepted rounds, a well-scored one full points', () => {
    const run = new Run(newRun({init_min_clients: 3, min_clients: 2, witness_nodes: 0, rounds_per_epoch: 2, verification_percent: 100}))
    for (const id of ['good', 'bad', 'meh']) run.apply({type: 'join', id})
    run.until('RoundTrain')
    run.witness()
    run.until('RoundTrain')
    // Verifiers score the first round's results while the second runs.
    run.ledger = recordScores(run.ledger, 'meh', 1, [
      {client_id: 'good', score: 0.6},
      {client_id: 'bad', score: -0.4},
    ])!
    run.ledger = recordScores(run.ledger, 'good', 1, [{client_id: 'meh', score: FULL_WEIGHT_SCORE / 4}])!
    // A score of a client that is in no epoch of the run (the server refuses such reports; the rule still bounds it).
    run.ledger = recordScores(run.ledger, 'bad', 1, [{client_id: 'ghost', score: 0.5}])!
    assert.ok(scoreRows(run.ledger).some((x) => x.client_id === 'ghost'))
    run.witness()
    run.until('WaitingForMembers')
    assert.equal(row(run, 'ghost'), undefined, 'a score alone, of a client of no epoch, is dropped when the epoch ends')
    assert.equal(row(run, 'good')!.earned, run.batches.get('good')! * POINTS_PER_BATCH)
    assert.equal(row(run, 'bad')!.earned, 0, 'a harmful update earns nothing')
    assert.equal(row(run, 'bad')!.rounds, 2, 'though its results were accepted')
    assert.equal(row(run, 'meh')!.earned, pointsFor(run.batches.get('meh')!, 0.25))
  })

  it('the ledger survives JSON (the server saves it with its state); checkLedger names what is wrong', () => {
    let ledger = recordScores(emptyLedger(), 'v', 1, [{client_id: 'a', score: 0.5}])!
    ledger = {...ledger, clients: {...ledger.clients, a: {...ledger.clients.a, earned: 5000, epoch_batches: 2}}}
    assert.deepEqual(checkLedger(JSON.parse(JSON.stringify(ledger))), ledger)
    assert.throws(() => checkLedger({version: 2}), /version must be 1/)
    assert.throws(() => checkLedger({...ledger, clients: {a: {...ledger.clients.a, earned: -1}}}), /rewards\.clients\.a\.earned/)
    assert.throws(() => checkLedger({...ledger, clients: {b: ledger.clients.a}}), /client_id must match/)
    assert.throws(() => checkLedger({...ledger, reported: 'x'}), /reported/)
  })
})
