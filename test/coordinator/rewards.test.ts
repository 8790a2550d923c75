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
  SCORE_ONE,
  scoreRows,
  scoreToFixed,
  WEIGHT_ONE,
  type RewardsLedger,
} from '../../src/core/coordinator/rewards.js'
import {Scorer} from '../../src/core/verify/score.js'
import {assignedTrainers} from '../../src/core/coordinator/rules.js'
import {honestProof, newRun, ok, reportLoaded, S} from './helpers.js'

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

  /** One second on (in Warmup a client has reported its model loaded: a Warmup with no report starts no round). */
  tick(): void {
    this.adopt(reportLoaded(this.state, this.now))
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
    // Round 1: every result witnessed. Round 2: nobody saw c's result (not accepted: c is dropped as the round closes).
    // Then x is ejected (authority).
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
    assert.equal(row(run, 'c')!.rounds, 1, "c's unwitnessed result of round 2 earns nothing (and c left as it closed)")
    assert.ok(run.state.epoch.exited.some((e) => e.id === 'c' && e.state === 'Dropped' && e.exited_height === 1))
    const x = row(run, 'x')!
    assert.equal(x.earned, 0, 'the ejected client earns nothing for its epoch')
    assert.ok(x.slashed > 0 && x.slashed === run.batches.get('x')! * POINTS_PER_BATCH, `x slashed ${x.slashed}`)
    assert.equal(row(run, 'late'), undefined, 'the late joiner trained nothing yet')

    // Epoch 2: the late joiner trains one round (its results seen), then the epoch ends. c, dropped, joins again.
    const lateBefore = 0
    run.apply({type: 'join', id: 'c'})
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

  /** A run whose five clients all verify (verification_percent 100) at step `step` + 1 (RoundTrain): reports for `step` are due. */
  function scoringRun(sample = 4): Run {
    const run = new Run(
      newRun({
        init_min_clients: 5,
        min_clients: 2,
        witness_nodes: 0,
        verification_percent: 100,
        verification_sample: sample,
        global_batch_size_start: 10,
        global_batch_size_end: 10,
      }),
    )
    for (const id of ['v1', 'v2', 'v3', 'x', 'y']) run.apply({type: 'join', id})
    run.until('RoundTrain')
    return run
  }
  function nextRound(run: Run): void {
    const step = run.state.epoch.round!.step
    run.witness()
    for (let i = 0; i < 50 && !(run.state.run_state === 'RoundTrain' && run.state.epoch.round!.step === step + 1); i++) run.tick()
    assert.equal(run.state.epoch.round!.step, step + 1)
  }
  /** Takes a verifier's report as the server does: its scores (decimals in [-1, 1]) rounded to fixed point once. */
  const record = (run: Run, from: string, step: number, scores: {client_id: string; score: number}[]) => {
    const out = recordScores(
      run.ledger,
      run.state,
      from,
      step,
      scores.map((e) => ({client_id: e.client_id, score: scoreToFixed(e.score)})),
    )
    assert.ok(!('code' in out), `${from}'s scores of step ${step} refused: ${JSON.stringify(out)}`)
    return (run.ledger = out)
  }

  it("scores: per client, a moving average over steps of each step's mean report (the verifiers' own Scorer rule)", () => {
    // K = 4 of 5 trainers: every verifier is assigned every other trainer.
    const run = scoringRun()
    const scorer = new Scorer()
    for (const [i, score] of [0.05, 0.15, -0.02].entries()) {
      nextRound(run)
      // Three verifiers report the same score for the step.
      for (const v of ['v1', 'v2', 'v3']) record(run, v, i + 1, [{client_id: 'x', score}])
      scorer.add('x', score)
    }
    const [x] = scoreRows(run.ledger)
    assert.equal(x.count, 9)
    assert.equal(x.verifiers, 3)
    assert.equal(x.last_step, 3)
    assert.equal(x.last, -0.02)
    // Fixed point: 50000, then trunc((50000 + 150000) / 2) = 100000, then trunc((100000 − 20000) / 2) = 40000.
    assert.equal(run.ledger.clients.x.score, 40000)
    assert.equal(x.average, 0.04)
    assert.ok(Math.abs(x.average - scorer.get('x')!.average) < 1e-6, `${x.average} vs ${scorer.get('x')!.average}`)
    // Disagreeing verifiers: the step's mean counts.
    nextRound(run)
    record(run, 'v1', 4, [{client_id: 'y', score: 0.4}])
    record(run, 'v2', 4, [{client_id: 'y', score: 0.2}])
    assert.equal(scoreRows(run.ledger).find((e) => e.client_id === 'y')!.average, 0.3)
    // A verifier reports a step once; a step whose rounds the state no longer holds is stale; nobody scores itself;
    // a client listed twice in one report counts once.
    assert.equal((recordScores(run.ledger, run.state, 'v1', 4, [{client_id: 'y', score: -1}]) as {code: string}).code, 'DuplicateScores')
    assert.equal((recordScores(run.ledger, run.state, 'v1', 2, [{client_id: 'y', score: -1}]) as {code: string}).code, 'stale_step')
    assert.equal((recordScores(run.ledger, run.state, 'v1', 5, [{client_id: 'y', score: -1}]) as {code: string}).code, 'stale_step')
    assert.equal((recordScores(run.ledger, run.state, 'y', 4, [{client_id: 'y', score: 1}]) as {code: string}).code, 'InvalidScores')
    // Scores are fixed-point integers in [-SCORE_ONE, SCORE_ONE]: anything else is refused whole.
    for (const score of [0.5, SCORE_ONE + 1, -SCORE_ONE - 1, NaN])
      assert.equal((recordScores(run.ledger, run.state, 'v3', 4, [{client_id: 'y', score}]) as {code: string}).code, 'InvalidScores', `score ${score}`)
    record(run, 'v3', 4, [
      {client_id: 'y', score: 0.3},
      {client_id: 'y', score: 0.3},
    ])
    const y = scoreRows(run.ledger).find((e) => e.client_id === 'y')!
    assert.equal(y.count, 3)
    assert.equal(y.verifiers, 3)
    // A trainer nobody scored in a step keeps its average.
    nextRound(run)
    record(run, 'v1', 5, [{client_id: 'y', score: 0.5}])
    assert.equal(scoreRows(run.ledger).find((e) => e.client_id === 'x')!.average, x.average)
    // Reports are remembered a few steps back only (older steps are stale anyway).
    for (let step = 6; step < 12; step++) nextRound(run)
    record(run, 'v1', 11, [])
    assert.deepEqual(run.ledger.reported, ['11:v1'])
  })

  it('scores: only a verifier the seed assigned to a trainer may score it (K = 2 of 5); a trainer scored by few averages those', () => {
    const run = scoringRun(2)
    nextRound(run)
    const round = run.state.epoch.round!
    const scored = run.state.epoch.previous_round!
    const assignment = new Map(['v1', 'v2', 'v3', 'x', 'y'].map((v) => [v, assignedTrainers(run.state, round, scored, v)]))
    assert.equal(assignment.size, 5)
    for (const [v, mine] of assignment) {
      assert.equal(mine.length, 2)
      const other = ['v1', 'v2', 'v3', 'x', 'y'].find((id) => id !== v && !mine.includes(id))!
      // Refused whole, by the rule every replica applies: the ledger is unchanged.
      const refusal = recordScores(run.ledger, run.state, v, 1, [...mine.map((client_id) => ({client_id, score: 300000})), {client_id: other, score: 900000}])
      assert.ok('code' in refusal && refusal.code === 'InvalidScores' && refusal.reason.includes(other), JSON.stringify(refusal))
    }
    // Every trainer is scored by exactly 2 verifiers (5 verifiers × 2 / 5 trainers); one of them reports for x.
    const scorersOfX = [...assignment].filter(([, mine]) => mine.includes('x')).map(([v]) => v)
    assert.equal(scorersOfX.length, 2)
    record(run, scorersOfX[0], 1, [{client_id: 'x', score: 0.25}])
    const x = scoreRows(run.ledger).find((e) => e.client_id === 'x')!
    assert.equal(x.average, 0.25)
    assert.equal(x.verifiers, 1)
    assert.equal(scoreRows(run.ledger).length, 1, 'nobody else was scored')
  })

  it('scores: integer arithmetic with one rounding, truncation toward zero (as C divides), not floats, floor or round', () => {
    const run = scoringRun()
    nextRound(run)
    const fixed = (from: string, step: number, score: number) => {
      const out = recordScores(run.ledger, run.state, from, step, [{client_id: 'x', score}])
      assert.ok(!('code' in out), JSON.stringify(out))
      run.ledger = out
      return run.ledger.clients.x
    }
    // A step's mean: (1 + 2) / 2 = 1.5 → 1 (a float keeps 1.5, rounding gives 2).
    fixed('v1', 1, 1)
    assert.equal(fixed('v2', 1, 2).last, 1)
    assert.equal(run.ledger.clients.x.score, 1)
    // Negative: (−1 − 1 + 0) / 3 → 0 (floor gives −1), and the average (1 + 0) / 2 = 0.5 → 0.
    nextRound(run)
    fixed('v1', 2, -1)
    fixed('v2', 2, -1)
    const e = fixed('v3', 2, 0)
    assert.deepEqual([e.last, e.before, e.score, e.sum, e.verifiers], [0, 1, 0, -2, 3])
    assert.ok(!Object.is(e.last, -0) && !Object.is(e.score, -0), 'no negative zero (JSON would not keep it)')
    // The average: (0 − 5) / 2 = −2.5 → −2 (floor gives −3, Math.round −2 but +3 for +2.5 where trunc gives 2).
    nextRound(run)
    assert.equal(fixed('v1', 3, -5).score, -2)
    nextRound(run)
    assert.equal(fixed('v1', 4, 7).score, 2)
    // Rounded once when taken: the nearest part per million, clamped to [-1, 1].
    assert.deepEqual([0.1234564, 0.1234565, -0.0000004, 3, -2].map(scoreToFixed), [123456, 123457, 0, SCORE_ONE, -SCORE_ONE])
  })

  it('weights: parts per million, nothing at or below zero, linear up to FULL_WEIGHT_SCORE, capped; points exact past 2^53', () => {
    assert.equal(FULL_WEIGHT_SCORE, 200000)
    assert.equal(rewardWeight(-500000, true), 0)
    assert.equal(rewardWeight(0, true), 0)
    assert.equal(rewardWeight(null, true), 0)
    assert.equal(rewardWeight(FULL_WEIGHT_SCORE / 2, true), WEIGHT_ONE / 2)
    assert.equal(rewardWeight(1, true), 5)
    assert.equal(rewardWeight(FULL_WEIGHT_SCORE - 1, true), 999995)
    assert.equal(rewardWeight(900000, true), WEIGHT_ONE)
    assert.equal(rewardWeight(null, false), WEIGHT_ONE)
    assert.equal(rewardWeight(-SCORE_ONE, false), WEIGHT_ONE)
    assert.equal(pointsFor(3, WEIGHT_ONE / 2), 1500)
    assert.equal(pointsFor(3, 333333), 999) // 999.999 floors
    // Splitting 10 batches among identities of the same score earns what one identity earns for them (floor aside).
    assert.equal(pointsFor(4, 800000) + pointsFor(6, 800000), pointsFor(10, 800000))
    // Past 2^53 a float product loses the last digits; the program's u64 product does not.
    const batches = 9_007_199_254_741
    const exact = (BigInt(batches) * 999_999n * 999_999n) / 1_000_000n
    assert.equal(BigInt(pointsFor(batches, 999_999, 999_999)), BigInt(Number(exact)))
    assert.notEqual(BigInt(Math.floor((batches * 999_999 * 999_999) / WEIGHT_ONE)), exact, 'a float product would differ here')
  })

  it('a run with verifiers: a negative-scored client earns nothing for accepted rounds, a well-scored one full points', () => {
    const run = new Run(newRun({init_min_clients: 3, min_clients: 2, witness_nodes: 0, rounds_per_epoch: 2, verification_percent: 100}))
    for (const id of ['good', 'bad', 'meh']) run.apply({type: 'join', id})
    run.until('RoundTrain')
    run.witness()
    run.until('RoundTrain')
    // Verifiers score the first round's results while the second runs.
    record(run, 'meh', 1, [
      {client_id: 'good', score: 0.6},
      {client_id: 'bad', score: -0.4},
    ])
    record(run, 'good', 1, [{client_id: 'meh', score: FULL_WEIGHT_SCORE / SCORE_ONE / 4}])
    // A score of a client that is in no round of the run: no verifier is assigned it, so the report is refused.
    const ghost = recordScores(run.ledger, run.state, 'bad', 1, [{client_id: 'ghost', score: 500000}])
    assert.ok('code' in ghost && ghost.code === 'InvalidScores', JSON.stringify(ghost))
    run.witness()
    run.until('WaitingForMembers')
    assert.equal(row(run, 'good')!.earned, run.batches.get('good')! * POINTS_PER_BATCH)
    assert.equal(row(run, 'bad')!.earned, 0, 'a harmful update earns nothing')
    assert.equal(row(run, 'bad')!.rounds, 2, 'though its results were accepted')
    assert.equal(row(run, 'meh')!.earned, pointsFor(run.batches.get('meh')!, WEIGHT_ONE / 4))
    assert.equal(row(run, 'meh')!.weight, 0.25)
    assert.equal(row(run, 'meh')!.score, 0.05)
  })

  it('the ledger survives JSON (the server saves it with its state); checkLedger names what is wrong', () => {
    const run = scoringRun()
    nextRound(run)
    let ledger = record(run, 'v1', 1, [{client_id: 'x', score: 0.5}])
    ledger = {...ledger, clients: {a: {...ledger.clients.x, client_id: 'a'}}}
    ledger = {...ledger, clients: {...ledger.clients, a: {...ledger.clients.a, earned: 5000, epoch_batches: 2}}}
    assert.deepEqual(checkLedger(JSON.parse(JSON.stringify(ledger))), ledger)
    assert.equal(ledger.clients.a.score, 500000)
    assert.throws(() => checkLedger({version: 3}), /version must be 2/)
    assert.throws(() => checkLedger({...ledger, clients: {a: {...ledger.clients.a, score: 0.5}}}), /rewards\.clients\.a\.score must be an integer/)
    // A server saved before fixed point (version 1, float scores) restarts with its ledger converted.
    const v1 = {...ledger, version: 1, clients: {a: {...ledger.clients.a, score: 0.3333337, last: -0.25, before: null, sum: 0.9999996}}}
    const restored = checkLedger(JSON.parse(JSON.stringify(v1)))
    assert.equal(restored.version, 2)
    assert.deepEqual([restored.clients.a.score, restored.clients.a.last, restored.clients.a.before, restored.clients.a.sum], [333334, -250000, null, 1000000])
    assert.equal(restored.clients.a.earned, 5000)
    assert.throws(() => checkLedger({...v1, clients: {a: {...v1.clients.a, score: 'x'}}}), /rewards\.clients\.a\.score/)
    assert.throws(() => checkLedger({...ledger, clients: {a: {...ledger.clients.a, earned: -1}}}), /rewards\.clients\.a\.earned/)
    assert.throws(() => checkLedger({...ledger, clients: {b: ledger.clients.a}}), /client_id must match/)
    assert.throws(() => checkLedger({...ledger, reported: 'x'}), /reported/)
  })
})
