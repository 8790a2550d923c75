import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import {FORMAT_INVALID, acceptedResults, finalRounds, messagesToSend, nextWork, type ClientView, type HeldResult} from '../../src/core/client/decide.js'
import {applyEvent, assignBatches, batchRangeFor, buildWitnessProof, selectWitnesses, type CoordinatorState, type Round} from '../../src/core/coordinator/index.js'
import {joinAll, newRun, ok, toFirstRound} from '../coordinator/helpers.js'

const IDS = ['alice', 'bob', 'carol']
const COMMIT = '01'.repeat(32)
const OTHER = '02'.repeat(32)

function view(id: string, over: Partial<ClientView> = {}): ClientView {
  return {
    id,
    modelStep: null,
    trainedStep: 0,
    warmupReported: null,
    witnessSent: new Set(),
    healthChecked: new Set(),
    finalRounds: new Map(),
    results: new Map(),
    accused: new Set(),
    ...over,
  }
}

/** What a client holds for a round: every trainer's result (or those in `from`), downloaded, with `commitment`. */
function held(state: CoordinatorState, round: Round, from: string[] = round.roster, commitment = COMMIT): Map<string, HeldResult> {
  const out = new Map<string, HeldResult>()
  for (const id of from) {
    const r = batchRangeFor(state, id, round)!
    out.set(id, {client_id: id, step: round.step, batch_start: r.start, batch_end: r.end, commitment, bytes: new Uint8Array([1])})
  }
  return out
}

/** Every witness of the current round sends a proof of having seen `saw` (default all) with COMMIT. */
function witness(state: CoordinatorState, now: number, saw: string[] = IDS): CoordinatorState {
  const round = state.epoch.round!
  const seen = [...assignBatches(state)].filter(([id, r]) => r.end > r.start && saw.includes(id)).map(([id, range]) => ({id, range, commitment: Buffer.from(COMMIT, 'hex')}))
  for (const w of selectWitnesses(state)) state = ok(state, {type: 'witness', from: w, step: round.step, proof: buildWitnessProof(state.config, round, seen)}, now)
  return state
}

/** Ticks until the run state changes (or throws). */
function advance(state: CoordinatorState, now: number): {state: CoordinatorState; now: number} {
  const from = state.run_state
  for (let i = 0; i < 50; i++) {
    state = applyEvent(state, {type: 'tick'}, (now += 1000)).state
    if (state.run_state !== from) return {state, now}
  }
  throw new Error(`stuck in ${from}`)
}

function toWarmup(llm = {}): CoordinatorState {
  let state = joinAll(newRun({witness_nodes: 3}, llm), IDS, 0)
  let now = 0
  while (state.run_state !== 'Warmup') ({state, now} = advance(state, now))
  return state
}

describe('client decisions: Warmup', () => {
  it('a member without a model loads it from the checkpoint at the epoch start, then reports ready once', () => {
    const state = toWarmup()
    assert.deepEqual(nextWork(state, view('alice')), {kind: 'load_model', step: 0, from: 'checkpoint'})
    assert.deepEqual(messagesToSend(state, view('alice')), [])
    assert.equal(nextWork(state, view('alice', {modelStep: 0})), undefined)
    assert.deepEqual(messagesToSend(state, view('alice', {modelStep: 0})), [{kind: 'warmup_ready', epoch: 0}])
    assert.deepEqual(messagesToSend(state, view('alice', {modelStep: 0, warmupReported: 0})), [])
    // after a reconnect the client forgets what it sent; the state's record keeps it from reporting twice
    const recorded = ok(state, {type: 'witness', from: 'alice', step: state.progress.step, proof: {participant_bloom: '', broadcast_bloom: ''}}, 100)
    assert.deepEqual(messagesToSend(recorded, view('alice', {modelStep: 0})), [])
  })

  it('when the checkpoint is P2P, the model comes from the other members', () => {
    const state = toWarmup({checkpoint: {P2P: {repo_id: 'x'}}})
    assert.deepEqual(nextWork(state, view('bob')), {kind: 'load_model', step: 0, from: ['alice', 'carol']})
  })

  it('a client that is neither in the epoch nor pending asks to join; a pending one waits', () => {
    const state = toWarmup()
    assert.deepEqual(nextWork(state, view('dave')), {kind: 'join'})
    const pending = ok(state, {type: 'join', id: 'dave'}, 100)
    assert.equal(nextWork(pending, view('dave')), undefined)
  })
})

describe('client decisions: rounds', () => {
  const witnesses3 = {witness_nodes: 3}

  it('the first round trains on the assigned range with nothing to apply', () => {
    const {state} = toFirstRound(IDS, witnesses3)
    const work = nextWork(state, view('bob', {modelStep: 0}))
    assert.deepEqual(work, {kind: 'train', round: state.epoch.round, range: batchRangeFor(state, 'bob')})
    // trained already: nothing more to do in this round
    assert.equal(nextWork(state, view('bob', {modelStep: 0, trainedStep: 1})), undefined)
    // no model (e.g. joined without loading): cannot train
    assert.equal(nextWork(state, view('bob')), undefined)
  })

  it('a witness sends its proof as soon as it holds every result, and with what it has once training time is up', () => {
    const {state, now} = toFirstRound(IDS, witnesses3)
    const round = state.epoch.round!
    const all = view('alice', {modelStep: 0, trainedStep: 1, results: new Map([[1, held(state, round)]])})
    const [proof] = messagesToSend(state, all)
    assert.equal(proof.kind, 'witness')
    assert.equal(proof.kind === 'witness' && proof.seen.length, 3)
    assert.deepEqual(messagesToSend(state, {...all, witnessSent: new Set([1])}), [])
    // a proof the coordinator already records is not sent again (e.g. after a reconnect cleared witnessSent)
    const proof0 = proof as Extract<typeof proof, {kind: 'witness'}>
    const seenKeys = proof0.seen.map((r) => ({id: r.client_id, range: {start: r.batch_start, end: r.batch_end}, commitment: Buffer.from(r.commitment, 'hex')}))
    const withMine = ok(state, {type: 'witness', from: 'alice', step: 1, proof: buildWitnessProof(state.config, round, seenKeys)}, now)
    assert.deepEqual(
      messagesToSend(withMine, all).filter((m) => m.kind === 'witness'),
      [],
    )

    const partial = view('alice', {modelStep: 0, trainedStep: 1, results: new Map([[1, held(state, round, ['alice', 'bob'])]])})
    assert.deepEqual(messagesToSend(state, partial), [])
    const late = advance(state, now).state
    assert.equal(late.run_state, 'RoundWitness')
    const [lateProof] = messagesToSend(late, partial)
    assert.equal(
      lateProof.kind === 'witness' &&
        lateProof.seen
          .map((r) => r.client_id)
          .sort()
          .join(),
      'alice,bob',
    )
  })

  it('early in the witness window a witness waits for a result still downloading, then sends what it has', () => {
    const {state, now} = toFirstRound(IDS, witnesses3)
    const late = advance(state, now).state
    assert.equal(late.run_state, 'RoundWitness')
    const results = held(late, late.epoch.round!)
    delete results.get('carol')!.bytes // announced, download in flight
    const downloading = view('alice', {modelStep: 0, trainedStep: 1, results: new Map([[1, results]])})
    // In the grace period: no partial proof (it would hold the coordinator's window open to its end).
    assert.deepEqual(
      messagesToSend(late, {...downloading, witnessGrace: new Set([1])}).filter((m) => m.kind === 'witness'),
      [],
    )
    // Once the download lands, the complete proof goes at once.
    const landed = held(late, late.epoch.round!)
    const [complete] = messagesToSend(late, {...downloading, results: new Map([[1, landed]]), witnessGrace: new Set([1])})
    assert.equal(complete.kind === 'witness' && complete.seen.length, 3)
    // After the grace period (or with nothing in flight): what it has.
    const [partial] = messagesToSend(late, downloading)
    assert.equal(
      partial.kind === 'witness' &&
        partial.seen
          .map((r) => r.client_id)
          .sort()
          .join(),
      'alice,bob',
    )
    const missing = held(late, late.epoch.round!, ['alice', 'bob'])
    const [unannounced] = messagesToSend(late, {...downloading, results: new Map([[1, missing]]), witnessGrace: new Set([1])})
    assert.equal(unannounced.kind, 'witness')
  })

  it('a result announced but not yet downloaded does not count as seen', () => {
    const {state} = toFirstRound(IDS, witnesses3)
    const results = held(state, state.epoch.round!)
    delete results.get('carol')!.bytes
    assert.deepEqual(messagesToSend(state, view('alice', {modelStep: 0, trainedStep: 1, results: new Map([[1, results]])})), [])
  })

  it('the next round applies exactly the quorum-witnessed results of the previous one, folded into training', () => {
    let {state, now} = toFirstRound(IDS, witnesses3)
    state = witness(state, now, ['alice', 'bob'])
    while (state.run_state !== 'RoundTrain' || state.epoch.round!.step !== 2) ({state, now} = advance(state, now))
    const [previous] = finalRounds(state)
    assert.equal(previous.step, 1)
    // carol's result was not witnessed; bob's copy we hold has another commitment than the witnessed one
    const mine = held(state, previous, ['alice', 'carol'])
    mine.set('bob', {...held(state, previous, ['bob'], OTHER).get('bob')!})
    const {accepted, missing} = acceptedResults(state, previous, mine)
    assert.deepEqual(
      accepted.map((r) => r.client_id),
      ['alice'],
    )
    // bob was seen by a quorum, so his real result exists somewhere: wait for it rather than fork
    assert.deepEqual(missing, ['bob'])

    const v = view('alice', {modelStep: 0, trainedStep: 1, finalRounds: new Map([[1, previous]])})
    assert.deepEqual(nextWork(state, v), {kind: 'train', round: state.epoch.round, range: batchRangeFor(state, 'alice'), previous})
  })

  it('once its result is out, a client begins the next round on the batches the state predicts; the round uses them, or a changed roster has them undone', () => {
    const {state, now} = toFirstRound(IDS, witnesses3)
    const round1 = state.epoch.round!
    assert.equal(round1.data_seed, round1.seed, "the epoch's first round shuffles its data by its own seed")
    const done = {modelStep: 0, trainedStep: 1, canSpeculate: true}
    const work = nextWork(state, view('bob', done))
    assert.ok(work?.kind === 'speculate', JSON.stringify(work))
    assert.equal(work.round.step, 2)
    assert.equal(nextWork(state, view('bob', {modelStep: 0, trainedStep: 1})), undefined, 'a worker that cannot undo it does not speculate')
    assert.equal(nextWork(state, view('bob', {modelStep: 0, canSpeculate: true}))?.kind, 'train', 'round 1 is trained first')
    const speculation = {step: 2, range: work.range}
    assert.equal(nextWork(state, view('bob', {...done, speculation})), undefined, 'one speculative round at a time')

    // Everyone's result of round 1 is seen: round 2 begins as predicted, and training takes the work begun for it.
    let s = witness(state, now)
    let t = now
    while (s.run_state !== 'RoundTrain' || s.epoch.round!.step !== 2) ({state: s, now: t} = advance(s, t))
    const round2 = s.epoch.round!
    assert.deepEqual(
      [round2.data_seed, round2.roster, round2.data_index, round2.batch_size],
      [work.round.data_seed, work.round.roster, work.round.data_index, work.round.batch_size],
    )
    assert.deepEqual(assignBatches(s), assignBatches(state, work.round))
    const [previous] = finalRounds(s)
    assert.deepEqual(nextWork(s, view('bob', {...done, speculation, finalRounds: new Map([[1, previous]])})), {kind: 'train', round: round2, range: work.range, previous})

    // carol's result of round 1 is not seen: she is dropped when it closes, round 2 splits its batches between two, and
    // the work begun on bob's predicted batches is undone before anything else.
    s = witness(state, now, ['alice', 'bob'])
    t = now
    while (s.run_state !== 'RoundTrain' || s.epoch.round!.step !== 2) ({state: s, now: t} = advance(s, t))
    assert.deepEqual(s.epoch.round!.roster, ['alice', 'bob'])
    const undo = nextWork(s, view('bob', {...done, speculation, finalRounds: new Map([[1, finalRounds(s)[0]]])}))
    assert.ok(undo?.kind === 'discard' && undo.step === 2, JSON.stringify(undo))
    assert.match(undo.reason, /not the predicted|no batches/)
    // past the rounds (Cooldown), a speculation under way is undone too
    while (s.run_state !== 'Cooldown') ({state: s, now: t} = advance(witness(s, t), t))
    assert.equal(nextWork(s, view('bob', {...done, speculation}))?.kind, 'discard')
  })

  it('a verifier of the current round scores the previous round before it is applied (with training or alone), once', () => {
    let {state, now} = toFirstRound(IDS, {...witnesses3, verification_percent: 100})
    state = witness(state, now)
    while (state.run_state !== 'RoundTrain' || state.epoch.round!.step !== 2) ({state, now} = advance(state, now))
    const [previous] = finalRounds(state)
    const v = view('alice', {modelStep: 0, trainedStep: 1, finalRounds: new Map([[1, previous]])})
    // to be applied with our training of round 2: its forward/backward begins first, overlapping the downloads
    const train = {round: state.epoch.round, range: batchRangeFor(state, 'alice')}
    assert.deepEqual(nextWork(state, v), {kind: 'score', round: previous, current: state.epoch.round, train})
    assert.deepEqual(nextWork(state, {...v, scored: new Set([1])}), {kind: 'train', round: state.epoch.round, range: batchRangeFor(state, 'alice'), previous})
    // trained already (nothing to fold it into): scored, then applied alone
    const trained = {...v, trainedStep: 2}
    assert.deepEqual(nextWork(state, trained), {kind: 'score', round: previous, current: state.epoch.round})
    assert.deepEqual(nextWork(state, {...trained, scored: new Set([1])}), {kind: 'apply', round: previous})
    // not a verifier: no score job
    let plain = toFirstRound(IDS, witnesses3)
    plain.state = witness(plain.state, plain.now)
    while (plain.state.run_state !== 'RoundTrain' || plain.state.epoch.round!.step !== 2) plain = advance(plain.state, plain.now)
    const [p] = finalRounds(plain.state)
    assert.equal(nextWork(plain.state, {...trained, finalRounds: new Map([[1, p]])})?.kind, 'apply')
  })

  it("the previous round's unseen trainers left as it closed: the health check judging it (sent once) accuses nobody", () => {
    let {state, now} = toFirstRound(IDS, witnesses3)
    state = witness(state, now, ['alice', 'bob'])
    while (state.run_state !== 'RoundTrain' || state.epoch.round!.step !== 2) ({state, now} = advance(state, now))
    assert.deepEqual(
      state.epoch.exited.map((c) => [c.id, c.state]),
      [['carol', 'Dropped']],
      'the coordinator dropped carol when round 1 closed',
    )
    const checks = messagesToSend(state, view('alice', {modelStep: 1, trainedStep: 2})).filter((m) => m.kind === 'health_check')
    assert.deepEqual(checks, [{kind: 'health_check', step: 2, judged: 1, accused: []}])
    assert.deepEqual(
      messagesToSend(state, view('alice', {modelStep: 1, trainedStep: 2, healthChecked: new Set([1])})).filter((m) => m.kind === 'health_check'),
      [],
    )
    // Psyche's health check naming carol is still taken, and changes nothing
    const after = ok(state, {type: 'health_check', from: 'alice', accused: ['carol']}, now)
    assert.deepEqual(after.epoch, state.epoch)
  })

  it("at Cooldown the epoch's last round is applied; a missing round blocks every later apply", () => {
    let {state, now} = toFirstRound(IDS, {...witnesses3, rounds_per_epoch: 2} as never)
    const seen: Round[] = []
    while (state.run_state !== 'Cooldown') {
      if (state.run_state === 'RoundTrain' && state.epoch.round!.witnesses.length === 0) state = witness(state, now)
      ;({state, now} = advance(state, now))
      seen.push(...finalRounds(state))
    }
    const rounds = new Map(seen.map((r) => [r.step, r]))
    assert.deepEqual([...rounds.keys()].sort(), [1, 2])
    assert.deepEqual(nextWork(state, view('bob', {modelStep: 1, trainedStep: 2, finalRounds: rounds})), {kind: 'apply', round: rounds.get(2)})
    assert.equal(nextWork(state, view('bob', {modelStep: 2, trainedStep: 2, finalRounds: rounds})), undefined)
    // round 1 never seen: cannot apply round 2 (it would fork); stays behind
    assert.equal(nextWork(state, view('bob', {modelStep: 0, trainedStep: 2, finalRounds: new Map([[2, rounds.get(2)!]])})), undefined)
  })

  it("in Cooldown the last round's witnesses attest their parameter hash once they applied it, once; others do not", () => {
    let {state, now} = toFirstRound(['alice', 'bob', 'carol', 'dave'], {witness_nodes: 2, rounds_per_epoch: 1} as never)
    state = witness(state, now, ['alice', 'bob', 'carol', 'dave'])
    while (state.run_state !== 'Cooldown') ({state, now} = advance(state, now))
    const round = state.epoch.round!
    const [w] = selectWitnesses(state, round)
    const other = round.roster.find((id) => !selectWitnesses(state, round).includes(id))!
    const hash = 'ab'.repeat(32)
    // not applied yet: nothing to attest
    assert.deepEqual(messagesToSend(state, view(w, {modelStep: round.step - 1, paramHash: 'cd'.repeat(32)})), [])
    assert.deepEqual(messagesToSend(state, view(w, {modelStep: round.step, paramHash: hash})), [{kind: 'cooldown_witness', step: round.step, param_hash: hash}])
    assert.deepEqual(messagesToSend(state, view(other, {modelStep: round.step, paramHash: hash})), [])
    assert.deepEqual(messagesToSend(state, view(w, {modelStep: round.step, paramHash: hash, cooldownWitnessSent: round.step})), [])
    // the coordinator takes it; once recorded it is not sent again (after a reconnect too)
    const after = ok(state, {type: 'witness', from: w, step: round.step, proof: {participant_bloom: '', broadcast_bloom: ''}, param_hash: hash}, now)
    assert.deepEqual(after.epoch.hash_witnesses, [{from: w, param_hash: hash}])
    assert.deepEqual(messagesToSend(after, view(w, {modelStep: round.step, paramHash: hash})), [])
  })
})

describe('client decisions: invalid results', () => {
  const witnesses3 = {witness_nodes: 3}

  it('a witness does not attest an invalid result, accuses its producer once, and still witnesses the rest at once', () => {
    const {state} = toFirstRound(IDS, witnesses3)
    const round = state.epoch.round!
    const results = held(state, round)
    results.get('carol')!.invalid = `${FORMAT_INVALID}bad magic`
    const v = view('alice', {modelStep: 0, trainedStep: 1, results: new Map([[1, results]])})
    const messages = messagesToSend(state, v)
    const proof = messages.find((m) => m.kind === 'witness')
    assert.ok(proof && proof.kind === 'witness')
    assert.deepEqual(proof.seen.map((r) => r.client_id).sort(), ['alice', 'bob'])
    assert.deepEqual(
      messages.filter((m) => m.kind === 'accuse'),
      [{kind: 'accuse', step: 1, accused: 'carol', detail: `${FORMAT_INVALID}bad magic`}],
    )
    assert.deepEqual(messagesToSend(state, {...v, witnessSent: new Set([1]), accused: new Set(['1:carol'])}), [])
    // The coordinator takes it from a witness.
    ok(state, {type: 'accuse', from: 'alice', step: 1, accused: 'carol', reason: 'invalid_result'}, 1)
  })

  it('a witnessed result that fails validation is dropped at apply time; an excluded producer is neither applied nor waited for', () => {
    let {state, now} = toFirstRound(IDS, witnesses3)
    state = witness(state, now)
    while (state.run_state !== 'RoundTrain' || state.epoch.round!.step !== 2) ({state, now} = advance(state, now))
    const [previous] = finalRounds(state)
    const mine = held(state, previous)
    mine.get('bob')!.invalid = `${FORMAT_INVALID}duplicate index in chunk 3`
    // A copy flagged by what this client saw is not a property of the bytes: a witnessed one is applied.
    mine.get('carol')!.invalid = "a copy of alice's result"
    const r = acceptedResults(state, previous, mine)
    assert.deepEqual(r.accepted.map((x) => x.client_id).sort(), ['alice', 'carol'])
    assert.deepEqual(
      r.dropped.map((x) => x.client_id),
      ['bob'],
    )
    assert.deepEqual(r.missing, [])
    // Excluded in the round's record (e.g. an equivocation proof): dropped by everyone, even when witnessed.
    const excluded = {...previous, excluded: ['carol']}
    mine.delete('carol')
    const e = acceptedResults(state, excluded, mine)
    assert.deepEqual(
      e.accepted.map((x) => x.client_id),
      ['alice'],
    )
    assert.deepEqual(e.missing, [])
  })
})

describe('client decisions: which rounds are final', () => {
  it('in a round only the previous round is final; past the rounds, the last one is too', () => {
    const {state} = toFirstRound(IDS)
    assert.deepEqual(finalRounds(state), [])
    const cooldownLike = {...state, run_state: 'Cooldown' as const}
    assert.deepEqual(
      finalRounds(cooldownLike).map((r) => r.step),
      [1],
    )
  })
})
