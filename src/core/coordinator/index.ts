/**
 * The coordinator: the run's single source of truth, as a pure state machine both backends execute.
 *
 *   let state = createCoordinator(await loadRunConfigFile('state.toml'), {now})
 *   const {state: next, error} = applyEvent(state, {type: 'join', id}, now)   // error: rejected, state unchanged
 *   state = tick(next, now)                                                 // at most one phase transition
 *
 * Clients derive their work from the state alone: batchRangeFor / assignBatches, isWitness /
 * selectWitnesses, buildWitnessProof, isResultWitnessed.
 */
export * from './types.js'
export {applyEvent, clockEntropy, createCoordinator, tick, type CreateOptions} from './machine.js'
export {
  MAX_AUTO_WITNESSES,
  assignBatches,
  batchRangeFor,
  batchSizeForStep,
  broadcastKey,
  buildWitnessProof,
  checkpointRefusal,
  globalBatchSize,
  isResultWitnessed,
  isTrainerHealthy,
  isVerifier,
  isWitness,
  nextDataIndex,
  participantKey,
  rangeForPosition,
  selectVerifiers,
  selectWitnesses,
  trainerHealthScore,
  verifierCount,
  witnessBloomParams,
  witnessCount,
  witnessQuorum,
  wasEjected,
  type BatchRange,
} from './rules.js'
export {ACTIVE_PHASES, EPOCH_PHASES, HALTED_PHASES, ROUND_PHASES, isCheckpointP2P, isRoundPhase} from './phases.js'
export {SHUFFLE_ROUNDS, shuffleAll, shuffledIndex, unshuffledIndex} from '../primitives/shuffle.js'
export {sha256} from '../primitives/seed.js'
export {deserializeState, serializeState} from './serialize.js'
