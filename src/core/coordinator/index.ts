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
export {applyEvent, clockEntropy, createCoordinator, tick} from './machine.js'
export {
  agreedParamHash,
  assignBatches,
  batchRangeFor,
  batchSizeForStep,
  buildWitnessProof,
  checkpointRefusal,
  globalBatchSize,
  roundBatchSize,
  isResultWitnessed,
  isTrainerHealthy,
  isVerifier,
  isWitness,
  modelMismatch,
  modelWanted,
  participantKey,
  predictNextRound,
  rangeForPosition,
  selectVerifiers,
  assignedTrainers,
  selectWitnesses,
  trainerCount,
  roundTrainers,
  verifierCount,
  witnessBloomParams,
  witnessCount,
  witnessQuorum,
  wasEjected,
  type BatchRange,
} from './rules.js'
export {EPOCH_PHASES, isCheckpointP2P, isRoundPhase} from './phases.js'
export {shuffleAll, shuffledIndex, unshuffledIndex} from '../primitives/shuffle.js'

export {deserializeState, serializeState} from './serialize.js'
