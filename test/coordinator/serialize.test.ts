import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import {deserializeState, serializeState, type CoordinatorState} from '../../src/core/coordinator/index.js'
import {S, toFirstRound, witnessAll} from './helpers.js'

describe('serializeState / deserializeState', () => {
  it('round-trips a state in the middle of a round, proofs included', () => {
    const {state, now} = toFirstRound(['a', 'b', 'c'])
    const withProofs = witnessAll(state, now)
    assert.ok(withProofs.epoch.round!.witnesses.length > 0)
    assert.deepStrictEqual(deserializeState(serializeState(withProofs)), withProofs)
  })

  it('migrates a version 1 state (unix seconds) to milliseconds, the same instants', () => {
    const {state, now} = toFirstRound(['a', 'b', 'c'])
    const v2 = witnessAll(state, now)
    const round = v2.epoch.round!
    // What a version 1 server saved: the same state in whole seconds, without the complete-proof count.
    const {complete_witnesses: _dropped, ...v1Round} = round
    const v1 = {
      ...v2,
      version: 1,
      run_state_start: v2.run_state_start / S,
      epoch: {...v2.epoch, start_time: v2.epoch.start_time / S, round: {...v1Round, started_at: round.started_at / S}},
    }
    const migrated = deserializeState(JSON.stringify(v1))
    assert.equal(migrated.version, 2)
    assert.equal(migrated.run_state_start, v2.run_state_start)
    assert.equal(migrated.epoch.start_time, v2.epoch.start_time)
    assert.equal(migrated.epoch.round!.started_at, round.started_at)
    assert.equal(migrated.epoch.round!.complete_witnesses, 0) // not counted: this round waits out its window
    assert.deepStrictEqual(migrated.epoch.round!.witnesses, round.witnesses)
    assert.deepStrictEqual({...migrated, epoch: {...migrated.epoch, round: null}}, {...v2, epoch: {...v2.epoch, round: null}})
  })

  it('keeps bigints exact (u64 fields a backend may add)', () => {
    const {state} = toFirstRound(['a', 'b', 'c'])
    const big = {...state, extra: 2n ** 64n - 1n} as CoordinatorState & {extra: bigint}
    const text = serializeState(big)
    assert.ok(text.includes('{"$bigint":"18446744073709551615"}'))
    assert.equal((deserializeState(text) as typeof big).extra, 2n ** 64n - 1n)
  })

  it('refuses text that is not a coordinator state, naming what is wrong', () => {
    assert.throws(() => deserializeState('{"version": 3}'), /version 3: expected 1 or 2/)
    const {state} = toFirstRound(['a', 'b', 'c'])
    assert.throws(() => deserializeState(serializeState({...state, run_state: 'Sleeping' as never})), /run_state "Sleeping"/)
  })
})
