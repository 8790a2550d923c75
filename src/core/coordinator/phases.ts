import type {CheckpointConfig, HubRepo, RunState} from '../config/types.js'

/**
 * The run's phases, grouped once: the coordinator's transitions and the client's decisions both read these,
 * so "which phases are a round" cannot drift between them.
 */

/** A round is under way: trainers train, witnesses witness (witness proofs and health checks are accepted). */
const ROUND_PHASES: ReadonlySet<RunState> = new Set<RunState>(['RoundTrain', 'RoundWitness'])
/** An epoch's rounds have started: a pause waits for the epoch's end. */
export const ACTIVE_PHASES: ReadonlySet<RunState> = new Set<RunState>(['RoundTrain', 'RoundWitness', 'Cooldown'])
/** An epoch is under way, from loading the model to its last round's end: its Healthy clients are members. */
export const EPOCH_PHASES: ReadonlySet<RunState> = new Set<RunState>(['Warmup', ...ACTIVE_PHASES])
/** Nothing moves until an operator (or the end of the run) says so. */
export const HALTED_PHASES: ReadonlySet<RunState> = new Set<RunState>(['Uninitialized', 'Finished', 'Paused'])

export function isRoundPhase(state: RunState): boolean {
  return ROUND_PHASES.has(state)
}

/** The model of the run lives in its clients (joiners fetch it peer to peer), not in a checkpoint to load. */
export function isCheckpointP2P(checkpoint: CheckpointConfig): checkpoint is {P2P: HubRepo} {
  return typeof checkpoint === 'object' && 'P2P' in checkpoint
}
