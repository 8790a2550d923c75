import {isRoundPhase, type ClientId, type Round} from '../coordinator/index.js'
import {errorMessage} from '../errors.js'
import type {RoundEvent} from '../events.js'
import type {ResultAnnouncement} from '../p2p/index.js'
import {copyReason, nearCopies} from '../verify/copy.js'
import {FORMAT_INVALID} from '../verify/intake.js'
import {WorkerRequestError} from '../worker/client.js'
import type {Checkpointing} from './checkpointing.js'
import {snapshotOf, type ClientContext} from './context.js'
import {acceptedResults, belongsToRound, trainersWithBatches, type HeldResult} from './decide.js'
import type {Evaluation} from './evaluation.js'
import type {ExchangeHealth} from './exchange-health.js'
import type {Verification} from './verification.js'

/** The accepted results of a round, downloaded and checked, in the order handed to the worker. */
type RoundResults = Uint8Array[] & {peers?: number; peersAccepted?: number}

/**
 * Round application: peers' announcements are taken in and their results fetched as soon as announced; a final
 * round's accepted results are collected (fetch → copies → verify) and applied (decide.ts's `apply`, or with the
 * next round's training), and the round is reported (evaluation, exchange health, checkpoint).
 */
export class RoundApplication {
  constructor(
    private readonly ctx: ClientContext,
    private readonly verification: Verification,
    private readonly evaluation: Evaluation,
    private readonly health: ExchangeHealth,
    private readonly checkpointing: Checkpointing,
  ) {}

  /** A verified announcement of a peer's result: recorded, and its bytes fetched (or refused without downloading). */
  onAnnouncement(a: ResultAnnouncement): void {
    const ctx = this.ctx
    const floor = ctx.modelStep ?? 0
    if (a.step <= floor) return
    const round = ctx.state?.epoch.round
    if (round && round.step === a.step && !belongsToRound(ctx.state, round, a)) {
      ctx.log({
        event: 'announcement_ignored',
        client_id: a.client_id,
        step: a.step,
        reason: `batches [${a.batch_start}, ${a.batch_end}) are not its assignment in step ${a.step}`,
      })
      return
    }
    const record = ctx.ledger.at(a.step)
    const verdict = ctx.intake.announcement(a)
    if (!verdict.ok && 'proof' in verdict) {
      this.verification.equivocation(a, verdict.reason, verdict.proof)
      return
    }
    if (record.results.has(a.client_id)) return // first valid announcement per producer and step wins
    const held: HeldResult = {client_id: a.client_id, step: a.step, batch_start: a.batch_start, batch_end: a.batch_end, commitment: a.commitment}
    record.results.set(a.client_id, held)
    if (!verdict.ok) {
      // Refused without downloading (a size no result of this model has): counted as arrived, and invalid.
      held.invalid = verdict.reason
      held.bytes = new Uint8Array(0)
      ctx.log({event: 'result_rejected', client_id: a.client_id, step: a.step, reason: verdict.reason})
      ctx.flushMessages()
      ctx.poke()
      return
    }
    record.announcements.set(a.client_id, a)
    ctx.p2p.fetchResult(a).then(
      (bytes) => {
        this.verification.received(held, bytes)
        ctx.flushMessages()
        ctx.poke()
      },
      (error) => ctx.log({event: 'result_fetch_failed', client_id: a.client_id, step: a.step, message: errorMessage(error)}),
    )
  }

  /**
   * The accepted results of a final round, downloaded. Undefined while some are not here yet: a witnessed result
   * we have no announcement of, or whose download failed. After missingResultWaitMs we give up on this epoch
   * rather than apply a different set than our peers (that would fork the replica): the model is dropped, we
   * stop training (health checks drop us), rejoin, and load the model from a peer at the next Warmup.
   */
  async acceptedBytes(round: Round): Promise<RoundResults | undefined> {
    const ctx = this.ctx
    const record = ctx.ledger.get(round.step)
    for (const r of acceptedResults(ctx.state, round, record?.results).accepted) {
      if (r.bytes) continue
      const a = record?.announcements.get(r.client_id)
      try {
        const bytes = a ? await ctx.p2p.fetchResult(a) : ctx.p2p.getResult(r.commitment)
        if (bytes) this.verification.received(r, bytes)
      } catch (error) {
        ctx.log({event: 'result_fetch_failed', client_id: r.client_id, step: round.step, message: errorMessage(error)})
      }
    }
    // Again, now that every accepted result we could get is downloaded and validated.
    const {accepted, missing, dropped} = acceptedResults(ctx.state, round, record?.results)
    const unfetched = accepted.filter((r) => !r.bytes).map((r) => r.client_id)
    if (missing.length === 0 && unfetched.length === 0) {
      // The same on every replica: the witnessed bytes are the same everywhere, and so is their validation.
      for (const r of dropped) ctx.log({event: 'result_dropped', client_id: r.client_id, step: round.step, reason: r.invalid})
      const excluded = round.excluded ?? []
      if (excluded.length > 0) ctx.log({event: 'results_excluded', step: round.step, client_ids: excluded})
      ctx.applying = accepted.filter((r) => !dropped.includes(r))
      // Copies by index overlap among the witnessed results: a pure function of their bytes in canonical order,
      // so every replica drops the same ones (a copied update counts once).
      if (ctx.resultFormat) {
        const copies = nearCopies(ctx.applying as {client_id: ClientId; bytes: Uint8Array}[], ctx.resultFormat)
        for (const c of copies) ctx.log({event: 'result_dropped', client_id: c.client_id, step: round.step, reason: copyReason(c.of, round.step, c.overlap)})
        const gone = new Set(copies.map((c) => c.index))
        ctx.applying = ctx.applying.filter((_, i) => !gone.has(i))
      }
      // Verification never stops an apply: a failure is logged and the round goes on.
      await this.verification.verify(round, ctx.applying).catch((error) => ctx.log({event: 'verify_failed', step: round.step, message: errorMessage(error)}))
      const out: RoundResults = ctx.applying.map((r) => r.bytes!)
      out.peers = ctx.applying.filter((r) => r.client_id !== ctx.id).length
      out.peersAccepted = accepted.filter((r) => r.client_id !== ctx.id).length
      return out
    }
    const since = (ctx.ledger.at(round.step).missingSince ??= ctx.clock.now())
    if (ctx.clock.now() - since < (ctx.opts.missingResultWaitMs ?? 10_000)) return undefined
    ctx.log({
      event: 'out_of_sync',
      step: round.step,
      unannounced: missing,
      unfetched,
      detail: 'a witness quorum accepted results that never reached us; dropping the model until the next epoch rather than fork',
    })
    ctx.modelStep = null
    ctx.snapshot = undefined
    return undefined
  }

  /**
   * The worker refused a result we validated (validateResult and its decoder disagree: a bug, never expected).
   * Its decoder is as deterministic as ours, so every replica refuses the same result: drop it and try again.
   */
  refusedByWorker(error: unknown, step: number): boolean {
    if (!(error instanceof WorkerRequestError) || error.kind !== 'bad_result') return false
    const index = Number(/result (\d+):/.exec(error.message)?.[1])
    const r = this.ctx.applying[index]
    if (!r) return false
    r.invalid = `${FORMAT_INVALID}the worker refused it: ${error.message}`
    this.ctx.log({event: 'result_dropped', client_id: r.client_id, step, reason: r.invalid})
    return true
  }

  /** decide.ts's `apply`: a final round's results applied on their own (no training of ours to go with them). */
  async apply(round: Round): Promise<boolean> {
    const ctx = this.ctx
    const started = performance.now()
    const results = await this.acceptedBytes(round)
    if (!results) return ctx.modelStep === null
    let hash: string
    try {
      hash = await ctx.worker.applyResults(round.step, results)
    } catch (error) {
      if (this.refusedByWorker(error, round.step)) return false
      throw error
    }
    await this.report(this.applied(round, hash, results.length, results.peers ?? 0, results.peersAccepted ?? 0, performance.now() - started))
    // Past the epoch's rounds the model is what joiners of the next epoch fetch: refresh what we serve.
    if (!isRoundPhase(ctx.state.run_state)) {
      ctx.snapshot = snapshotOf(round.step, await ctx.worker.exportParams())
      await this.checkpointing.afterApply(round)
    }
    return true
  }

  /**
   * The bookkeeping after an apply; returns the round event, which report() logs (after an evaluation when one is
   * due). applyMs: time spent applying outside the worker's training call (collecting the results, and a separate
   * apply).
   */
  applied(round: Round, hash: string, applied: number, peersApplied: number, peersAccepted: number, applyMs: number): RoundEvent {
    const ctx = this.ctx
    ctx.modelStep = round.step
    ctx.trainedStep = Math.max(ctx.trainedStep, round.step)
    ctx.lastHash = hash
    ctx.roundsApplied++
    const record = ctx.ledger.get(round.step)
    const mine = record?.trained
    const stats = ctx.p2p.stats()
    const kinds = ctx.p2p.connectionKinds?.()
    const otherTrainers = trainersWithBatches(ctx.state, round).filter((t) => t.id !== ctx.id).length
    const event: RoundEvent = {
      event: 'round',
      step: round.step,
      epoch: record?.epoch ?? ctx.state.progress.epoch,
      loss: mine?.loss ?? null,
      param_hash: hash,
      applied,
      trainers: round.roster.length,
      // Every accepted result is fetched before the apply (else we wait, or drop out); one that fails validation
      // is dropped by every replica alike, so applied < accepted only by such drops.
      peers_applied: peersApplied,
      peers_accepted: peersAccepted,
      other_trainers: otherTrainers,
      result_bytes: mine?.resultBytes ?? null,
      compute_ms: mine?.computeMs ?? null,
      apply_ms: Math.round(applyMs),
      bytes_in: stats.bytesReceived,
      bytes_out: stats.bytesSent,
      peers: stats.peers,
      conn_direct: kinds?.direct ?? null,
      conn_relayed: kinds?.relayed ?? null,
      val_loss: null,
      eval_ms: null,
      peer_bytes: stats.peerBytes ?? {},
      relayed_in: stats.relayedReceived ?? null,
      relayed_out: stats.relayedSent ?? null,
      peer_relayed_bytes: stats.peerRelayedBytes ?? {},
      rounds_without_exchange: 0,
    }
    // Keep one applied round back: slower peers may still fetch it from us, and the next round's witnesses judge it.
    ctx.p2p.dropResultsBefore(round.step - 1)
    ctx.ledger.pruneBefore(round.step - 1)
    ctx.intake.forget(round.step - 1)
    for (const key of ctx.accused) if (Number(key.split(':')[0]) < round.step - 1) ctx.accused.delete(key)
    ctx.flushMessages()
    return event
  }

  /** Logs a round event, with the validation loss when an evaluation is due after its step. */
  async report(event: RoundEvent): Promise<void> {
    await this.evaluation.evaluate(event)
    event.rounds_without_exchange = this.health.count(event.peers_applied, event.other_trainers)
    this.ctx.log(event)
    this.health.afterRound(event.step, event.other_trainers)
  }
}
