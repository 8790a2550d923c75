import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import {
  batchRangeFor,
  deserializeState,
  isVerifier,
  selectVerifiers,
  selectWitnesses,
  serializeState,
  tick,
  verifierCount,
  type CoordinatorState,
} from '../../src/core/coordinator/index.js'
import {signAnnouncement} from '../../src/core/primitives/announcement.js'
import {generateIdentity, identityFromSeed} from '../../src/core/protocol/identity.js'
import {checkEquivocation} from '../../src/core/coordinator/equivocation.js'
import {ok, rejected, toFirstRound, witnessAll} from './helpers.js'
import {isScoreAssigned, scoreAssignedCount} from '../../src/core/coordinator/rules.js'

/** Ticks one time unit at a time until the phase changes. */
function tickUntilChange(state: CoordinatorState, now: number): {state: CoordinatorState; now: number} {
  const phase = state.run_state
  for (let i = 0; i < 1_000_000; i++) {
    state = tick(state, ++now)
    if (state.run_state !== phase) return {state, now}
  }
  throw new Error(`stayed in ${phase}`)
}

const people = Array.from({length: 4}, (_, i) => identityFromSeed(Buffer.alloc(32, i + 1)))
const idsOf = people.map((p) => p.id)

function firstRound(config = {witness_nodes: 0, min_clients: 2}): {state: CoordinatorState; now: number} {
  return toFirstRound(idsOf, config)
}

function announce(state: CoordinatorState, who: number, commitmentByte: number, step = state.epoch.round!.step) {
  const range = batchRangeFor(state, people[who].id, state.epoch.round!)!
  return signAnnouncement(people[who], {
    run_id: state.run_id,
    step,
    client_id: people[who].id,
    batch_start: range.start,
    batch_end: range.end,
    commitment: Buffer.alloc(32, commitmentByte).toString('hex'),
    size: 100,
  })
}

function stateOf(s: CoordinatorState, id: string): string | undefined {
  return s.epoch.clients.find((c) => c.id === id)?.state
}

describe('accusations of invalid results', () => {
  it('a witness quorum accusing one trainer ejects it and excludes its result from the round; fewer do nothing', () => {
    let {state: s, now} = firstRound()
    const round = s.epoch.round!
    const witnesses = selectWitnesses(s)
    assert.equal(witnesses.length, 4) // quorum of 4 witnesses: 2
    const [bad, w1, w2] = [idsOf[3], ...witnesses.filter((w) => w !== idsOf[3])]
    s = ok(s, {type: 'accuse', from: w1, step: round.step, accused: bad, reason: 'invalid_result'}, now)
    assert.equal(stateOf(s, bad), 'Healthy')
    assert.deepEqual(s.epoch.round!.excluded, [])
    rejected(s, {type: 'accuse', from: w1, step: round.step, accused: bad, reason: 'invalid_result'}, now, 'DuplicateAccusation')
    s = ok(s, {type: 'accuse', from: w2, step: round.step, accused: bad, reason: 'invalid_result'}, now)
    assert.equal(stateOf(s, bad), 'Ejected')
    assert.deepEqual(s.epoch.round!.excluded, [bad])
    assert.deepEqual(
      s.epoch.round!.accusations.map((a) => a.from),
      [w1, w2],
    )
    // The record survives serialization, is final with the round, and the ejected client leaves at its end.
    assert.deepEqual(deserializeState(serializeState(s)).epoch.round!.excluded, [bad])
    s = witnessAll(s, now)
    assert.equal(s.run_state, 'RoundWitness')
    ;({state: s, now} = tickUntilChange(s, now))
    assert.equal(s.run_state, 'RoundTrain')
    assert.deepEqual(s.epoch.previous_round!.excluded, [bad])
    assert.ok(!s.epoch.round!.roster.includes(bad))
    assert.deepEqual(
      s.epoch.exited.map((c) => [c.id, c.state]),
      [[bad, 'Ejected']],
    )
    // The finished round cannot be accused any more.
    rejected(s, {type: 'accuse', from: w1, step: round.step, accused: idsOf[2], reason: 'invalid_result'}, now, 'WrongStep')
  })

  it('rejects accusations from non-witnesses, of non-trainers, of oneself, with unknown reasons, outside rounds', () => {
    const {state: s, now} = firstRound({witness_nodes: 1, min_clients: 2})
    const step = s.epoch.round!.step
    const [w] = selectWitnesses(s)
    const other = idsOf.find((id) => id !== w)!
    rejected(s, {type: 'accuse', from: other, step, accused: w, reason: 'invalid_result'}, now, 'InvalidAccusation')
    rejected(s, {type: 'accuse', from: w, step, accused: 'stranger', reason: 'invalid_result'}, now, 'InvalidAccusation')
    rejected(s, {type: 'accuse', from: w, step, accused: w, reason: 'invalid_result'}, now, 'InvalidAccusation')
    rejected(s, {type: 'accuse', from: w, step, accused: other, reason: 'bad_vibes' as 'invalid_result'}, now, 'InvalidAccusation')
    rejected(s, {type: 'accuse', from: w, step: step + 1, accused: other, reason: 'invalid_result'}, now, 'WrongStep')
    // One witness is a quorum of one: it alone ejects.
    const after = ok(s, {type: 'accuse', from: w, step, accused: other, reason: 'invalid_result'}, now)
    assert.equal(stateOf(after, other), 'Ejected')
  })
})

describe('verifiers and low-score accusations', () => {
  it('verification_percent selects verifiers from the round seed; anyone recomputes the same set', () => {
    const {state: s} = firstRound({witness_nodes: 0, min_clients: 2, verification_percent: 50} as never)
    assert.equal(verifierCount(s.config, 4), 2)
    const verifiers = selectVerifiers(s)
    assert.equal(verifiers.length, 2)
    assert.deepEqual(idsOf.filter((id) => isVerifier(s, id)).sort(), [...verifiers].sort())
    assert.equal(verifierCount({...s.config, verification_percent: 0}, 4), 0)
    assert.equal(verifierCount({...s.config, verification_percent: 1}, 4), 1)
  })

  /** The second round of a run over `roster` (so the previous round's results are the ones its verifiers score). */
  function secondRound(roster: string[], config: Record<string, unknown>): {state: CoordinatorState; now: number} {
    let {state, now} = toFirstRound(roster, {witness_nodes: 0, min_clients: 2, ...config})
    state = witnessAll(state, now)
    for (let i = 0; i < 100 && !(state.run_state === 'RoundTrain' && state.epoch.round!.step === 2); i++) state = tick(state, (now += 1000))
    assert.equal(state.epoch.round!.step, 2)
    return {state, now}
  }
  const assignedTo = (s: CoordinatorState, target: string) => selectVerifiers(s).filter((v) => isScoreAssigned(s, s.epoch.round!, s.epoch.previous_round!, v, target))

  it('the verifiers assigned to score a trainer (K = 2 of 8) are its judges: both accusing eject it; an unassigned verifier is refused', () => {
    const roster = Array.from({length: 8}, (_, i) => identityFromSeed(Buffer.alloc(32, i + 11)).id)
    let {state: s, now} = secondRound(roster, {verification_percent: 100, verification_sample: 2})
    const step = s.epoch.round!.step
    const target = roster[5]
    const assigned = assignedTo(s, target)
    assert.equal(assigned.length, 2) // every client verifies, each scores 2: every trainer is scored by 2, quorum 2 (all 8 verifiers: 5)
    assert.equal(scoreAssignedCount(s, s.epoch.round!, s.epoch.previous_round!, target), 2)
    const unassigned = selectVerifiers(s).find((v) => v !== target && !assigned.includes(v))!
    const refusal = rejected(s, {type: 'accuse', from: unassigned, step, accused: target, reason: 'low_score'}, now, 'InvalidAccusation')
    assert.match(refusal, /not assigned to score/)
    s = ok(s, {type: 'accuse', from: assigned[0], step, accused: target, reason: 'low_score'}, now)
    assert.equal(stateOf(s, target), 'Healthy') // one of two assigned is no quorum
    s = ok(s, {type: 'accuse', from: assigned[1], step, accused: target, reason: 'low_score'}, now)
    assert.equal(stateOf(s, target), 'Ejected')
    assert.deepEqual(s.epoch.round!.excluded, [target])
  })

  it('a quorum of the assigned verifiers ejects a low scorer; other accusations do not add up; a non-verifier and the first round are refused', () => {
    let {state: s, now} = secondRound(idsOf, {verification_percent: 75, verification_sample: 3})
    const step = s.epoch.round!.step
    const verifiers = selectVerifiers(s)
    assert.equal(verifiers.length, 3)
    const outsider = idsOf.find((id) => !verifiers.includes(id))!
    const target = verifiers[2]
    const assigned = assignedTo(s, target)
    assert.equal(assigned.length, 2) // the two other verifiers (K = 3 = n - 1): quorum 2
    rejected(s, {type: 'accuse', from: outsider, step, accused: target, reason: 'low_score'}, now, 'InvalidAccusation')
    s = ok(s, {type: 'accuse', from: assigned[0], step, accused: target, reason: 'low_score'}, now)
    // An invalid_result accusation does not add up with a low_score one.
    s = ok(s, {type: 'accuse', from: assigned[1], step, accused: target, reason: 'invalid_result'}, now)
    assert.equal(stateOf(s, target), 'Healthy')
    s = ok(s, {type: 'accuse', from: assigned[1], step, accused: target, reason: 'low_score'}, now)
    assert.equal(stateOf(s, target), 'Ejected')
    assert.deepEqual(s.epoch.round!.excluded, [target])
    // In an epoch's first round nobody has scored anything yet: no low-score accusation.
    const first = firstRound({witness_nodes: 0, min_clients: 2, verification_percent: 75} as never)
    const v = selectVerifiers(first.state)
    rejected(first.state, {type: 'accuse', from: v[0], step: first.state.epoch.round!.step, accused: v[1], reason: 'low_score'}, first.now, 'InvalidAccusation')
  })
})

describe('equivocation', () => {
  it('two signed announcements of different results for one step eject the producer and exclude it from the round', () => {
    const {state: s0, now} = firstRound()
    const proof = {a: announce(s0, 2, 1), b: announce(s0, 2, 2)}
    const s = ok(s0, {type: 'equivocation', from: idsOf[0], proof}, now)
    assert.equal(stateOf(s, idsOf[2]), 'Ejected')
    assert.deepEqual(s.epoch.round!.excluded, [idsOf[2]])
    rejected(s, {type: 'equivocation', from: idsOf[1], proof}, now, 'DuplicateAccusation')
  })

  it('a proof of an earlier step ejects without touching the current round', () => {
    const {state: s0, now} = firstRound()
    const proof = {a: announce(s0, 1, 1, 0), b: announce(s0, 1, 2, 0)}
    const s = ok(s0, {type: 'equivocation', from: idsOf[0], proof}, now)
    assert.equal(stateOf(s, idsOf[1]), 'Ejected')
    assert.deepEqual(s.epoch.round!.excluded, [])
  })

  it('rejects proofs that do not hold', () => {
    const {state: s, now} = firstRound()
    const a = announce(s, 2, 1)
    const same = {a, b: announce(s, 2, 1)}
    rejected(s, {type: 'equivocation', from: idsOf[0], proof: same}, now, 'InvalidProof')
    rejected(s, {type: 'equivocation', from: idsOf[0], proof: {a, b: announce(s, 3, 2)}}, now, 'InvalidProof')
    rejected(s, {type: 'equivocation', from: idsOf[0], proof: {a, b: announce(s, 2, 2, 7)}}, now, 'InvalidProof')
    const forged = {...announce(s, 2, 2), signature: announce(s, 3, 2).signature}
    rejected(s, {type: 'equivocation', from: idsOf[0], proof: {a, b: forged}}, now, 'InvalidProof')
    rejected(s, {type: 'equivocation', from: idsOf[0], proof: {a, b: {...announce(s, 2, 2), run_id: 'other'}}}, now, 'InvalidProof')
    rejected(s, {type: 'equivocation', from: idsOf[0], proof: {a} as never}, now, 'InvalidProof')
    rejected(s, {type: 'equivocation', from: 'stranger', proof: {a, b: announce(s, 2, 2)}}, now, 'UnknownClient')
    // A well-signed pair by someone outside the run.
    const outsider = generateIdentity()
    const o = (c: number) => signAnnouncement(outsider, {...a, client_id: outsider.id, commitment: Buffer.alloc(32, c).toString('hex')})
    assert.equal(checkEquivocation({a: o(1), b: o(2)}, s.run_id).ok, true)
    rejected(s, {type: 'equivocation', from: idsOf[0], proof: {a: o(1), b: o(2)}}, now, 'UnknownClient')
  })
})

describe('ejected clients sit out the next epoch', () => {
  it('an ejected client cannot join again during its epoch or before the next one has begun; after that it may', () => {
    let {state: s, now} = firstRound({witness_nodes: 0, min_clients: 2, rounds_per_epoch: 1} as never)
    const bad = idsOf[3]
    const epoch = s.progress.epoch
    s = ok(s, {type: 'eject', id: bad}, now)
    assert.match(rejected(s, {type: 'join', id: bad}, now, 'Banned'), /was ejected from the current or last epoch/)
    // A client that merely withdrew may come back for the next epoch.
    s = ok(s, {type: 'withdraw', id: idsOf[2]}, now)
    s = ok(s, {type: 'join', id: idsOf[2]}, now)
    s = witnessAll(s, now)
    const seen: string[] = []
    while (!(s.run_state === 'Warmup' && s.progress.epoch > epoch)) {
      ;({state: s, now} = tickUntilChange(s, now))
      seen.push(s.run_state)
      // Through the rest of the round, Cooldown and WaitingForMembers: refused; the epoch's record holds it as Ejected.
      if (s.run_state !== 'Warmup') rejected(s, {type: 'join', id: bad}, now, 'Banned')
    }
    assert.deepEqual(seen.slice(-2), ['WaitingForMembers', 'Warmup'])
    assert.ok(!s.epoch.clients.some((c) => c.id === bad), 'the ejected client is not in the next epoch')
    assert.ok(
      s.epoch.clients.some((c) => c.id === idsOf[2]),
      'the withdrawn one is',
    )
    // The next epoch has begun: it may join again, for the epoch after.
    s = ok(s, {type: 'join', id: bad}, now)
    assert.deepEqual(s.pending, [bad])
    // Other rejections are unchanged: a healthy client of the epoch is AlreadyJoined, not Banned.
    rejected(s, {type: 'join', id: idsOf[0]}, now, 'AlreadyJoined')
  })
})
