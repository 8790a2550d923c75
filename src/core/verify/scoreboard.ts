import type {ClientId} from '../coordinator/types.js'
import {MAX_SCORED_CLIENTS, type ClientScore} from '../protocol/messages.js'
import {DEFAULT_SCORE_SETTINGS} from './score.js'

export {type ClientScore} from '../protocol/messages.js'

/**
 * The coordinator server's view of verification scores: each verifier reports the scores it gave the results
 * of a round (a signed `scores` message), and the server keeps a moving average per scored client. Outside the
 * coordinator's state on purpose: it is display (psyche status, dashboards) and never decides anything — the
 * consensus state holds only the accusations a verifier quorum backs, so it stays pure and bounded.
 *
 * Bounded: at most `maxClients` entries; the least recently scored go first, and forget() drops clients that
 * left the run.
 */

interface Entry extends ClientScore {
  /** The average before `last_step` (undefined: `last_step` is the first step scored). */
  before: number | undefined
  sum: number
}

export class ScoreBoard {
  private readonly scores = new Map<ClientId, Entry>()
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
      let next: Entry
      if (!prev || step > prev.last_step) {
        // A new step: the previous one's mean is final in the average.
        const before = prev ? prev.average : undefined
        next = {client_id, before, sum: score, verifiers: 1, last: score, last_step: step, count: (prev?.count ?? 0) + 1, average: 0}
      } else if (step === prev.last_step) {
        next = {...prev, sum: prev.sum + score, verifiers: prev.verifiers + 1, count: prev.count + 1}
        next.last = next.sum / next.verifiers
      } else {
        continue // an older step than one already scored: too late to count
      }
      next.average = next.before === undefined ? next.last : (1 - this.alpha) * next.before + this.alpha * next.last
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
    return [...this.scores.values()]
      .map(({client_id, average, last, last_step, verifiers, count}) => ({client_id, average, last, last_step, verifiers, count}))
      .sort((a, b) => (a.client_id < b.client_id ? -1 : a.client_id > b.client_id ? 1 : 0))
  }
}
