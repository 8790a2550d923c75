import assert from 'node:assert/strict'
import {describe, it} from 'node:test'
import {deserializeState, serializeState, type CoordinatorState} from '../../src/core/coordinator/index.js'
import {toFirstRound, witnessAll} from './helpers.js'

describe('serializeState / deserializeState', () => {
  it('round-trips a state in the middle of a round, proofs included', () => {
    const {state, now} = toFirstRound(['a', 'b', 'c'])
    const withProofs = witnessAll(state, now)
    assert.ok(withProofs.epoch.round!.witnesses.length > 0)
    assert.deepStrictEqual(deserializeState(serializeState(withProofs)), withProofs)
  })

  it('keeps bigints exact (u64 fields a backend may add)', () => {
    const {state} = toFirstRound(['a', 'b', 'c'])
    const big = {...state, extra: 2n ** 64n - 1n} as CoordinatorState & {extra: bigint}
    const text = serializeState(big)
    assert.ok(text.includes('{"$bigint":"18446744073709551615"}'))
    assert.equal((deserializeState(text) as typeof big).extra, 2n ** 64n - 1n)
  })

  it('refuses text that is not a coordinator state, naming what is wrong', () => {
    assert.throws(() => deserializeState('{"version": 2}'), /version 2: expected 1/)
    const {state} = toFirstRound(['a', 'b', 'c'])
    assert.throws(() => deserializeState(serializeState({...state, run_state: 'Sleeping' as never})), /run_state "Sleeping"/)
  })
})
