import type {ClientId, Round} from '../coordinator/index.js'
import type {ResultAnnouncement} from '../p2p/index.js'
import type {HeldResult} from './decide.js'

/** What this client's own training of a step gave (for the step's round event). */
interface Trained {
  loss: number
  resultBytes: number
  computeMs: number
}

/** Everything the client holds about one step. */
interface StepRecord {
  readonly step: number
  /** Results announced for the step, by producer (first valid announcement per producer wins; ours included). */
  readonly results: Map<ClientId, HeldResult>
  /** The announcements behind `results` (other producers'), by producer: to download them again at apply time. */
  readonly announcements: Map<ClientId, ResultAnnouncement>
  /** Our own announcement of the step's result (re-gossiped when new peers subscribe). */
  own?: ResultAnnouncement
  /** The round of this step, once its witness records are final. */
  finalRound?: Round
  /** The epoch (progress.epoch) the step's round was seen in. */
  epoch?: number
  /** Our training of the step. */
  trained?: Trained
  /** Our witness proof for the step was handed to the backend. */
  witnessSent: boolean
  /** We sent (or decided against) a health check judging this step's round. */
  healthChecked: boolean
  /** As a verifier, we scored the step's results (or found nothing to score): decide.ts's `score` job is done. */
  scored: boolean
  /** When (clock ms) applying the step first found accepted results missing. */
  missingSince?: number
}

/**
 * The client's per-step memory: one record per step, created on first use, all forgotten together by
 * pruneBefore. The views for decide.ts (sets and maps by step) are derived from the records.
 */
export class StepLedger {
  private readonly records = new Map<number, StepRecord>()

  /** The record of `step`, created empty if there is none. */
  at(step: number): StepRecord {
    let r = this.records.get(step)
    if (!r) this.records.set(step, (r = {step, results: new Map(), announcements: new Map(), witnessSent: false, healthChecked: false, scored: false}))
    return r
  }

  get(step: number): StepRecord | undefined {
    return this.records.get(step)
  }

  /**
   * Forgets every step before `step`. The client keeps one applied round back (`applied - 1`): slower peers may
   * still fetch its results from us, and the next round's witnesses judge it in their health checks.
   */
  pruneBefore(step: number): void {
    for (const s of this.records.keys()) if (s < step) this.records.delete(s)
  }

  /** After a reconnect: a restarted coordinator may have lost proofs we sent; decide.ts re-sends what its state lacks. */
  forgetWitnessesSent(): void {
    for (const r of this.records.values()) r.witnessSent = false
  }

  witnessSent(): ReadonlySet<number> {
    return this.stepsWhere((r) => r.witnessSent)
  }

  healthChecked(): ReadonlySet<number> {
    return this.stepsWhere((r) => r.healthChecked)
  }

  scored(): ReadonlySet<number> {
    return this.stepsWhere((r) => r.scored)
  }

  finalRounds(): ReadonlyMap<number, Round> {
    const out = new Map<number, Round>()
    for (const r of this.records.values()) if (r.finalRound) out.set(r.step, r.finalRound)
    return out
  }

  results(): ReadonlyMap<number, ReadonlyMap<ClientId, HeldResult>> {
    const out = new Map<number, ReadonlyMap<ClientId, HeldResult>>()
    for (const r of this.records.values()) if (r.results.size > 0) out.set(r.step, r.results)
    return out
  }

  /** Steps held (for tests and debugging). */
  steps(): number[] {
    return [...this.records.keys()].sort((a, b) => a - b)
  }

  private stepsWhere(predicate: (r: StepRecord) => boolean): Set<number> {
    const out = new Set<number>()
    for (const r of this.records.values()) if (predicate(r)) out.add(r.step)
    return out
  }
}
