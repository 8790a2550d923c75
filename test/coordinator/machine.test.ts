import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import {
  applyEvent,
  assignBatches,
  batchSizeForStep,
  createCoordinator,
  isCheckpointP2P,
  isWitness,
  modelMismatch,
  modelWanted,
  selectWitnesses,
  tick,
  witnessBloomParams,
  type CoordinatorState,
} from '../../src/core/coordinator/index.js'
import {BloomFilter} from '../../src/core/primitives/bloom.js'
import {loadRunConfigFile} from '../../src/core/config/index.js'
import {PARAMS, S, attestParams, baseConfig, baseLLM, honestProof, joinAll, newRun, ok, rejected, reportLoaded, toFirstRound, witnessAll} from './helpers.js'
import {MAX_CLIENTS} from '../../src/core/layout/layout-table.js'

const ids = (n: number, prefix = 'c') => Array.from({length: n}, (_, i) => `${prefix}${i}`)

/** Ticks once a second (S ms) until the phase changes (or `limit` seconds pass); in Warmup a client reports its model loaded. */
function tickUntilChange(state: CoordinatorState, now: number, limit = 200): {state: CoordinatorState; now: number} {
  const phase = state.run_state
  for (let i = 0; i < limit; i++) {
    state = tick(reportLoaded(state, now), (now += S))
    if (state.run_state !== phase) return {state, now}
  }
  throw new Error(`stayed in ${phase} for ${limit}s`)
}

describe('WaitingForMembers → Warmup', () => {
  it('waits for init_min_clients pending clients', () => {
    let s = joinAll(newRun(), ids(2), 0)
    for (let t = 1; t <= 20; t++) s = tick(s, t * S)
    assert.equal(s.run_state, 'WaitingForMembers')
    s = ok(s, {type: 'join', id: 'c2'}, 20 * S)
    s = tick(s, 21 * S)
    assert.equal(s.run_state, 'Warmup')
    assert.deepEqual(
      s.epoch.clients.map((c) => c.id),
      ['c0', 'c1', 'c2'],
    )
    assert.deepEqual(s.pending, [])
    assert.ok(s.epoch.clients.every((c) => c.state === 'Healthy'))
  })

  it("init_min_clients gates the start of every epoch, as Psyche's coordinator does; min_clients is the fewest a started epoch goes on with", () => {
    // Psyche (shared/coordinator/src/coordinator.rs, tick_waiting_for_members at 96aa920): pending ≥ init_min_clients
    // starts Warmup, whichever epoch it is; tick_warmup and the rounds end the epoch below min_clients.
    let {state: s, now} = toFirstRound(ids(3), {init_min_clients: 3, min_clients: 2, epoch_time: 30})
    // one leaves mid-epoch: two are still ≥ min_clients, the epoch goes on
    s = ok(s, {type: 'withdraw', id: 'c2'}, now)
    for (let i = 0; i < 200 && s.run_state !== 'Cooldown'; i++) {
      if (s.run_state === 'RoundTrain') s = witnessAll(s, now)
      s = tick(s, (now += S))
      assert.notEqual(s.run_state, 'WaitingForMembers', 'the epoch went on with 2 clients')
    }
    s = attestParams(s, now)
    for (let i = 0; i < 20 && s.run_state === 'Cooldown'; i++) s = tick(s, (now += S))
    assert.equal(s.run_state, 'WaitingForMembers')
    assert.deepEqual(s.pending, ['c0', 'c1'])
    // the next epoch waits for init_min_clients again: 2 of 3 do not start it, however long they wait
    for (let i = 0; i < 60; i++) s = tick(s, (now += S))
    assert.equal(s.run_state, 'WaitingForMembers')
    s = ok(s, {type: 'join', id: 'c3'}, now)
    for (let i = 0; i < 5 && s.run_state === 'WaitingForMembers'; i++) s = tick(s, (now += S))
    assert.equal(s.run_state, 'Warmup')
    assert.deepEqual(
      s.epoch.clients.map((c) => c.id),
      ['c0', 'c1', 'c3'],
    )
  })

  it('waits the extra time after entering the phase, so more clients can join', () => {
    let s = joinAll(newRun({waiting_for_members_extra_time: 3}), ids(3), 0)
    s = tick(s, 2 * S)
    assert.equal(s.run_state, 'WaitingForMembers')
    s = tick(s, 3 * S)
    assert.equal(s.run_state, 'Warmup')
    assert.equal(s.run_state_start, 3 * S)
  })

  it('never transitions in the second the phase began', () => {
    const s = tick(joinAll(newRun({waiting_for_members_extra_time: 0}), ids(3), 0), 0)
    assert.equal(s.run_state, 'WaitingForMembers')
  })
})

describe('Warmup', () => {
  const warm = () => tick(joinAll(newRun(), ids(3), 0), 3 * S)

  it('→ RoundTrain when warmup_time elapses, once a client reported its model loaded', () => {
    let s = ok(warm(), {type: 'witness', from: 'c1', step: 1, proof: {participant_bloom: '', broadcast_bloom: ''}}, 4 * S)
    s = tick(s, 12 * S)
    assert.equal(s.run_state, 'Warmup')
    s = tick(s, 13 * S)
    assert.equal(s.run_state, 'RoundTrain')
    assert.equal(s.epoch.round!.step, 1)
    assert.equal(s.epoch.round!.height, 0)
  })

  it('→ WaitingForMembers when warmup_time elapses and nobody reported the model loaded: no round, the step unchanged', () => {
    let s = warm()
    s = tick(s, 13 * S)
    assert.equal(s.run_state, 'WaitingForMembers')
    assert.equal(s.progress.step, 1)
    assert.equal(s.epoch.round, null)
    assert.deepEqual(s.pending, ['c0', 'c1', 'c2'], 'its members wait for the next Warmup')
    s = tick(s, 16 * S)
    assert.equal(s.run_state, 'Warmup')
  })

  it("→ RoundTrain as soon as a round's worth of clients report the model loaded", () => {
    let s = warm()
    s = ok(s, {type: 'witness', from: 'c0', step: 1, proof: {participant_bloom: '', broadcast_bloom: ''}}, 4 * S)
    assert.equal(s.run_state, 'Warmup')
    rejected(s, {type: 'witness', from: 'c0', step: 1, proof: {participant_bloom: '', broadcast_bloom: ''}}, 4 * S, 'DuplicateWitness')
    rejected(s, {type: 'witness', from: 'stranger', step: 1, proof: {participant_bloom: '', broadcast_bloom: ''}}, 4 * S, 'InvalidWitness')
    s = ok(s, {type: 'witness', from: 'c2', step: 1, proof: {participant_bloom: '', broadcast_bloom: ''}}, 5 * S)
    assert.equal(s.run_state, 'RoundTrain') // witness_nodes = 2
  })

  it('→ WaitingForMembers when clients fall below min_clients, keeping the rest as pending', () => {
    let s = warm()
    s = ok(s, {type: 'withdraw', id: 'c0'}, 4 * S)
    s = tick(s, 5 * S)
    assert.equal(s.run_state, 'Warmup') // 2 left = min_clients
    s = ok(s, {type: 'withdraw', id: 'c1'}, 6 * S)
    s = ok(s, {type: 'join', id: 'late'}, 6 * S)
    s = tick(s, 7 * S)
    assert.equal(s.run_state, 'WaitingForMembers')
    assert.deepEqual(s.pending, ['c2', 'late'])
  })
})

describe('RoundTrain → RoundWitness', () => {
  it('on a witness quorum (opportunistic witnessing)', () => {
    let {state: s, now} = toFirstRound(ids(5), {witness_nodes: 3, min_clients: 3})
    const [w0, w1] = selectWitnesses(s)
    s = ok(s, {type: 'witness', from: w0, step: 1, proof: honestProof(s)}, now)
    assert.equal(s.run_state, 'RoundTrain') // quorum of 3 is 2
    s = ok(s, {type: 'witness', from: w1, step: 1, proof: honestProof(s)}, now + 1 * S)
    assert.equal(s.run_state, 'RoundWitness')
    assert.equal(s.run_state_start, now + 1 * S)
  })

  it('when max_round_train_time elapses without a quorum', () => {
    let {state: s, now} = toFirstRound(ids(3))
    const start = now
    ;({state: s, now} = tickUntilChange(s, now))
    assert.equal(s.run_state, 'RoundWitness')
    assert.equal(now, start + baseConfig.max_round_train_time * S)
  })

  it('rejects proofs from non-witnesses, for another step, twice, or with a bloom of the wrong size', () => {
    const {state: s, now} = toFirstRound(ids(6), {witness_nodes: 2})
    const witnesses = selectWitnesses(s)
    const outsider = s.epoch.round!.roster.find((id) => !witnesses.includes(id))!
    assert.equal(isWitness(s, outsider), false)
    rejected(s, {type: 'witness', from: outsider, step: 1, proof: honestProof(s)}, now, 'InvalidWitness')
    rejected(s, {type: 'witness', from: witnesses[0], step: 2, proof: honestProof(s)}, now, 'WrongStep')
    const tooSmall = new BloomFilter({bits: 512, hashes: 3}).toBase64()
    rejected(s, {type: 'witness', from: witnesses[0], step: 1, proof: {participant_bloom: tooSmall, broadcast_bloom: tooSmall}}, now, 'InvalidWitness')
    const once = ok(s, {type: 'witness', from: witnesses[0], step: 1, proof: honestProof(s)}, now)
    rejected(once, {type: 'witness', from: witnesses[0], step: 1, proof: honestProof(s)}, now, 'DuplicateWitness')
  })

  it('rejects proofs outside rounds', () => {
    const s = joinAll(newRun(), ids(3), 0)
    rejected(s, {type: 'witness', from: 'c0', step: 1, proof: {participant_bloom: '', broadcast_bloom: ''}}, 1 * S, 'InvalidRunState')
  })
})

describe('RoundWitness →', () => {
  it('the next RoundTrain after round_witness_time when a witness missed a result: next step, next batches, fresh seed', () => {
    let {state: s, now} = toFirstRound(ids(3))
    const missed = s.epoch.round!.roster[2]
    s = witnessAll(
      s,
      now,
      s.epoch.round!.roster.filter((id) => id !== missed),
    )
    assert.equal(s.run_state, 'RoundWitness')
    assert.equal(s.epoch.round!.complete_witnesses, 0)
    const first = s.epoch.round!
    s = tick(s, now + 1 * S)
    assert.equal(s.run_state, 'RoundWitness')
    s = tick(s, now + baseConfig.round_witness_time * S - 1)
    assert.equal(s.run_state, 'RoundWitness') // the window is measured in milliseconds, not rounded to seconds
    s = tick(s, now + baseConfig.round_witness_time * S)
    assert.equal(s.run_state, 'RoundTrain')
    const second = s.epoch.round!
    assert.equal(second.step, 2)
    assert.equal(s.progress.step, 2)
    assert.equal(second.height, 1)
    assert.equal(second.data_index, first.data_index + first.batch_size)
    assert.notEqual(second.seed, first.seed)
    assert.equal(second.started_at, now + baseConfig.round_witness_time * S)
    assert.equal(s.epoch.previous_round, first)
  })

  it('closes the witness window as soon as every witness attested every trainer (no dead time)', () => {
    let {state: s, now} = toFirstRound(ids(3))
    s = witnessAll(s, now + 250)
    assert.equal(s.run_state, 'RoundWitness')
    assert.equal(s.epoch.round!.complete_witnesses, 2)
    s = tick(s, now + 250) // the same millisecond: nothing more can arrive for this round
    assert.equal(s.run_state, 'RoundTrain')
    assert.equal(s.epoch.round!.step, 2)
    assert.equal(s.run_state_start, now + 250)
    assert.equal(s.epoch.previous_round!.witnesses.length, 2)
  })

  it('keeps the window open while one witness of several has not attested everyone', () => {
    let {state: s, now} = toFirstRound(ids(5), {witness_nodes: 3, min_clients: 3})
    const [w0, w1, w2] = selectWitnesses(s)
    const roster = s.epoch.round!.roster
    s = ok(s, {type: 'witness', from: w0, step: 1, proof: honestProof(s)}, now)
    s = ok(s, {type: 'witness', from: w1, step: 1, proof: honestProof(s)}, now)
    assert.equal(s.run_state, 'RoundWitness') // quorum of 3 is 2; the third witness may still be downloading
    s = tick(s, now + 1)
    assert.equal(s.run_state, 'RoundWitness')
    s = ok(s, {type: 'witness', from: w2, step: 1, proof: honestProof(s, roster.slice(1))}, now + 2)
    assert.equal(s.epoch.round!.complete_witnesses, 2)
    s = tick(s, now + 3)
    assert.equal(s.run_state, 'RoundWitness') // w2 missed a result: the window is waited out
    s = tick(s, now + 2 + baseConfig.round_witness_time * S)
    assert.equal(s.run_state, 'RoundTrain')
  })

  it('closes early when the last complete proof arrives in RoundWitness', () => {
    let {state: s, now} = toFirstRound(ids(5), {witness_nodes: 3, min_clients: 3})
    const [w0, w1, w2] = selectWitnesses(s)
    s = ok(s, {type: 'witness', from: w0, step: 1, proof: honestProof(s)}, now)
    s = ok(s, {type: 'witness', from: w1, step: 1, proof: honestProof(s)}, now)
    s = ok(s, {type: 'witness', from: w2, step: 1, proof: honestProof(s)}, now + 400)
    s = tick(s, now + 400)
    assert.equal(s.run_state, 'RoundTrain')
    assert.equal(s.epoch.round!.started_at, now + 400)
  })

  it('a round with fewer batches than trainers waits out its window', () => {
    // 3 trainers, 2 batches: one trainer has an empty range and sends nothing.
    let {state: s, now} = toFirstRound(ids(3), {witness_nodes: 0, global_batch_size_start: 2, global_batch_size_end: 2})
    assert.equal([...assignBatches(s)].filter(([, r]) => r.start === r.end).length, 1)
    s = witnessAll(s, now)
    assert.equal(s.epoch.round!.complete_witnesses, 0)
    s = tick(s, now + 1)
    assert.equal(s.run_state, 'RoundWitness')
    s = tick(s, now + baseConfig.round_witness_time * S)
    assert.equal(s.run_state, 'RoundTrain')
  })

  it('fractions of a second in the config are milliseconds on the clock', () => {
    let {state: s, now} = toFirstRound(ids(3), {max_round_train_time: 0.5, round_witness_time: 0.25})
    s = tick(s, now + 499)
    assert.equal(s.run_state, 'RoundTrain')
    s = tick(s, now + 500)
    assert.equal(s.run_state, 'RoundWitness') // no quorum: max_round_train_time elapsed
    s = ok(s, {type: 'witness', from: selectWitnesses(s)[0], step: 1, proof: honestProof(s)}, now + 600)
    s = tick(s, now + 749)
    assert.equal(s.run_state, 'RoundWitness')
    s = tick(s, now + 750)
    assert.equal(s.run_state, 'Cooldown') // 1 of 2 witnesses: below quorum
  })

  it('Cooldown at the end of the epoch', () => {
    let {state: s, now} = toFirstRound(ids(3), {epoch_time: 30})
    for (let i = 0; i < 50 && s.run_state !== 'Cooldown'; i++) {
      if (s.run_state === 'RoundTrain') s = witnessAll(s, now)
      s = tick(s, (now += S))
    }
    assert.equal(s.run_state, 'Cooldown')
    assert.ok(now >= s.epoch.start_time + 30 * S)
  })

  it('Cooldown after rounds_per_epoch rounds when the file sets it', () => {
    let {state: s, now} = toFirstRound(ids(3), {rounds_per_epoch: 2})
    for (let i = 0; i < 50 && s.run_state !== 'Cooldown'; i++) {
      if (s.run_state === 'RoundTrain') s = witnessAll(s, now)
      s = tick(s, (now += S))
    }
    assert.equal(s.epoch.round!.height, 1)
    assert.equal(s.progress.step, 3)
  })

  it('Cooldown when clients fall below min_clients', () => {
    let {state: s, now} = toFirstRound(ids(3))
    s = witnessAll(s, now)
    s = ok(s, {type: 'withdraw', id: 'c0'}, now)
    s = ok(s, {type: 'withdraw', id: 'c1'}, now)
    s = tick(s, now + 2 * S)
    assert.equal(s.run_state, 'Cooldown')
    assert.deepEqual(
      s.epoch.clients.map((c) => c.id),
      ['c2'],
    )
    assert.deepEqual(
      s.epoch.exited.map((c) => [c.id, c.state]),
      [
        ['c0', 'Withdrawn'],
        ['c1', 'Withdrawn'],
      ],
    )
  })

  it('Cooldown when fewer witnesses than the quorum sent proofs', () => {
    let {state: s, now} = toFirstRound(ids(6), {witness_nodes: 3})
    s = ok(s, {type: 'witness', from: selectWitnesses(s)[0], step: 1, proof: honestProof(s)}, now)
    ;({state: s, now} = tickUntilChange(s, now))
    assert.equal(s.run_state, 'RoundWitness')
    ;({state: s, now} = tickUntilChange(s, now))
    assert.equal(s.run_state, 'Cooldown')
    assert.ok(s.epoch.clients.every((c) => c.state === 'Healthy'))
  })

  it('Cooldown with everyone withdrawn when no witness sent anything', () => {
    let {state: s, now} = toFirstRound(ids(3))
    ;({state: s, now} = tickUntilChange(s, now))
    ;({state: s, now} = tickUntilChange(s, now))
    assert.equal(s.run_state, 'Cooldown')
    assert.ok(s.epoch.clients.every((c) => c.state === 'Withdrawn'))
    ;({state: s, now} = tickUntilChange(s, now))
    assert.equal(s.run_state, 'WaitingForMembers')
    assert.deepEqual(s.pending, [])
  })

  it('Cooldown on a pending pause, then Paused; resume goes back to WaitingForMembers with the same clients', () => {
    let {state: s, now} = toFirstRound(ids(3))
    s = ok(s, {type: 'pause'}, now)
    assert.equal(s.run_state, 'RoundTrain')
    assert.equal(s.pending_pause, true)
    s = witnessAll(s, now)
    ;({state: s, now} = tickUntilChange(s, now))
    assert.equal(s.run_state, 'Cooldown')
    ;({state: s, now} = tickUntilChange(s, now))
    assert.equal(s.run_state, 'Paused')
    assert.equal(s.pending_pause, false)
    assert.equal(s.epoch.cold_start, true)
    for (let i = 0; i < 30; i++) assert.equal(applyEvent(s, {type: 'tick'}, now + i * S).error?.code, 'Halted')
    rejected(s, {type: 'pause'}, now, 'Halted')
    s = ok(s, {type: 'resume'}, now + 1 * S)
    assert.equal(s.run_state, 'WaitingForMembers')
    assert.deepEqual(s.pending, ['c0', 'c1', 'c2'])
    ;({state: s, now} = tickUntilChange(s, now + 1 * S))
    assert.equal(s.run_state, 'Warmup')
    assert.equal(s.epoch.cold_start, true)
  })

  it('Finished after total_steps', () => {
    let {state: s, now} = toFirstRound(ids(3), {total_steps: 3})
    const steps: number[] = []
    for (let i = 0; i < 100 && s.run_state !== 'Finished'; i++) {
      if (s.run_state === 'RoundTrain') {
        steps.push(s.epoch.round!.step)
        s = witnessAll(s, now)
      }
      s = tick(s, (now += S))
    }
    assert.equal(s.run_state, 'Finished')
    assert.deepEqual(steps, [1, 2, 3])
    rejected(s, {type: 'join', id: 'late'}, now, 'Halted')
    rejected(s, {type: 'resume'}, now, 'CannotResume')
  })
})

describe('Cooldown → next epoch', () => {
  function toCooldown(config = {}) {
    let {state: s, now} = toFirstRound(ids(3), {epoch_time: 20, ...config})
    for (let i = 0; i < 100 && s.run_state !== 'Cooldown'; i++) {
      if (s.run_state === 'RoundTrain') s = witnessAll(s, now)
      s = tick(s, (now += S))
    }
    return {state: s, now}
  }

  it('moves the checkpoint to P2P, advances the epoch and carries healthy clients', () => {
    let {state: s, now} = toCooldown()
    const last = s.epoch.round!
    s = ok(s, {type: 'join', id: 'new'}, now)
    ;({state: s, now} = tickUntilChange(s, now))
    assert.equal(s.run_state, 'WaitingForMembers')
    assert.equal(s.progress.epoch, 1)
    assert.equal(s.progress.epoch_start_data_index, last.data_index + last.batch_size)
    assert.deepEqual(s.model.LLM.checkpoint, {P2P: {repo_id: 'org/model'}})
    assert.deepEqual(s.pending, ['c0', 'c1', 'c2', 'new'])
    ;({state: s, now} = tickUntilChange(s, now))
    ;({state: s, now} = tickUntilChange(s, now))
    assert.equal(s.run_state, 'RoundTrain')
    assert.equal(s.epoch.round!.data_index, last.data_index + last.batch_size)
    assert.equal(s.epoch.round!.height, 0)
  })

  it('ends early once a checkpoint is reported, which becomes the fallback for a run nobody returns to', () => {
    let {state: s, now} = toCooldown({cooldown_time: 50})
    rejected(s, {type: 'checkpoint', from: 'stranger', repo: {repo_id: 'org/ckpt'}}, now, 'UnknownClient')
    s = attestParams(s, now)
    s = ok(s, {type: 'checkpoint', from: 'c1', repo: {repo_id: 'org/ckpt', revision: 'abc'}, param_hash: PARAMS}, now)
    rejected(s, {type: 'checkpoint', from: 'c2', repo: {repo_id: 'org/other'}}, now, 'AlreadyCheckpointed')
    s = tick(s, now + 1 * S)
    assert.equal(s.run_state, 'WaitingForMembers')
    assert.deepEqual(s.model.LLM.checkpoint, {P2P: {repo_id: 'org/ckpt', revision: 'abc'}})
    // Every previous client leaves; newcomers must load the uploaded checkpoint, not ask absent peers.
    for (const id of ['c0', 'c1', 'c2']) s = ok(s, {type: 'withdraw', id}, now + 1 * S)
    s = joinAll(s, ids(3, 'n'), now + 1 * S)
    ;({state: s, now} = tickUntilChange(s, now + 1 * S))
    assert.equal(s.run_state, 'Warmup')
    assert.deepEqual(s.model.LLM.checkpoint, {Hub: {repo_id: 'org/ckpt', revision: 'abc'}})
  })

  for (const start of [{Dummy: {repo_id: 'org/dummy'}}, {Local: {path: 'model'}}] as const) {
    it(`a checkpoint reported in a run that started from ${Object.keys(start)[0]} becomes its Hub fallback too`, () => {
      let {state: s, now} = toFirstRound(ids(3), {epoch_time: 20, cooldown_time: 50}, {checkpoint: start as never})
      for (let i = 0; i < 100 && s.run_state !== 'Cooldown'; i++) {
        if (s.run_state === 'RoundTrain') s = witnessAll(s, now)
        s = tick(s, (now += S))
      }
      s = attestParams(s, now)
      s = ok(s, {type: 'checkpoint', from: 'c1', repo: {repo_id: 'org/ckpt', revision: 'abc'}, param_hash: PARAMS}, now)
      assert.deepEqual(s.model.LLM.checkpoint, {Hub: {repo_id: 'org/ckpt', revision: 'abc'}})
      s = tick(s, now + 1 * S)
      assert.deepEqual(s.model.LLM.checkpoint, {P2P: {repo_id: 'org/ckpt', revision: 'abc'}})
      for (const id of ['c0', 'c1', 'c2']) s = ok(s, {type: 'withdraw', id}, now + 1 * S)
      s = joinAll(s, ids(3, 'n'), now + 1 * S)
      ;({state: s, now} = tickUntilChange(s, now + 1 * S))
      assert.equal(s.run_state, 'Warmup')
      assert.deepEqual(s.model.LLM.checkpoint, {Hub: {repo_id: 'org/ckpt', revision: 'abc'}}, 'newcomers load the uploaded checkpoint, not the starting point')
    })
  }

  it('accepts checkpoints only in Cooldown while no epoch recorded the run’s model', () => {
    const {state: s, now} = toFirstRound(ids(3))
    rejected(s, {type: 'checkpoint', from: 'c0', repo: {repo_id: 'x/y'}}, now, 'InvalidRunState')
  })
})

describe("the run's current model", () => {
  const OTHER = 'b2'.repeat(32)
  /** Epoch 0 (steps 1-3) trained, its last round's witnesses attest `hash` in Cooldown (none: no agreement), and the epoch ends. */
  function epochEnded(config = {}, hash: string | null = PARAMS) {
    let {state: s, now} = toFirstRound(ids(3), {epoch_time: 1000, rounds_per_epoch: 3, cooldown_time: 5, ...config}, {checkpoint: {Local: {path: 'model'}}})
    for (let i = 0; i < 100 && s.run_state !== 'Cooldown'; i++) {
      if (s.run_state === 'RoundTrain') s = witnessAll(s, now)
      s = tick(s, (now += S))
    }
    if (hash) s = attestParams(s, now, hash)
    ;({state: s, now} = tickUntilChange(s, now))
    assert.equal(s.run_state, 'WaitingForMembers')
    return {state: s, now}
  }

  it('is recorded at every epoch’s end: the last round’s step and the hash its witnesses agreed on (null without a quorum)', () => {
    assert.equal(newRun().current_model, null)
    assert.deepEqual(epochEnded().state.current_model, {step: 3, param_hash: PARAMS})
    assert.deepEqual(epochEnded({}, null).state.current_model, {step: 3, param_hash: null})
  })

  it('an epoch whose only round no witness attested keeps the model it began with (its hash, at the new step)', () => {
    let {state: s, now} = epochEnded()
    ;({state: s, now} = tickUntilChange(s, now)) // Warmup (a client reports its model loaded)
    ;({state: s, now} = tickUntilChange(s, now)) // RoundTrain: nobody trains or witnesses
    for (let i = 0; i < 100 && s.run_state !== 'WaitingForMembers'; i++) s = tick(s, (now += S))
    assert.deepEqual(s.current_model, {step: 4, param_hash: PARAMS})
  })

  it('a run whose members all left never falls back to the config’s starting checkpoint: it waits, its step unchanged', () => {
    let {state: s, now} = epochEnded()
    for (const id of ['c0', 'c1', 'c2']) s = ok(s, {type: 'withdraw', id}, now)
    s = joinAll(s, ['n0'], now)
    s = {...s, config: {...s.config, init_min_clients: 1, min_clients: 1}}
    assert.match(modelWanted(s)!.detail, /^no member holds step 3 \(the run's model, parameter hash a1a1a1a1a1a1…\): every member that held it has left/)
    ;({state: s, now} = tickUntilChange(s, now))
    assert.equal(s.run_state, 'Warmup')
    assert.deepEqual(s.model.LLM.checkpoint, {P2P: {repo_id: ''}}, 'not the Local starting checkpoint: the member asks its peers')
    assert.deepEqual(s.checkpoint_fallback, {Local: {path: 'model'}}, 'the starting checkpoint stays the fallback, unused')
    // nobody can load the model: the Warmup ends without a round
    for (let i = 0; i < 100 && s.run_state === 'Warmup'; i++) s = tick(s, (now += S))
    assert.equal(s.run_state, 'WaitingForMembers')
    assert.equal(s.progress.step, 4)
    assert.deepEqual(s.current_model, {step: 3, param_hash: PARAMS})
    assert.match(modelWanted(s)!.detail, /no member holds step 3 .*the last Warmup ended with none of its members loaded/)
  })

  it('a designated checkpointer’s upload of it, reported after its Cooldown, is taken, and the waiting run resumes from it', () => {
    let {state: s, now} = epochEnded({checkpointers: ['c1']})
    for (const id of ['c0', 'c1', 'c2']) s = ok(s, {type: 'withdraw', id}, now)
    s = {...joinAll(s, ['n0'], now), config: {...s.config, init_min_clients: 1, min_clients: 1}}
    const late = {type: 'checkpoint', from: 'c1', repo: {repo_id: 'org/late', revision: 'r1'}, param_hash: PARAMS} as const
    rejected(s, {...late, from: 'c0'}, now, 'NotCheckpointer')
    rejected(s, {...late, param_hash: OTHER}, now, 'CheckpointHashMismatch')
    s = ok(s, late, now)
    rejected(s, late, now, 'AlreadyCheckpointed')
    assert.deepEqual(s.checkpoint_hash, {repo: {repo_id: 'org/late', revision: 'r1'}, step: 3, param_hash: PARAMS})
    assert.deepEqual(s.model.LLM.checkpoint, {P2P: {repo_id: 'org/late', revision: 'r1'}})
    assert.equal(modelWanted(s), undefined)
    ;({state: s, now} = tickUntilChange(s, now))
    assert.equal(s.run_state, 'Warmup')
    assert.deepEqual(s.model.LLM.checkpoint, {Hub: {repo_id: 'org/late', revision: 'r1'}}, 'the newcomer loads the upload of the run’s model')
    assert.equal(s.epoch.checkpointed, false, 'a late checkpoint ends no Cooldown')
  })

  it('without designated checkpointers a late checkpoint comes from a member of the recorded epoch; none is taken without an agreed hash', () => {
    const {state: s, now} = epochEnded()
    rejected(s, {type: 'checkpoint', from: 'stranger', repo: {repo_id: 'org/x'}, param_hash: PARAMS}, now, 'UnknownClient')
    ok(s, {type: 'checkpoint', from: 'c2', repo: {repo_id: 'org/x'}, param_hash: PARAMS}, now)
    const unagreed = epochEnded({}, null)
    rejected(unagreed.state, {type: 'checkpoint', from: 'c2', repo: {repo_id: 'org/x'}, param_hash: PARAMS}, unagreed.now, 'InvalidRunState')
  })

  it('a Hub fallback of an older model is not named: only the checkpoint recorded with the current hash', () => {
    let {state: s, now} = epochEnded()
    // a checkpoint of another model than the run's (an earlier epoch's, say)
    s = {...s, checkpoint_fallback: {Hub: {repo_id: 'org/old'}}, checkpoint_hash: {repo: {repo_id: 'org/old'}, step: 1, param_hash: OTHER}}
    for (const id of ['c0', 'c1', 'c2']) s = ok(s, {type: 'withdraw', id}, now)
    s = {...joinAll(s, ['n0'], now), config: {...s.config, init_min_clients: 1, min_clients: 1}}
    ;({state: s, now} = tickUntilChange(s, now))
    assert.equal(s.run_state, 'Warmup')
    assert.ok(isCheckpointP2P(s.model.LLM.checkpoint), JSON.stringify(s.model.LLM.checkpoint))
  })

  it('a loaded model is checked against it: the recorded hash, or the recorded step when no quorum agreed', () => {
    const {state: s} = epochEnded()
    assert.equal(modelMismatch(s, PARAMS, 1), undefined, 'the hash decides (a round nobody trained leaves it as it was)')
    assert.match(modelMismatch(s, OTHER, 3)!, /hash to b2b2.*the run's model \(step 3\) to a1a1/)
    const unagreed = epochEnded({}, null).state
    assert.equal(modelMismatch(unagreed, OTHER, 3), undefined)
    assert.match(modelMismatch(unagreed, OTHER, 0)!, /model at step 0, the run's model is at step 3/)
    assert.equal(modelMismatch(newRun(), OTHER, undefined), undefined, 'before any epoch ended, the starting checkpoint is the model')
  })
})

describe('health checks', () => {
  /** Round 1 where the witnesses saw everyone but `missing`, then round 2 under way. */
  function secondRound(missing: string) {
    let {state: s, now} = toFirstRound(ids(4), {witness_nodes: 3, min_clients: 2})
    s = witnessAll(
      s,
      now,
      s.epoch.round!.roster.filter((id) => id !== missing),
    )
    ;({state: s, now} = tickUntilChange(s, now))
    assert.equal(s.run_state, 'RoundTrain')
    return {state: s, now}
  }

  it('are rejected before a round has finished', () => {
    const {state: s, now} = toFirstRound(ids(3))
    rejected(s, {type: 'health_check', from: 'c0', accused: ['c1']}, now, 'NoActiveRound')
  })

  it('the closing round drops a trainer too few witnesses saw (it leaves at the round’s end); a health check naming it is still taken', () => {
    let {state: s, now} = secondRound('c3')
    assert.ok(!s.epoch.round!.roster.includes('c3'), 'c3 left when the round it missed closed')
    assert.deepEqual(
      s.epoch.exited.map((c) => [c.id, c.state, c.exited_height]),
      [['c3', 'Dropped', 0]],
    )
    // Psyche's health check judges the previous round: it names c3 rightly, and changes nothing now.
    const after = ok(s, {type: 'health_check', from: 'c0', accused: ['c3']}, now)
    assert.deepEqual(after.epoch.clients, s.epoch.clients)
  })

  it('a round that times out still judges its trainers: an idle member of an epoch that fits one round is dropped at its end', () => {
    // epoch_time 15 and 10 s rounds: each epoch is one round that times out, and no next round's witness judges it
    let {state: s, now} = toFirstRound(ids(3), {epoch_time: 15, max_round_train_time: 10, witness_nodes: 0, min_clients: 1, init_min_clients: 1})
    const idle = 'c1'
    s = tick(s, (now += 10 * S))
    assert.equal(s.run_state, 'RoundWitness')
    s = witnessAll(s, now, ['c0', 'c2'])
    s = tick(s, (now += 2 * S))
    assert.equal(s.run_state, 'Cooldown', 'the epoch’s time is up after one round')
    assert.deepEqual(
      s.epoch.exited.map((c) => [c.id, c.state]),
      [[idle, 'Dropped']],
    )
    ;({state: s, now} = tickUntilChange(s, now))
    assert.equal(s.run_state, 'WaitingForMembers')
    assert.deepEqual(s.pending, ['c0', 'c2'], 'the idle member is not carried into the next epoch')
  })

  it('a round without a witness quorum judges nobody', () => {
    let {state: s, now} = toFirstRound(ids(4), {witness_nodes: 3, min_clients: 2})
    const [w0] = selectWitnesses(s)
    s = ok(s, {type: 'witness', from: w0, step: 1, proof: honestProof(s, [w0])}, now)
    s = tick(s, (now += 10 * S))
    s = tick(s, (now += 2 * S))
    assert.equal(s.run_state, 'Cooldown')
    assert.ok(s.epoch.clients.every((c) => c.state === 'Healthy'))
    assert.deepEqual(s.epoch.exited, [])
  })

  it('accusing a healthy client is rejected, and nobody is dropped', () => {
    const {state: s, now} = secondRound('c3')
    const message = rejected(s, {type: 'health_check', from: 'c0', accused: ['c3', 'c1']}, now, 'InvalidHealthCheck')
    assert.match(message, /c1 is healthy/)
  })

  it('reject unknown reporters and accused', () => {
    const {state: s, now} = secondRound('c3')
    rejected(s, {type: 'health_check', from: 'stranger', accused: ['c3']}, now, 'InvalidHealthCheck')
    rejected(s, {type: 'health_check', from: 'c0', accused: ['stranger']}, now, 'InvalidHealthCheck')
  })
})

describe('joining, withdrawing, ejecting', () => {
  it('a duplicate join is rejected; a join during an epoch waits for the next', () => {
    let {state: s, now} = toFirstRound(ids(3))
    rejected(s, {type: 'join', id: 'c0'}, now, 'AlreadyJoined')
    s = ok(s, {type: 'join', id: 'late'}, now)
    rejected(s, {type: 'join', id: 'late'}, now, 'AlreadyJoined')
    assert.deepEqual(s.pending, ['late'])
    assert.ok(!s.epoch.round!.roster.includes('late'))
  })

  it('withdrawing an unknown client is rejected', () => {
    rejected(newRun(), {type: 'withdraw', id: 'ghost'}, 0, 'InvalidWithdraw')
    rejected(newRun(), {type: 'join', id: ''}, 0, 'InvalidEvent')
  })

  it("an ejected client leaves at the round's end", () => {
    let {state: s, now} = toFirstRound(ids(3))
    s = ok(s, {type: 'eject', id: 'c1'}, now)
    s = witnessAll(s, now)
    ;({state: s, now} = tickUntilChange(s, now))
    ;({state: s, now} = tickUntilChange(s, now))
    assert.deepEqual(
      s.epoch.exited.map((c) => [c.id, c.state]),
      [['c1', 'Ejected']],
    )
  })
})

describe('pause, resume and config updates', () => {
  it('pausing while waiting pauses at once; a paused run accepts a valid config update', () => {
    let s = joinAll(newRun(), ids(2), 0)
    rejected(s, {type: 'config_update', config: {...baseConfig, total_steps: 5}}, 0, 'InvalidRunState')
    s = ok(s, {type: 'pause'}, 1 * S)
    assert.equal(s.run_state, 'Paused')
    s = ok(s, {type: 'config_update', config: {...baseConfig, total_steps: 5}}, 2 * S)
    assert.equal(s.config.total_steps, 5)
    const message = rejected(s, {type: 'config_update', config: {...baseConfig, min_clients: 0}}, 2 * S, 'InvalidConfig')
    assert.match(message, /config\.min_clients = 0: must be ≥ 1/)
    s = ok(s, {type: 'resume'}, 3 * S)
    assert.equal(s.run_state, 'WaitingForMembers')
    rejected(s, {type: 'resume'}, 3 * S, 'CannotResume')
  })

  it('an Uninitialized run (update-config file) starts on resume', async () => {
    const file = await loadRunConfigFile('test/fixtures/psyche-configs/solana-test/nano-config.toml')
    let s = createCoordinator(file)
    assert.equal(s.run_state, 'Uninitialized')
    rejected(s, {type: 'tick'}, 1 * S, 'Halted')
    s = ok(s, {type: 'resume'}, 1 * S)
    assert.equal(s.run_state, 'WaitingForMembers')
  })
})

describe('batch sizes', () => {
  it('ramp linearly from start to end over the warmup tokens, round after round', () => {
    // 16 tokens per batch; ramp from 4 to 12 batches over 400 tokens.
    let {state: s, now} = toFirstRound(ids(3), {
      global_batch_size_start: 4,
      global_batch_size_end: 12,
      global_batch_size_warmup_tokens: 400,
      init_min_clients: 3,
      epoch_time: 10_000,
    })
    const sizes: number[] = []
    for (let i = 0; i < 400 && sizes.length < 8; i++) {
      if (s.run_state === 'RoundTrain') {
        if (sizes.length === 0 || s.epoch.round!.step > sizes.length) sizes.push(batchSizeForStep(s))
        s = witnessAll(s, now)
      }
      s = tick(s, (now += S))
    }
    // data index 0 → 4, 4 → round(4 + 8·64/400) = 5, 9 → 7, 16 → 9, 25 → 12 (≥ 400 tokens) ...
    assert.deepEqual(sizes, [4, 5, 7, 9, 12, 12, 12, 12])
  })
})

describe(`MAX_CLIENTS = ${MAX_CLIENTS} clients (the layout table's capacity, as on Solana)`, () => {
  it('start an epoch, get a partition of the batch and 32 automatic witnesses; one more joiner is refused', () => {
    const n = MAX_CLIENTS
    const {state: s} = toFirstRound(ids(n), {init_min_clients: 100, min_clients: 100, witness_nodes: 0, global_batch_size_start: 2 * n, global_batch_size_end: 2 * n})
    assert.equal(s.epoch.round!.roster.length, n)
    const ranges = [...assignBatches(s).values()].sort((a, b) => a.start - b.start)
    assert.equal(ranges[0].start, 0)
    for (let i = 1; i < n; i++) assert.equal(ranges[i].start, ranges[i - 1].end)
    assert.equal(ranges[n - 1].end, 2 * n)
    assert.ok(ranges.every((r) => r.end - r.start === 2))
    const witnesses = selectWitnesses(s)
    assert.equal(witnesses.length, 32)
    assert.equal(new Set(witnesses).size, 32)
    assert.ok(witnesses.every((w) => isWitness(s, w)))
    assert.equal(witnessBloomParams(s.config, s.epoch.round!).bits >= n * 9, true)
    // every healthy client is carried into the next epoch: a newcomer would make MAX_CLIENTS + 1
    const extra = 'ff'.repeat(32)
    const full = applyEvent(s, {type: 'join', id: extra}, 0)
    assert.equal(full.error?.code, 'CapacityExceeded')
    // one client leaves: its place is free for the newcomer, then the run is full again
    const left = applyEvent(s, {type: 'withdraw', id: s.epoch.round!.roster[0]}, 0)
    assert.equal(left.error, undefined)
    const joined = applyEvent(left.state, {type: 'join', id: extra}, 0)
    assert.equal(joined.error, undefined)
    assert.equal(applyEvent(joined.state, {type: 'join', id: 'fe'.repeat(32)}, 0).error?.code, 'CapacityExceeded')
  })
})

it('baseLLM stays valid (guards the helpers)', async () => {
  const {validateRunConfig} = await import('../../src/core/config/index.js')
  assert.ok('config' in validateRunConfig(baseConfig, {LLM: baseLLM}))
})
