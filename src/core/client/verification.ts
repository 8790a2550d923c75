import {assignedTrainers, batchRangeFor, type ClientId, type Round} from '../coordinator/index.js'
import {errorMessage} from '../errors.js'
import {randomBatchIds, roundScale, scoreOf, Scorer, type Losses} from '../verify/score.js'
import type {ClientContext} from './context.js'
import type {HeldResult} from './decide.js'

/**
 * Verification (decide.ts's `score` job): as a verifier of the current round, the peers' results of the final round
 * applied next are scored on the worker before they are applied, their producers' moving averages kept, and
 * persistent low scorers accused. The results come checked and in order from round-results.ts (collect).
 */
export class Verification {
  private readonly scorer = new Scorer()

  constructor(private readonly ctx: ClientContext) {}

  /**
   * As a verifier of `current` (decide.ts decided it): scores the peers' results of the final `round` that the round's seed assigned it (at
   * most verification_sample: coordinator/rules.ts assignedTrainers, the rule the ledger checks reports by), before
   * they are applied, so the worker's parameters are those their producers trained from; keeps moving averages, and
   * accuses peers whose average stays low. Scores appear as `scored` events. Never stops the round: a failure is
   * logged (verify_failed). The job is done afterwards (the ledger's `scored`), whatever came of it.
   */
  async score(round: Round, current: Round, results: readonly HeldResult[]): Promise<void> {
    const ctx = this.ctx
    try {
      await this.verify(round, current, results)
    } catch (error) {
      ctx.log({event: 'verify_failed', step: round.step, message: errorMessage(error)})
    }
    ctx.ledger.at(round.step).scored = true
  }

  private async verify(round: Round, current: Round, results: readonly HeldResult[]): Promise<void> {
    const ctx = this.ctx
    const {state, worker} = ctx
    if (!worker.scoreResults) return // a worker that cannot score: nothing to do
    const assigned = new Set(assignedTrainers(state, current, round, ctx.id))
    const peers = results.filter((r) => assigned.has(r.client_id) && r.bytes)
    const fresh = peers.length > 0 ? await this.scoreResults(round, peers) : new Map<ClientId, number>()
    // Accused by its average over the rounds we scored it in, or by the run's agreed average (every verifier's reports,
    // where the backend delivers them: with few verifiers a round, one rarely scores the same peer twice) together with
    // our score of this round, while the seed assigns it to us: the coordinator counts a low-score quorum among the
    // verifiers assigned to the accused (isScoreAssigned) and refuses the others.
    const {threshold, window} = this.scorer.settings
    const low = new Map(this.scorer.lowScorers().map((id) => [id, `moving average ${this.scorer.get(id)!.average.toFixed(3)}`]))
    for (const [id, agreed] of ctx.conn.agreedScores?.() ?? []) {
      if (low.has(id) || !(agreed.average < threshold) || agreed.last_step >= round.step) continue
      const mine = fresh.get(id)
      if (agreed.count >= window) low.set(id, `agreed moving average ${agreed.average.toFixed(3)} over ${agreed.count} reports`)
      else if (mine !== undefined && mine < threshold && agreed.count + 1 >= window)
        low.set(id, `agreed moving average ${agreed.average.toFixed(3)} over ${agreed.count} reports, and our score ${mine.toFixed(3)}`)
    }
    for (const [id, why] of low) {
      const key = `${current.step}:${id}:low_score`
      const range = batchRangeFor(ctx.state, id, current)
      if (!assigned.has(id) || ctx.accused.has(key) || !range || range.end === range.start || current.excluded?.includes(id)) continue
      if (ctx.conn.sendAccusation(current.step, id, 'low_score')) {
        ctx.accused.add(key)
        ctx.log({event: 'accused', step: current.step, client_id: id, reason: `low_score: ${why} below ${threshold}`})
      }
    }
  }

  /** Scores `peers`' results of `round` (one score_results call), keeps their averages, and reports the scores; returns them. */
  private async scoreResults(round: Round, peers: HeldResult[]): Promise<Map<ClientId, number>> {
    const ctx = this.ctx
    const worker = ctx.worker
    const size = Math.max(...peers.map((r) => r.batch_end - r.batch_start))
    const batches = []
    for (const r of peers) {
      const ids = Array.from({length: r.batch_end - r.batch_start}, (_, i) => r.batch_start + i)
      batches.push({tokens: await ctx.data.getSamples(ids), rows: ids.length})
    }
    const randomIds = randomBatchIds(round, size)
    batches.push({tokens: await ctx.data.getSamples(randomIds), rows: randomIds.length})
    const {before, after} = await worker.scoreResults!(
      round.step,
      peers.map((r) => r.bytes!),
      batches,
    )
    const k = peers.length
    const reported: {client_id: ClientId; score: number}[] = []
    const scored: {r: HeldResult; l: Losses}[] = []
    for (const [j, r] of peers.entries()) {
      const losses = after[j]
      if (losses) scored.push({r, l: {assigned: {before: before[j], after: losses[0]}, random: {before: before[k], after: losses[1]}}})
    }
    const scale = roundScale(scored.map((x) => x.l))
    for (const {r, l} of scored) {
      const score = scoreOf(l, scale)
      const peer = this.scorer.add(r.client_id, score)
      reported.push({client_id: r.client_id, score: Math.max(-1, Math.min(1, score))})
      ctx.log({
        event: 'scored',
        step: round.step,
        client_id: r.client_id,
        score,
        average: peer.average,
        count: peer.count,
        gain_assigned: l.assigned.before - l.assigned.after,
        gain_random: l.random.before - l.random.after,
      })
    }
    // The coordinator (the server, or the Solana program: report_scores) keeps moving averages of what verifiers report:
    // they weigh each client's points (rewards.ts) and show in psyche status, rewards and dashboards.
    if (reported.length > 0) ctx.conn.sendScores?.(round.step, reported)
    return new Map(reported.map((e) => [e.client_id, e.score]))
  }
}
