import type {ClientId} from '../coordinator/types.js'
import {resultIndices, selectionChunks, type ResultFormat} from './result.js'

/**
 * Copy detection by index overlap between peers' results (τemplar's way, seed 003): a result that selects
 * nearly the same (tensor, chunk, index) positions as another producer's result of the same step is a copy,
 * even when its bytes differ (re-signed values, a flipped bit). Honest results of one step share far fewer
 * positions: each peer's top-k comes from its own batches' gradients and its own error feedback.
 *
 * The threshold is set from the measured honest overlap distribution (bench/README.md, "Verification").
 */

/**
 * A pair of results of one step sharing at least this share of their positions is a copy. Honest pairs shared
 * 0.04 to 0.16 of their positions in the bench (bench/README.md, "Verification"); a copy shares all of them. Half
 * is more than three times the largest honest overlap measured, and still catches a copy with half its chunks redone.
 */
export const COPY_OVERLAP_THRESHOLD = 0.5

/** At most about this many chunks (over all tensors, evenly spaced) are compared: bounded work and memory for any model. */
export const OVERLAP_SAMPLE_CHUNKS = 4096

/** Every how many chunks one is sampled for this run's model. */
export function sampleStride(format: ResultFormat): number {
  return Math.max(1, Math.ceil(selectionChunks(format) / OVERLAP_SAMPLE_CHUNKS))
}

/** The positions compared between results: a fixed, evenly spaced sample of chunks (the same for every result of the run). */
export function indexSample(bytes: Uint8Array, format: ResultFormat): Set<number> {
  return resultIndices(bytes, format, sampleStride(format))
}

/** The share of positions two results have in common (relative to the smaller set). */
export function indexOverlap(a: Set<number>, b: Set<number>): number {
  if (a.size === 0 || b.size === 0) return 0
  let shared = 0
  for (const x of a) if (b.has(x)) shared++
  return shared / Math.min(a.size, b.size)
}

interface NearCopy {
  /** Position in the list of the result that is dropped. */
  index: number
  client_id: ClientId
  /** The earlier result (in list order) it copies. */
  of: ClientId
  overlap: number
}

/**
 * The results of one round to drop as copies: walking the list in its (canonical) order, a result whose overlap
 * with an earlier kept result of another producer reaches the threshold. A pure function of the bytes and their
 * order, so every replica drops the same ones; the round's update counts a copied result once.
 */
export function nearCopies(results: readonly {client_id: ClientId; bytes: Uint8Array}[], format: ResultFormat, threshold = COPY_OVERLAP_THRESHOLD): NearCopy[] {
  const kept = new OverlapIndex()
  const out: NearCopy[] = []
  for (const [index, r] of results.entries()) {
    const sample = indexSample(r.bytes, format)
    const hit = kept.firstOverlap(r.client_id, sample, threshold)
    if (hit) out.push({index, client_id: r.client_id, of: hit.of, overlap: hit.overlap})
    else kept.add(r.client_id, sample)
  }
  return out
}

/**
 * The kept results of a step, indexed by position (position → the results holding it), so that comparing a new
 * result with all of them costs its own size plus the positions it really shares, not one pass over every kept
 * result's sample: a round's copy checks are then about linear in the number of results, where comparing every
 * pair was quadratic (bench/README.md, "Scale"). Exactly the same verdicts as indexOverlap against each in turn.
 */
export class OverlapIndex {
  private readonly holders = new Map<number, number[]>()
  private readonly kept: {client_id: ClientId; size: number}[] = []
  private readonly ids = new Set<ClientId>()

  get size(): number {
    return this.kept.length
  }

  has(clientId: ClientId): boolean {
    return this.ids.has(clientId)
  }

  /** The first kept result (in the order added) of another producer sharing at least `threshold` of the positions. */
  firstOverlap(clientId: ClientId, sample: Set<number>, threshold: number): {of: ClientId; overlap: number} | undefined {
    if (this.kept.length === 0) return undefined
    const shared = new Int32Array(this.kept.length)
    for (const x of sample) {
      const hs = this.holders.get(x)
      if (hs) for (const h of hs) shared[h]++
    }
    for (let i = 0; i < this.kept.length; i++) {
      const k = this.kept[i]
      if (k.client_id === clientId) continue
      const overlap = sample.size === 0 || k.size === 0 ? 0 : shared[i] / Math.min(sample.size, k.size)
      if (overlap >= threshold) return {of: k.client_id, overlap}
    }
    return undefined
  }

  add(clientId: ClientId, sample: Set<number>): void {
    const i = this.kept.length
    this.kept.push({client_id: clientId, size: sample.size})
    this.ids.add(clientId)
    for (const x of sample) {
      const hs = this.holders.get(x)
      if (hs) hs.push(i)
      else this.holders.set(x, [i])
    }
  }
}

/** The reason logged for a copy found by overlap. */
export function copyReason(of: ClientId, step: number, overlap: number): string {
  return `copy: index overlap ${overlap.toFixed(3)} with ${of}'s result for step ${step}`
}
