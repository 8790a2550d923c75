// max_trainers_per_round (G): each round the seed's data shuffle puts G members first; they share the round's batches,
// the others have none. The choice is the same on every replica, draws again every round (fair over rounds), and a
// member not chosen is neither judged for producing nothing nor accusable.
import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import {
  applyEvent,
  assignBatches,
  batchRangeFor,
  buildWitnessProof,
  isResultWitnessed,
  isTrainerHealthy,
  isWitness,
  selectWitnesses,
  trainerCount,
  witnessBloomParams,
} from '../../src/core/coordinator/index.js'
import type {CoordinatorState} from '../../src/core/coordinator/index.js'
import {validateRunConfig} from '../../src/core/config/run-config.js'
import {baseConfig, baseLLM, honestProof, ok, rejected, S, toFirstRound, witnessAll} from './helpers.js'

const ids = Array.from({length: 8}, (_, i) => `client-${i}`)

function chosen(state: CoordinatorState): string[] {
  return [...assignBatches(state)].filter(([, r]) => r.end > r.start).map(([id]) => id)
}

/** Ticks once a second until the next RoundTrain (or the run leaves the rounds). */
function nextRound(state: CoordinatorState, now: number): {state: CoordinatorState; now: number} {
  const step = state.epoch.round!.step
  for (let i = 0; i < 100 && !(state.run_state === 'RoundTrain' && state.epoch.round!.step > step); i++) state = applyEvent(state, {type: 'tick'}, (now += S)).state
  return {state, now}
}

describe('max_trainers_per_round', () => {
  it('trainerCount: G when the roster is larger, else the roster; absent means every member', () => {
    assert.equal(trainerCount(baseConfig, 8), 8)
    assert.equal(trainerCount({...baseConfig, max_trainers_per_round: 3}, 8), 3)
    assert.equal(trainerCount({...baseConfig, max_trainers_per_round: 3}, 3), 3)
    assert.equal(trainerCount({...baseConfig, max_trainers_per_round: 10}, 4), 4)
  })

  it("G members share the round's batches, contiguous and whole; the others have an empty range; batchRangeFor agrees", () => {
    const {state} = toFirstRound(ids, {max_trainers_per_round: 3, global_batch_size_start: 10, global_batch_size_end: 10, init_min_clients: 8})
    const round = state.epoch.round!
    const ranges = [...assignBatches(state)].filter(([, r]) => r.end > r.start).map(([, r]) => r)
    assert.equal(ranges.length, 3)
    ranges.sort((a, b) => a.start - b.start)
    assert.equal(ranges[0].start, round.data_index)
    for (let i = 1; i < ranges.length; i++) assert.equal(ranges[i].start, ranges[i - 1].end)
    assert.equal(ranges.at(-1)!.end, round.data_index + round.batch_size)
    assert.deepEqual(
      ranges.map((r) => r.end - r.start),
      [4, 3, 3],
    )
    for (const [id, range] of assignBatches(state)) assert.deepEqual(batchRangeFor(state, id), range)
  })

  it('without G the assignment is what it always was (the same ranges as with G ≥ the roster)', () => {
    const plain = toFirstRound(ids, {init_min_clients: 8}).state
    const wide = toFirstRound(ids, {init_min_clients: 8, max_trainers_per_round: 8}).state
    assert.deepEqual([...assignBatches(plain)], [...assignBatches(wide)])
  })

  it('the choice draws again every round: over 60 rounds each of 8 members trains about G/8 of them', () => {
    let {state, now} = toFirstRound(ids, {max_trainers_per_round: 2, init_min_clients: 8, epoch_time: 10_000})
    const counts = new Map(ids.map((id) => [id, 0]))
    for (let round = 0; round < 60; round++) {
      const picked = chosen(state)
      assert.equal(picked.length, 2)
      for (const id of picked) counts.set(id, counts.get(id)! + 1)
      state = witnessAll(state, now)
      ;({state, now} = nextRound(state, now))
      assert.equal(state.run_state, 'RoundTrain', `round ${round}: ${state.run_state}`)
    }
    // 120 places among 8: 15 each on average; a fair draw keeps every member within 5..25 (binomial, p = 1/4)
    for (const [id, n] of counts) assert.ok(n >= 5 && n <= 25, `${id} trained ${n} of 60 rounds`)
  })

  it('a member not chosen is no health-check or accusation target; a chosen one its witnesses missed is dropped by the closing round', () => {
    let {state, now} = toFirstRound(ids, {max_trainers_per_round: 2, init_min_clients: 8, witness_nodes: 3, epoch_time: 1000})
    const first = chosen(state)
    const idle = state.epoch.round!.roster.find((id) => !first.includes(id) && !isWitness(state, id))!
    const [w0] = selectWitnesses(state)
    rejected(state, {type: 'accuse', from: w0, step: state.epoch.round!.step, accused: idle, reason: 'invalid_result'}, now, 'InvalidAccusation')
    // the witnesses saw only one of the two chosen trainers
    state = witnessAll(state, now, [first[0]])
    assert.equal(state.epoch.round!.complete_witnesses, 0, 'a capped round counts no proof as it arrives')
    assert.equal(applyEvent(state, {type: 'tick'}, now + S).state.run_state, 'RoundWitness', 'a proof lacks a chosen trainer: no early close')
    ;({state, now} = nextRound(state, now))
    // the closing round dropped the chosen trainer its quorum did not see, and nobody else
    assert.deepEqual(
      state.epoch.exited.map((c) => [c.id, c.state]),
      [[first[1], 'Dropped']],
    )
    assert.ok(state.epoch.clients.length === 7 && state.epoch.clients.every((c) => c.state === 'Healthy'), 'the members not chosen stay healthy')
    const reporter = state.epoch.clients[0].id
    rejected(state, {type: 'health_check', from: reporter, accused: [idle]}, now, 'InvalidHealthCheck')
    rejected(state, {type: 'health_check', from: reporter, accused: [first[0]]}, now, 'InvalidHealthCheck')
  })

  it('the witness window closes early once every witness attested both chosen trainers, not before', () => {
    let {state, now} = toFirstRound(ids, {max_trainers_per_round: 2, init_min_clients: 8, witness_nodes: 3, round_witness_time: 60})
    const step = state.epoch.round!.step
    const [w0, w1, w2] = selectWitnesses(state)
    for (const w of [w0, w1]) state = ok(state, {type: 'witness', from: w, step, proof: honestProof(state)}, now)
    state = applyEvent(state, {type: 'tick'}, (now += S)).state
    assert.equal(state.run_state, 'RoundWitness', 'a quorum of proofs ends training')
    state = applyEvent(state, {type: 'tick'}, (now += S)).state
    assert.equal(state.run_state, 'RoundWitness', 'a witness has not sent its proof: the window stays open')
    state = ok(state, {type: 'witness', from: w2, step, proof: honestProof(state)}, now)
    state = applyEvent(state, {type: 'tick'}, (now += S)).state
    assert.equal(state.run_state, 'RoundTrain', 'every witness attested every chosen trainer: the next round, 58 s early')
    assert.equal(state.epoch.round!.step, step + 1)
  })

  it('witness blooms are sized for the G trainers when G is below the roster, for the roster otherwise', () => {
    // 1 % false positives: 160 bits (20 bytes) hold 16 trainers, 384 bits hold 40
    const of = (n: number) => ({roster: Array.from({length: n}, (_, i) => `m${i}`)})
    assert.deepEqual(witnessBloomParams({max_trainers_per_round: 16}, of(40)), {bits: 160, hashes: 7})
    assert.deepEqual(witnessBloomParams({}, of(40)), {bits: 384, hashes: 7})
    assert.deepEqual(witnessBloomParams({max_trainers_per_round: 64}, of(40)), witnessBloomParams({}, of(40)))
    assert.deepEqual(witnessBloomParams({max_trainers_per_round: 16}, of(16)), witnessBloomParams({}, of(16)))
    assert.deepEqual(witnessBloomParams({max_trainers_per_round: 16}, of(256)), witnessBloomParams({}, of(16)))
    assert.deepEqual(witnessBloomParams({max_trainers_per_round: 3}, of(0)), witnessBloomParams({}, of(1)))
    // a round's own count (recorded at its start) wins over the configuration's
    assert.deepEqual(witnessBloomParams({}, {...of(40), trainers: 16}), {bits: 160, hashes: 7})
    assert.deepEqual(witnessBloomParams({max_trainers_per_round: 16}, {...of(40), trainers: 40}), {bits: 384, hashes: 7})
  })

  it("with G = 16 of 40 members a proof's blooms are 20 bytes: accepted, they attest the chosen results and close the window; a roster-sized one is refused", () => {
    const members = Array.from({length: 40}, (_, i) => `member-${i}`)
    let {state, now} = toFirstRound(members, {max_trainers_per_round: 16, init_min_clients: 40, witness_nodes: 3, global_batch_size_start: 32, global_batch_size_end: 32})
    const round = state.epoch.round!
    const step = round.step
    const picked = chosen(state)
    assert.equal(picked.length, 16)
    const proof = honestProof(state)
    for (const bloom of [proof.participant_bloom, proof.broadcast_bloom]) assert.equal(Buffer.from(bloom, 'base64').length, 20)
    // a proof sized for the whole roster (48 bytes), as before G bounded the blooms, does not decode
    const seen = [...assignBatches(state)].filter(([, r]) => r.end > r.start).map(([id, range]) => ({id, range, commitment: Buffer.alloc(32, 1)}))
    const wide = buildWitnessProof({}, {...round, trainers: round.roster.length}, seen)
    assert.equal(Buffer.from(wide.participant_bloom, 'base64').length, 48)
    const [w0] = selectWitnesses(state)
    assert.match(rejected(state, {type: 'witness', from: w0, step, proof: wide}, now, 'InvalidWitness'), /participant_bloom/)
    state = witnessAll(state, now)
    const recorded = state.epoch.round!
    // (members not chosen are never looked up: a 1 % false positive of theirs decides nothing)
    for (const [id, range] of assignBatches(state, recorded)) {
      if (range.end === range.start) continue
      assert.ok(isTrainerHealthy(state, recorded, id), id)
      assert.ok(isResultWitnessed(state, recorded, id, range, Buffer.alloc(32, 1)), id)
    }
    state = applyEvent(state, {type: 'tick'}, (now += S)).state
    state = applyEvent(state, {type: 'tick'}, (now += S)).state
    assert.equal(state.run_state, 'RoundTrain', 'every witness attested every chosen trainer: the window closed early')
    assert.equal(state.epoch.round!.step, step + 1)
    assert.equal(state.epoch.clients.length, 40, 'nobody was dropped')
  })

  it("a round keeps the trainer count it started with: an update while Paused changes neither its batches nor its blooms' size", () => {
    let {state, now} = toFirstRound(ids, {max_trainers_per_round: 3, init_min_clients: 8, witness_nodes: 2})
    assert.equal(state.epoch.round!.trainers, 3)
    state = ok(state, {type: 'pause'}, now)
    state = witnessAll(state, now)
    for (let i = 0; i < 60 && state.run_state !== 'Paused'; i++) state = applyEvent(state, {type: 'tick'}, (now += S)).state
    assert.equal(state.run_state, 'Paused')
    const round = state.epoch.round!
    const before = [...assignBatches(state, round)]
    const picked = before.filter(([, r]) => r.end > r.start).map(([id]) => id)
    assert.equal(picked.length, 3)
    const {max_trainers_per_round: _, ...uncapped} = state.config
    state = ok(state, {type: 'config_update', config: uncapped}, now)
    assert.equal(state.config.max_trainers_per_round, undefined)
    const kept = state.epoch.round!
    assert.deepEqual([...assignBatches(state, kept)], before)
    assert.equal(witnessBloomParams(state.config, kept).bits, 64)
    for (const id of picked) assert.ok(isTrainerHealthy(state, kept, id), id)
  })

  it('validate-config: 1 to 128, a whole number', () => {
    const model = {LLM: baseLLM}
    assert.ok('config' in validateRunConfig({...baseConfig, max_trainers_per_round: 16}, model))
    assert.ok('config' in validateRunConfig({...baseConfig, max_trainers_per_round: 128}, model))
    for (const bad of [0, 129, 2.5, -1]) {
      const r = validateRunConfig({...baseConfig, max_trainers_per_round: bad}, model)
      assert.ok('issues' in r && r.issues.some((i) => i.path === 'config.max_trainers_per_round'), `${bad}: ${JSON.stringify(r)}`)
    }
  })
})
