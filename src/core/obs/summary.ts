import {witnessCount, witnessQuorum} from '../coordinator/index.js'
import type {CoordinatorState} from '../coordinator/types.js'

/** One run's state, summarized for people and scripts (`psyche status --json`, the dashboard). Keys are snake_case and stable. */
export interface RunSummary {
  run_id: string
  run_state: string
  epoch: number
  step: number
  total_steps: number
  /** Steps done out of total_steps, 0..1. */
  progress: number
  /** Seconds since the phase began, and until its timeout (null: the phase has none, or waits for members). */
  phase_elapsed_seconds: number
  phase_time_left_seconds: number | null
  clients: {id: string; state: string}[]
  clients_by_state: {healthy: number; dropped: number; withdrawn: number; ejected: number; pending: number}
  round: {step: number; height: number; batch_size: number; trainers: number; witnesses_expected: number; witness_proofs: number; witness_quorum: number} | null
  pause_pending: boolean
}

/** The phase's timeout in seconds of the coordinator's config (null: none). */
function phaseLimit(state: CoordinatorState): number | null {
  const c = state.config
  switch (state.run_state) {
    case 'Warmup':
      return c.warmup_time
    case 'RoundTrain':
      return c.max_round_train_time
    case 'RoundWitness':
      return c.round_witness_time
    case 'Cooldown':
      return c.cooldown_time
    default:
      return null
  }
}

/**
 * A coordinator timestamp in seconds. The coordinator's clock is unix seconds; a clock in milliseconds (values
 * above 1e11, i.e. after 1973 in ms but year 5138 in s) is read as such, so the summary does not depend on the unit.
 */
export function coordinatorSeconds(t: number): number {
  return t > 1e11 ? t / 1000 : t
}

/** nowSeconds: the observer's idea of the coordinator's clock (the server's time in its last message, or ours). */
export function summarizeRun(state: CoordinatorState, nowSeconds: number): RunSummary {
  const all = [...state.epoch.clients, ...state.epoch.exited]
  const count = (s: string) => all.filter((c) => c.state === s).length
  const elapsed = Math.max(0, nowSeconds - coordinatorSeconds(state.run_state_start))
  const limit = phaseLimit(state)
  const round = state.epoch.round
  const inRound = round && (state.run_state === 'RoundTrain' || state.run_state === 'RoundWitness')
  const expected = inRound ? witnessCount(state.config, round.roster.length) : 0
  return {
    run_id: state.run_id,
    run_state: state.run_state,
    epoch: state.progress.epoch,
    step: state.progress.step,
    total_steps: state.config.total_steps,
    progress: state.config.total_steps > 0 ? Math.min(1, (state.progress.step - 1) / state.config.total_steps) : 0,
    phase_elapsed_seconds: Math.round(elapsed * 10) / 10,
    phase_time_left_seconds: limit === null ? null : Math.round(Math.max(0, limit - elapsed) * 10) / 10,
    clients: all.map((c) => ({id: c.id, state: c.state})),
    clients_by_state: {healthy: count('Healthy'), dropped: count('Dropped'), withdrawn: count('Withdrawn'), ejected: count('Ejected'), pending: state.pending.length},
    round: inRound
      ? {
          step: round.step,
          height: round.height,
          batch_size: round.batch_size,
          trainers: round.roster.length,
          witnesses_expected: expected,
          witness_proofs: round.witnesses.length,
          witness_quorum: witnessQuorum(expected),
        }
      : null,
    pause_pending: state.pending_pause,
  }
}
