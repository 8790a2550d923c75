import {subSeed} from '../primitives/seed.js'
import type {ClientId, Round} from '../coordinator/types.js'

/**
 * τemplar-style scoring of a peer's result (seed 003): the loss on the peer's assigned batch before and after
 * applying that result alone at the run's learning rate, compared with the same on a random batch. Honest
 * work lowers the loss on the data it was computed from more than on other data; a negated, random or
 * wrong-batch result does not. Scores are kept as moving averages per peer; a peer whose average stays below
 * the threshold over a window is accused (reason 'low_score'), and a quorum of the verifiers assigned to score
 * it (coordinator/rules.ts isScoreAssigned) ejects it (coordinator/machine.ts onAccuse).
 *
 * Thresholds are set from measured honest distributions (bench/README.md, "Verification").
 */

export interface Losses {
  /** Loss on the peer's assigned batches at the committed parameters, and after its result alone. */
  assigned: {before: number; after: number}
  /** The same on a batch nobody trained on this round. */
  random: {before: number; after: number}
}

interface ScoreSettings {
  /** Weight of a new score in the moving average. */
  alpha: number
  /** A peer whose moving average is below this (with at least `window` scores) is accused. */
  threshold: number
  window: number
}

/**
 * From the honest distributions in bench/README.md (Verification): honest scores stayed above 0.2 there, results
 * trained on other batches near 0.05 and below; the threshold sits at half the lowest honest score.
 */
export const DEFAULT_SCORE_SETTINGS: ScoreSettings = {alpha: 0.5, threshold: 0.1, window: 2}

/**
 * One result's score: the improvement on its own batches beyond the improvement on a random batch, relative to
 * the size of the step (so it does not scale with the learning rate or the loss level). Only a gain on the
 * random batch counts in the result's favour: honest work lowers the loss on the batches it came from.
 *
 * The step's size is the larger of the result's own (|gain own| + |gain random|) and `roundScale`, the median of
 * that size over the round's scored results (scale()): a result that barely moves the loss (a random one) then
 * scores about 0 instead of noise amplified to ±1, and one attacker cannot shrink the others' scores (a median).
 */
export function scoreOf(l: Losses, roundScale = 0): number {
  const gainAssigned = l.assigned.before - l.assigned.after
  const gainRandom = l.random.before - l.random.after
  const size = Math.max(Math.abs(gainAssigned) + Math.abs(gainRandom), roundScale) + 1e-9
  return (gainAssigned - Math.max(gainRandom, 0)) / size
}

/** The median step size (|gain own| + |gain random|) over a round's scored results: scoreOf's roundScale. */
export function roundScale(all: readonly Losses[]): number {
  if (all.length === 0) return 0
  const sizes = all.map((l) => Math.abs(l.assigned.before - l.assigned.after) + Math.abs(l.random.before - l.random.after)).sort((a, b) => a - b)
  const mid = sizes.length >> 1
  return sizes.length % 2 ? sizes[mid] : (sizes[mid - 1] + sizes[mid]) / 2
}

interface PeerScore {
  client_id: ClientId
  /** Number of results scored. */
  count: number
  /** Moving average of the scores. */
  average: number
  last: number
}

export class Scorer {
  private readonly peers = new Map<ClientId, PeerScore>()

  constructor(readonly settings: ScoreSettings = DEFAULT_SCORE_SETTINGS) {}

  add(id: ClientId, score: number): PeerScore {
    const prev = this.peers.get(id)
    const next: PeerScore = prev
      ? {client_id: id, count: prev.count + 1, average: (1 - this.settings.alpha) * prev.average + this.settings.alpha * score, last: score}
      : {client_id: id, count: 1, average: score, last: score}
    this.peers.set(id, next)
    return next
  }

  get(id: ClientId): PeerScore | undefined {
    return this.peers.get(id)
  }

  /** Peers whose average stays below the threshold over the window. */
  lowScorers(): ClientId[] {
    const {threshold, window} = this.settings
    return [...this.peers.values()].filter((p) => p.count >= window && p.average < threshold).map((p) => p.client_id)
  }

  all(): PeerScore[] {
    return [...this.peers.values()]
  }
}

/**
 * The random batch a verifier compares with for `round`: `size` batch ids right after the round's own batches
 * (nobody trained on them this round), offset by the round seed so every round uses other data.
 */
export function randomBatchIds(round: Pick<Round, 'seed' | 'data_index' | 'batch_size'>, size: number): number[] {
  const offset = subSeed(round.seed, 'verify/random').readUInt32LE(0) % 1024
  const start = round.data_index + round.batch_size + offset
  return Array.from({length: size}, (_, i) => start + i)
}
