import type {ClientId} from '../coordinator/types.js'
import type {ResultAnnouncement} from '../primitives/announcement.js'
import {copyReason, COPY_OVERLAP_THRESHOLD, indexSample, OverlapIndex} from './copy.js'
import type {EquivocationProof} from '../coordinator/equivocation.js'
import {validateResult, validSizes, type ResultFormat} from './result.js'

/**
 * What a client checks of its peers' results before counting them anywhere (witnessing, applying): the
 * announcement (size, equivocation) and then the bytes (format against the run's model, copies, replays).
 *
 * Only the format verdict is a property of the bytes alone, the same on every replica; it is the one that
 * also drops a witnessed result at apply time (decide.ts acceptedResults). The others depend on what this
 * client saw first, so they only keep it from attesting and make it accuse; ejection needs a quorum of
 * witnesses (or, for equivocation, the proof itself).
 */

/** Prefix of a verdict that is a property of the bytes alone (decide.ts drops those at apply time too). */
export const FORMAT_INVALID = 'invalid result: '

type AnnouncementVerdict =
  | {ok: true}
  /** Do not download: `reason` says why (the result is invalid whatever its bytes). */
  | {ok: false; reason: string}
  /** The producer signed a second, different result for this step: `proof` convicts it. */
  | {ok: false; reason: string; proof: EquivocationProof}

interface Seen {
  producer: ClientId
  step: number
}

/** Per-client memory of announcements and results, bounded to a few recent steps (forget()). */
export class ResultIntake {
  private readonly byProducer = new Map<string, ResultAnnouncement>()
  /** commitment → the first producer and step we saw it announced with. */
  private readonly commitments = new Map<string, Seen>()
  /** step → the valid results' index samples, one per producer (copy detection by overlap: copy.ts). */
  private readonly samples = new Map<number, OverlapIndex>()

  constructor(private format: ResultFormat | undefined) {}

  setFormat(format: ResultFormat | undefined): void {
    this.format = format
  }

  /**
   * Checks an announcement (already signature-checked by the P2P layer) against what we saw before. A second
   * announcement by one producer for one step with other contents is equivocation. A size that no valid
   * result of this run has is refused before any byte is downloaded (oversized payloads).
   */
  announcement(a: ResultAnnouncement): AnnouncementVerdict {
    const key = `${a.step}:${a.client_id}`
    const first = this.byProducer.get(key)
    if (first) {
      if (first.commitment === a.commitment && first.batch_start === a.batch_start && first.batch_end === a.batch_end && first.size === a.size) return {ok: true}
      return {ok: false, reason: `equivocation: ${a.client_id} signed two different results for step ${a.step}`, proof: {a: first, b: a}}
    }
    this.byProducer.set(key, a)
    if (this.format) {
      const sizes = validSizes(this.format)
      if (!sizes.includes(a.size)) return {ok: false, reason: `${FORMAT_INVALID}announced size ${a.size} bytes; a result for this model is exactly ${sizes.join(' or ')}`}
    }
    return {ok: true}
  }

  /**
   * Checks downloaded bytes (they hash to the announcement's commitment). Undefined: valid. Otherwise the
   * reason: the format validator's (prefixed FORMAT_INVALID), or a copy of another producer's result (the same
   * bytes, or an index overlap with its result of this step at the copy threshold), or a replay of a result of
   * an earlier step.
   */
  bytes(a: Pick<ResultAnnouncement, 'client_id' | 'step' | 'commitment'>, bytes: Uint8Array): string | undefined {
    if (this.format) {
      const v = validateResult(bytes, this.format)
      if (!v.ok) return FORMAT_INVALID + v.reason
    }
    const seen = this.commitments.get(a.commitment)
    if (!seen) {
      this.commitments.set(a.commitment, {producer: a.client_id, step: a.step})
      return this.overlap(a, bytes)
    }
    if (seen.producer !== a.client_id) return `copy: the same result as ${seen.producer}'s for step ${seen.step}`
    if (seen.step !== a.step) return `replay: the same result as its own for step ${seen.step}`
    return undefined
  }

  /** Records our own result (so a peer copying it is caught). */
  own(a: Pick<ResultAnnouncement, 'client_id' | 'step' | 'commitment'>, bytes?: Uint8Array): void {
    if (!this.commitments.has(a.commitment)) this.commitments.set(a.commitment, {producer: a.client_id, step: a.step})
    this.byProducer.set(`${a.step}:${a.client_id}`, a as ResultAnnouncement)
    if (bytes && this.format && validateResult(bytes, this.format).ok) this.overlap(a, bytes)
  }

  /** Compares a valid result with the other producers' results of its step seen before it; keeps its sample. */
  private overlap(a: Pick<ResultAnnouncement, 'client_id' | 'step'>, bytes: Uint8Array): string | undefined {
    if (!this.format) return undefined
    const sample = indexSample(bytes, this.format)
    let step = this.samples.get(a.step)
    if (!step) this.samples.set(a.step, (step = new OverlapIndex()))
    const hit = step.firstOverlap(a.client_id, sample, COPY_OVERLAP_THRESHOLD)
    if (hit) return copyReason(hit.of, a.step, hit.overlap)
    if (!step.has(a.client_id)) step.add(a.client_id, sample)
    return undefined
  }

  /** Forgets announcements of steps before `step`; commitments are kept `keepSteps` longer to catch replays. */
  forget(step: number, keepSteps = 16): void {
    for (const [key, a] of this.byProducer) if (a.step < step) this.byProducer.delete(key)
    for (const [c, s] of this.commitments) if (s.step < step - keepSteps) this.commitments.delete(c)
    for (const s of this.samples.keys()) if (s < step) this.samples.delete(s)
  }
}
