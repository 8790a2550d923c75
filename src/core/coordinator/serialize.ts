import {RUN_STATES} from '../layout/layout-table.js'
import {EPOCH_PHASES} from './phases.js'
import type {CoordinatorState, ModelRecord, Round} from './types.js'

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
  }) as CoordinatorState | (Omit<CoordinatorState, 'version'> & {version: 1})
  if (state?.version === 1) return checked(migrateFromSeconds(state))
  if (state?.version !== 2) throw new RangeError(`coordinator state: version ${JSON.stringify((state as {version?: unknown} | null)?.version)}: expected 1 or 2`)
  return checked(state)
}

/**
 * Version 1 kept unix seconds; version 2 keeps unix milliseconds (and counts complete witness proofs).
 * A saved v1 state resumes as the same instants in milliseconds; its rounds start with no complete witness
 * counted, so a round in progress at the upgrade simply waits out its witness window as before.
 */
function migrateFromSeconds(v1: Omit<CoordinatorState, 'version'>): CoordinatorState {
  const round = (r: Round | null): Round | null => (r && typeof r === 'object' ? {...r, started_at: r.started_at * 1000, complete_witnesses: 0} : r)
  const epoch =
    v1.epoch && typeof v1.epoch === 'object'
      ? {...v1.epoch, start_time: v1.epoch.start_time * 1000, round: round(v1.epoch.round), previous_round: round(v1.epoch.previous_round)}
      : v1.epoch
  return {...v1, version: 2, run_state_start: v1.run_state_start * 1000, epoch}
}

function savedModel(state: CoordinatorState): ModelRecord | null {
  // In an epoch (Cooldown included), the model it began with; after it, the model its last round left.
  const step = EPOCH_PHASES.has(state.run_state) ? state.epoch.start_step - 1 : state.progress.step - 1
  if (step < 1 || state.progress.epoch === 0) return null
  const recorded = state.checkpoint_hash
  return {step, param_hash: recorded && recorded.step === step ? recorded.param_hash : null}
}

function checked(state: CoordinatorState): CoordinatorState {
  if (!RUN_STATES.includes(state.run_state)) throw new RangeError(`coordinator state: run_state ${JSON.stringify(state.run_state)}: expected one of ${RUN_STATES.join(', ')}`)
  if (!Array.isArray(state.epoch?.clients) || !Array.isArray(state.pending)) throw new RangeError('coordinator state: epoch.clients and pending must be arrays')
  // States saved before checkpoints carried the witnesses' parameter hash: none recorded then.
  state.checkpoint_hash ??= null
  // States saved before the coordinator recorded the run's model at every epoch's end: the checkpoint recorded with its
  // hash if it is at the epoch's step, else the step alone (no hash: a joiner checks the step its source claims).
  if (state.current_model === undefined) state.current_model = savedModel(state)
  state.epoch.hash_witnesses ??= []
  // States saved before rounds recorded accusations and exclusions: none then.
  for (const r of [state.epoch.round, state.epoch.previous_round]) {
    if (r && typeof r === 'object') {
      r.accusations ??= []
      r.excluded ??= []
    }
  }
  return state
}
