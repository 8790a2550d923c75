import type {ClientId} from '../coordinator/types.js'
import {DEFAULT_SCORE_SETTINGS} from './score.js'

/**
 * The coordinator server's view of verification scores: each verifier reports the scores it gave the results
 * of a round (a signed `scores` message), and the server keeps a moving average per scored client. Outside the
 * coordinator's state on purpose: it is display (psyche status, dashboards) and never decides anything — the
 * consensus state holds only the accusations a verifier quorum backs, so it stays pure and bounded.
 *
 * Bounded: at most `maxClients` entries; the least recently scored go first, and forget() drops clients that
 * left the run.
 */

export interface ClientScore {
  client_id: ClientId
  /** Moving average of the scores verifiers reported for its results (weight of a new report: the Scorer's alpha). */
  average: number
  /** The last score reported, the step it scored, and by how many verifiers that step was scored. */
  last: number
  last_step: number
  verifiers: number
  /** Reports received. */
  count: number
}

export const MAX_SCORED_CLIENTS = 4096

export class ScoreBoard {
  private readonly scores = new Map<ClientId, ClientScore>()
  private readonly reported = new Set<string>()

  constructor(
    private readonly alpha = DEFAULT_SCORE_SETTINGS.alpha,
    private readonly maxClients = MAX_SCORED_CLIENTS,
  ) {}

  /**
   * A verifier's scores of one step's results. Returns false (and changes nothing) when this verifier already
   * reported that step.
   */
  report(from: ClientId, step: number, scores: readonly {client_id: ClientId; score: number}[]): boolean {
    const key = `${step}:${from}`
    if (this.reported.has(key)) return false
    this.reported.add(key)
    for (const {client_id, score} of scores) {
      if (client_id === from) continue
      const prev = this.scores.get(client_id)
      const next: ClientScore = prev
        ? {
            client_id,
            average: (1 - this.alpha) * prev.average + this.alpha * score,
            last: score,
            last_step: Math.max(step, prev.last_step),
            verifiers: step === prev.last_step ? prev.verifiers + 1 : step > prev.last_step ? 1 : prev.verifiers,
            count: prev.count + 1,
          }
        : {client_id, average: score, last: score, last_step: step, verifiers: 1, count: 1}
      // Re-inserted: the map's order is least recently scored first.
      this.scores.delete(client_id)
      this.scores.set(client_id, next)
      while (this.scores.size > this.maxClients) this.scores.delete(this.scores.keys().next().value!)
    }
    for (const k of this.reported) if (Number(k.slice(0, k.indexOf(':'))) < step - 4) this.reported.delete(k)
    return true
  }

  /** Keeps only the clients `keep` says are still in the run. */
  forget(keep: (id: ClientId) => boolean): void {
    for (const id of this.scores.keys()) if (!keep(id)) this.scores.delete(id)
  }

  /** Every entry, in client id order (a stable rendering). */
  all(): ClientScore[] {
    return [...this.scores.values()].sort((a, b) => (a.client_id < b.client_id ? -1 : a.client_id > b.client_id ? 1 : 0))
  }
}
