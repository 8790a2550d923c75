import {RUN_STATES} from '../config/types.js'
import type {CoordinatorState} from './types.js'

/**
 * The coordinator state as JSON. BigInts (none today, but backends may add u64 fields) are written
 * as {"$bigint": "123"} and read back exactly, never through a lossy number.
 */
export function serializeState(state: CoordinatorState): string {
  return JSON.stringify(state, (_key, value) => (typeof value === 'bigint' ? {$bigint: value.toString()} : value))
}

export function deserializeState(text: string): CoordinatorState {
  const state = JSON.parse(text, (_key, value) => {
    if (value !== null && typeof value === 'object' && !Array.isArray(value)) {
      const keys = Object.keys(value)
      if (keys.length === 1 && keys[0] === '$bigint' && typeof value.$bigint === 'string' && /^-?\d+$/.test(value.$bigint)) return BigInt(value.$bigint)
    }
    return value
  }) as CoordinatorState
  if (state?.version !== 1) throw new RangeError(`coordinator state: version ${JSON.stringify(state?.version)}: expected 1`)
  if (!RUN_STATES.includes(state.run_state)) throw new RangeError(`coordinator state: run_state ${JSON.stringify(state.run_state)}: expected one of ${RUN_STATES.join(', ')}`)
  if (!Array.isArray(state.epoch?.clients) || !Array.isArray(state.pending)) throw new RangeError('coordinator state: epoch.clients and pending must be arrays')
  // States saved before rounds recorded accusations and exclusions: none then.
  for (const r of [state.epoch.round, state.epoch.previous_round]) {
    if (r && typeof r === 'object') {
      r.accusations ??= []
      r.excluded ??= []
    }
  }
  return state
}
