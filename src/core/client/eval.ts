import {roundBatchSize, type CoordinatorState} from '../coordinator/index.js'

/**
 * Validation loss: which held-out samples a client evaluates, and after which rounds. Pure rules, so that every
 * client of a run evaluates the same samples after the same steps, and (replicas being bit-identical) reports the
 * same validation loss.
 *
 * The held-out set is a separate split when the client has one (`join --eval-data`, or the demo corpus's
 * validation split): its first `batches` samples, in the run's shuffled order. Without one it is the tail of the
 * training data, the last `batches` samples, which the run must never reach: the coordinator hands out batch ids
 * in order from 0, so a run of total_steps rounds trains on ids below dataIndexAfter(...) and nothing else.
 */

export interface EvalSettings {
  /** Evaluate after every `every`-th step (step % every === 0) and after the run's last step; 0: never. */
  every: number
  /** Held-out samples (sequences) per evaluation. */
  batches: number
}

/** The first batch id the run never trains on: the sum of the batch sizes of its total_steps rounds. */
export function dataIndexAfter(state: Pick<CoordinatorState, 'config' | 'model'>, steps = state.config.total_steps): number {
  let index = 0
  for (let step = 1; step <= steps; step++) index += roundBatchSize(state, index)
  return index
}

/** The held-out sample ids, or why there are none. `split`: the number of samples of a separate held-out split, if any. */
export function heldOutIds(
  state: Pick<CoordinatorState, 'config' | 'model'>,
  settings: EvalSettings,
  data: {trainSamples: number | undefined; split?: number | undefined; hasSplit: boolean},
): {ids: number[]; source: 'split' | 'tail'} | {reason: string} {
  const n = settings.batches
  if (data.hasSplit) {
    if (data.split === undefined) return {ids: Array.from({length: n}, (_, i) => i), source: 'split'}
    if (data.split === 0) return {reason: "the held-out split has no sample of the run's sequence length"}
    return {ids: Array.from({length: Math.min(n, data.split)}, (_, i) => i), source: 'split'}
  }
  const total = data.trainSamples
  if (total === undefined) return {reason: 'the training data does not say how many samples it has, so no tail of it is known to be held out (pass --eval-data)'}
  const trained = dataIndexAfter(state)
  if (total - n < trained)
    return {
      reason: `the run trains on ${trained} samples and the data has ${total}: no ${n} samples are left over to hold out (pass --eval-data, or fewer --eval-batches)`,
    }
  return {ids: Array.from({length: n}, (_, i) => total - n + i), source: 'tail'}
}

/** Whether a client evaluates after applying `step`. */
export function evalDue(step: number, settings: EvalSettings, totalSteps: number): boolean {
  if (settings.every <= 0 || settings.batches <= 0) return false
  return step % settings.every === 0 || step === totalSteps
}
