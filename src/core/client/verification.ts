import {assignedTrainers, batchRangeFor, isRoundPhase, isVerifier, type ClientId, type Round} from '../coordinator/index.js'
import type {ResultAnnouncement} from '../p2p/index.js'
import type {EquivocationProof} from '../coordinator/equivocation.js'
import {randomBatchIds, roundScale, scoreOf, Scorer, type Losses} from '../verify/score.js'
import type {ClientContext} from './context.js'
import type {HeldResult} from './decide.js'

/**
 * Verification: downloaded bytes are validated before they count anywhere (decide.ts never attests or applies an
 * invalid one); two signed results for one step are reported to the coordinator; and, as a verifier of the
 * current round, peers' results are scored and persistent low scorers accused.
 */
export class Verification {
  private readonly scorer = new Scorer()
  /** `${step}:${producer}` of the equivocations reported. */
  private readonly equivocationsSent = new Set<string>()

  constructor(private readonly ctx: ClientContext) {}

  /**
   * Two signed results for one step: the proof goes to the coordinator, which ejects the producer and excludes it
   * from the round; we stop counting either result.
   */
  equivocation(a: ResultAnnouncement, reason: string, proof: EquivocationProof): void {
    const ctx = this.ctx
    const first = ctx.ledger.at(a.step).results.get(a.client_id)
    if (first) first.invalid = reason
    const key = `${a.step}:${a.client_id}`
    if (this.equivocationsSent.has(key)) return
    this.equivocationsSent.add(key)
    ctx.log({event: 'result_rejected', client_id: a.client_id, step: a.step, reason})
    if (ctx.conn.sendEquivocation(proof)) ctx.log({event: 'equivocation_reported', client_id: a.client_id, step: a.step})
    ctx.flushMessages()
  }

  /** Validates downloaded bytes before they count anywhere (decide.ts never attests or applies an invalid one). */
  received(held: HeldResult, bytes: Uint8Array): void {
    if (held.bytes) return
    const reason = held.invalid ?? this.ctx.intake.bytes(held, bytes)
    held.bytes = bytes
    if (reason !== undefined && held.invalid === undefined) {
      held.invalid = reason
      this.ctx.log({event: 'result_rejected', client_id: held.client_id, step: held.step, reason})
    }
  }

  /**
   * As a verifier of the current round (the one after `round`): scores the peers' results of the final `round` that
   * the round's seed assigned it (at most verification_sample: coordinator/rules.ts assignedTrainers, the rule the
   * ledger checks reports by), before they are applied, so the worker's parameters are those their producers trained
   * from; keeps moving averages, and accuses peers whose average stays low. Scores appear as `scored` events.
   */
  async verify(round: Round, results: HeldResult[]): Promise<void> {
    const ctx = this.ctx
    const {state, worker} = ctx
    const current = state.epoch.round
    if (!current || !isRoundPhase(state.run_state) || !isVerifier(state, ctx.id, current) || !worker.scoreResults) return
    const assigned = new Set(assignedTrainers(state, current, round, ctx.id))
    const peers = results.filter((r) => assigned.has(r.client_id) && r.bytes)
    const fresh = peers.length > 0 ? await this.score(round, peers) : new Map<ClientId, number>()
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
  private async score(round: Round, peers: HeldResult[]): Promise<Map<ClientId, number>> {
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
