import {modelWanted, roundTrainers, witnessCount, witnessQuorum} from '../coordinator/index.js'
import type {CoordinatorState} from '../coordinator/types.js'
import type {SaveStatus} from '../protocol/messages.js'

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
  /** Seconds until the epoch's time is up (epoch_time from its start), during Warmup and rounds; else null. */
  epoch_time_left_seconds: number | null
  clients: {id: string; state: string}[]
  clients_by_state: {healthy: number; dropped: number; withdrawn: number; ejected: number; pending: number}
  round: {step: number; height: number; batch_size: number; trainers: number; members: number; witnesses_expected: number; witness_proofs: number; witness_quorum: number} | null
  pause_pending: boolean
  /**
   * The run cannot train for want of its model: the step and parameter hash of the run's current model that no member
   * holds, and why (rules.ts modelWanted); null otherwise.
   */
  model_wanted: {step: number; param_hash: string | null; detail: string} | null
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
    epoch_time_left_seconds: ['Warmup', 'RoundTrain', 'RoundWitness'].includes(state.run_state)
      ? Math.round(Math.max(0, coordinatorSeconds(state.epoch.start_time) + state.config.epoch_time - nowSeconds) * 10) / 10
      : null,
    clients: all.map((c) => ({id: c.id, state: c.state})),
    clients_by_state: {healthy: count('Healthy'), dropped: count('Dropped'), withdrawn: count('Withdrawn'), ejected: count('Ejected'), pending: state.pending.length},
    round: inRound
      ? {
          step: round.step,
          height: round.height,
          batch_size: round.batch_size,
          trainers: roundTrainers(state.config, round),
          members: round.roster.length,
          witnesses_expected: expected,
          witness_proofs: round.witnesses.length,
          witness_quorum: witnessQuorum(expected),
        }
      : null,
    pause_pending: state.pending_pause,
    model_wanted: modelWanted(state) ?? null,
  }
}

/**
 * The time left, for people: a round's phase limit is only a timeout (rounds usually end far sooner, when every
 * witness has attested), so during rounds this is the time left in the epoch; in Warmup and Cooldown, the phase's.
 */
export function timeLeftText(s: Pick<RunSummary, 'run_state' | 'phase_time_left_seconds' | 'epoch_time_left_seconds'>): string {
  if ((s.run_state === 'RoundTrain' || s.run_state === 'RoundWitness') && s.epoch_time_left_seconds !== null) {
    return `epoch ends in ~${Math.round(s.epoch_time_left_seconds)}s`
  }
  return s.phase_time_left_seconds === null ? '' : `${Math.round(s.phase_time_left_seconds)}s left`
}

/** What a client that is not training in the current epoch waits for, and about how long (`seconds`, null: unknown). */
interface Waiting {
  /**
   * members: the epoch waits for clients; model: for a member that holds the run's model, or a checkpoint of it;
   * next_epoch: the client joins when the current epoch ends; paused: the run is.
   */
  reason: 'members' | 'model' | 'next_epoch' | 'paused'
  detail: string
  seconds: number | null
}

const about = (s: number) => `~${Math.max(1, Math.round(s))} s`

/**
 * Why client `id` is not training now, for its own output (`psyche join`, also when piped): null while it trains in the
 * epoch, or when the run has finished. The time to the next epoch is the coordinator's upper bound (epoch_time from
 * the epoch's start, then cooldown and the wait for members): an epoch can end earlier (rounds_per_epoch, a pause).
 */
export function waitingFor(state: CoordinatorState, id: string, nowSeconds: number): Waiting | null {
  const c = state.config
  const elapsed = Math.max(0, nowSeconds - coordinatorSeconds(state.run_state_start))
  switch (state.run_state) {
    case 'Finished':
      return null
    case 'Uninitialized':
    case 'Paused':
      return {reason: 'paused', detail: 'the run is paused; it goes on when its authority resumes it', seconds: null}
    case 'WaitingForMembers': {
      const wanted = modelWanted(state)
      if (wanted) return {reason: 'model', detail: wanted.detail, seconds: null}
      const joined = state.pending.length
      if (joined < c.init_min_clients) {
        return {
          reason: 'members',
          detail: `waiting for members: ${joined} of ${c.init_min_clients} clients have joined; the epoch starts once ${c.init_min_clients} have (init_min_clients: every epoch waits for that many, the first and every later one, as in Psyche)`,
          seconds: null,
        }
      }
      const left = Math.max(0, c.waiting_for_members_extra_time - elapsed)
      return {reason: 'members', detail: `${joined} clients have joined; the epoch starts in ${about(left)}`, seconds: left}
    }
    default: {
      if (state.epoch.clients.some((m) => m.id === id && m.state === 'Healthy')) return null
      const epochEnd = coordinatorSeconds(state.epoch.start_time) + c.epoch_time
      const untilCooldown = state.run_state === 'Cooldown' ? Math.max(0, c.cooldown_time - elapsed) : Math.max(0, epochEnd - nowSeconds) + c.cooldown_time
      const left = untilCooldown + c.waiting_for_members_extra_time
      const training = state.epoch.clients.filter((m) => m.state === 'Healthy').length
      return {
        reason: 'next_epoch',
        detail: `joins at the next epoch, in ${about(left)} (epoch ${state.progress.epoch} is under way with ${training} client${training === 1 ? '' : 's'})`,
        seconds: left,
      }
    }
  }
}

/**
 * A server's failing saves as one line for people (status, the dashboard); null while its saves succeed. The state
 * the server holds past `last_saved_step` is lost if it stops now.
 */
export function saveStatusText(s: SaveStatus): string | null {
  if (s.ok) return null
  const saved = s.last_saved_step === null ? 'no state saved yet' : `the last state saved is step ${s.last_saved_step}`
  return `STATE NOT SAVED: ${s.failures_in_a_row} save${s.failures_in_a_row === 1 ? '' : 's'} failed in a row (the server halts at ${s.max_failures}); ${saved}; last error: ${s.last_error}`
}

/** A client's failed checkpoint save, as status and the client's own view show it. */
export function checkpointNotSavedText(f: {step: number; message: string}): string {
  return `CHECKPOINT NOT SAVED (step ${f.step}): ${f.message}`
}
