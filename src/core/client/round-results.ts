import {isRoundPhase, roundTrainers, type ClientId, type Round} from '../coordinator/index.js'
import {errorMessage} from '../errors.js'
import type {RoundEvent} from '../events.js'
import type {ResultAnnouncement} from '../p2p/index.js'
import {copyReason, nearCopies} from '../verify/copy.js'
import {FORMAT_INVALID, ResultIntake} from '../verify/intake.js'
import {WorkerRequestError} from '../worker/client.js'
import type {Checkpointing} from './checkpointing.js'
import {snapshotOf, type ClientContext} from './context.js'
import {acceptedResults, belongsToRound, trainersWithBatches, type HeldResult} from './decide.js'
import type {Evaluation} from './evaluation.js'
import type {ExchangeHealth} from './exchange-health.js'

/**
 * A round's results, from announcement to applied: the one owner of peers' results in the client.
 *
 * - Intake: a peer's announcement (delivered by the P2P layer) is checked and recorded in the ledger, and its bytes
 *   fetched at once; downloaded bytes are checked before they count anywhere (witnessing, accusing, scoring, applying).
 * - Collection: for a final round, the accepted results (decide.ts acceptedResults: what a witness quorum confirmed,
 *   in canonical order), every one downloaded, less those whose bytes are invalid and the near copies, is the list
 *   handed to the worker (`Collected`, kept until the round is applied or the worker refuses one of its results).
 * - Apply: alone (decide.ts's `apply` job) or with our next round's training (training.ts), then the one bookkeeping
 *   of an applied round (our model's step and hash, pruning, the round event).
 *
 * Validation happens once per layer, each for its own reason:
 * 1. The P2P layer (p2p/result-exchange.ts, with primitives/announcement.ts): an announcement is for this run,
 *    within bounds and signed by its producer, so nothing is fetched or counted in someone else's name; downloaded
 *    bytes hash to the announced commitment (and are no bigger than announced), so they are the bytes announced.
 * 2. Intake (verify/intake.ts, with verify/result.ts for the format): before a result counts anywhere, its bytes are
 *    a valid result for this run's model (the worker would accept them: a witness never attests, and a replica never
 *    hands the worker, bytes it would refuse), and it is no copy, replay or equivocation. Only the format verdict is a
 *    property of the bytes alone, so only it drops a witnessed result at apply time (decide.ts acceptedResults).
 * 3. The worker's decoder (python/psyche_worker): a separate process trusts nothing it is handed. It accepts exactly
 *    what verify/result.ts accepts (test/verify/result.test.ts); should they ever disagree, the worker's refusal is
 *    data (`WorkerRequestError` kind bad_result with the refused result's index), the result is dropped by every
 *    replica alike (the decoder is deterministic) and the apply is tried again without it.
 */

/** A final round's results as handed to the worker: accepted, downloaded and valid, in canonical order. */
interface Collected {
  readonly step: number
  /** What the worker applies, in this order (every one has its bytes). */
  readonly results: readonly HeldResult[]
  /** Of `results`, other clients' (peers_applied). */
  readonly peers: number
  /** Other clients' results the witness quorum accepted, before drops (peers_accepted). */
  readonly peersAccepted: number
}

/** An apply's outcome: applied (with the round's event, to be reported), or not yet. */
type ApplyOutcome<T> =
  | {status: 'applied'; value: T; event: RoundEvent}
  /** Some accepted result is not here yet (or we gave up on the epoch: ctx.modelStep is null then). */
  | {status: 'waiting'}
  /** The worker refused one of the results: it is dropped, and the apply is to be tried again. */
  | {status: 'refused'}

export class RoundResults {
  /** Checks announcements and downloaded bytes (against the loaded model's result format, ctx.resultFormat). */
  private readonly intake = new ResultIntake(undefined)
  /** `${step}:${producer}` of the equivocations reported. */
  private readonly equivocationsSent = new Set<string>()
  /** Each final round's collection once complete, by step, until the round is applied (or a result of it refused). */
  private readonly collected = new Map<number, Collected>()

  constructor(
    private readonly ctx: ClientContext,
    private readonly evaluation: Evaluation,
    private readonly health: ExchangeHealth,
    private readonly checkpointing: Checkpointing,
  ) {}

  /** The intake, checking against the model's result format as last loaded (model-loading.ts). */
  private get checks(): ResultIntake {
    this.intake.setFormat(this.ctx.resultFormat)
    return this.intake
  }

  // ---- intake

  /** A signature-checked announcement of a peer's result: recorded, and its bytes fetched (or refused without downloading). */
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
    const verdict = this.checks.announcement(a)
    if (!verdict.ok && 'proof' in verdict) {
      // Two signed results for one step: the proof goes to the coordinator, which ejects the producer and excludes it
      // from the round; we stop counting either result.
      const first = record.results.get(a.client_id)
      if (first) first.invalid = verdict.reason
      const key = `${a.step}:${a.client_id}`
      if (this.equivocationsSent.has(key)) return
      this.equivocationsSent.add(key)
      ctx.log({event: 'result_rejected', client_id: a.client_id, step: a.step, reason: verdict.reason})
      if (ctx.conn.sendEquivocation(verdict.proof)) ctx.log({event: 'equivocation_reported', client_id: a.client_id, step: a.step})
      ctx.flushMessages()
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
        this.received(held, bytes)
        ctx.flushMessages()
        ctx.poke()
      },
      (error) => ctx.log({event: 'result_fetch_failed', client_id: a.client_id, step: a.step, message: errorMessage(error)}),
    )
  }

  /** Downloaded bytes, checked before they count anywhere (decide.ts never attests or applies an invalid one). */
  private received(held: HeldResult, bytes: Uint8Array): void {
    if (held.bytes) return
    const reason = held.invalid ?? this.checks.bytes(held, bytes)
    held.bytes = bytes
    if (reason !== undefined && held.invalid === undefined) {
      held.invalid = reason
      this.ctx.log({event: 'result_rejected', client_id: held.client_id, step: held.step, reason})
    }
  }

  /** Our own result of `round`'s step, as published (a peer copying it is caught; we count it among the round's results). */
  own(announcement: ResultAnnouncement, bytes: Uint8Array): void {
    const record = this.ctx.ledger.at(announcement.step)
    record.own = announcement
    this.checks.own(announcement, bytes)
    record.results.set(this.ctx.id, {
      client_id: this.ctx.id,
      step: announcement.step,
      batch_start: announcement.batch_start,
      batch_end: announcement.batch_end,
      commitment: announcement.commitment,
      bytes,
    })
  }

  // ---- collection

  /**
   * The accepted results of a final round, downloaded and checked, in the order handed to the worker. Undefined while
   * some are not here yet: a witnessed result we have no announcement of, or whose download failed. After
   * missingResultWaitMs we give up on this epoch rather than apply a different set than our peers (that would fork
   * the replica): the model is dropped, we stop training (health checks drop us), rejoin, and load the model from a
   * peer at the next Warmup.
   */
  async collect(round: Round): Promise<Collected | undefined> {
    const ctx = this.ctx
    const done = this.collected.get(round.step)
    if (done) return done
    const held = () => ctx.ledger.get(round.step)?.results
    for (const r of acceptedResults(ctx.state, round, held()).accepted) {
      if (r.bytes) continue
      const a = ctx.ledger.get(round.step)?.announcements.get(r.client_id)
      try {
        const bytes = a ? await ctx.p2p.fetchResult(a) : ctx.p2p.getResult(r.commitment)
        if (bytes) this.received(r, bytes)
      } catch (error) {
        ctx.log({event: 'result_fetch_failed', client_id: r.client_id, step: round.step, message: errorMessage(error)})
      }
    }
    // Again, now that every accepted result we could get is downloaded and validated.
    const {accepted, missing, dropped} = acceptedResults(ctx.state, round, held())
    const unfetched = accepted.filter((r) => !r.bytes).map((r) => r.client_id)
    if (missing.length === 0 && unfetched.length === 0) {
      // The same on every replica: the witnessed bytes are the same everywhere, and so is their validation.
      for (const r of dropped) ctx.log({event: 'result_dropped', client_id: r.client_id, step: round.step, reason: r.invalid})
      const excluded = round.excluded ?? []
      if (excluded.length > 0) ctx.log({event: 'results_excluded', step: round.step, client_ids: excluded})
      let results = accepted.filter((r) => !dropped.includes(r))
      // Copies by index overlap among the witnessed results: a pure function of their bytes in canonical order,
      // so every replica drops the same ones (a copied update counts once).
      if (ctx.resultFormat) {
        const copies = nearCopies(results as {client_id: ClientId; bytes: Uint8Array}[], ctx.resultFormat)
        for (const c of copies) ctx.log({event: 'result_dropped', client_id: c.client_id, step: round.step, reason: copyReason(c.of, round.step, c.overlap)})
        const gone = new Set(copies.map((c) => c.index))
        results = results.filter((_, i) => !gone.has(i))
      }
      const collected: Collected = {
        step: round.step,
        results,
        peers: results.filter((r) => r.client_id !== ctx.id).length,
        peersAccepted: accepted.filter((r) => r.client_id !== ctx.id).length,
      }
      this.collected.set(round.step, collected)
      return collected
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

  // ---- apply

  /** decide.ts's `apply` job: a final round's results applied on their own (no training of ours to go with them). */
  async applyAlone(round: Round): Promise<boolean> {
    const ctx = this.ctx
    const out = await this.applyVia(round, async (results) => ({paramHash: await ctx.worker.applyResults(round.step, results)}), true)
    if (out.status === 'waiting') return ctx.modelStep === null
    if (out.status === 'refused') return false
    await this.report(out.event)
    // Past the epoch's rounds (or its last round, applied after its Cooldown) the model is what joiners of the next
    // epoch fetch: refresh what we serve.
    if (!isRoundPhase(ctx.state.run_state) || this.checkpointing.epochEndingAt(round.step) !== undefined) {
      ctx.snapshot = snapshotOf(round.step, await ctx.worker.exportParams())
      await this.checkpointing.afterApply(round)
    }
    return true
  }

  /**
   * `round`'s results applied by the worker's call that also finishes our next round's training (training.ts hands
   * `finish`, which gets the results in order). The round's event is for report(), once our own result is out.
   */
  applyWithTraining<T extends {paramHash: string}>(round: Round, finish: (results: Uint8Array[]) => Promise<T>): Promise<ApplyOutcome<T>> {
    return this.applyVia(round, finish, false)
  }

  /**
   * Collects `round`'s results and hands them to `apply` (the worker's call); then the bookkeeping. `applyCounts`:
   * the call's time counts as apply time (apply_ms: collecting, and a separate apply; not the training call's).
   */
  private async applyVia<T extends {paramHash: string}>(round: Round, apply: (results: Uint8Array[]) => Promise<T>, applyCounts: boolean): Promise<ApplyOutcome<T>> {
    const started = performance.now()
    const collected = await this.collect(round)
    if (!collected) return {status: 'waiting'}
    let applyMs = performance.now() - started
    let value: T
    try {
      const calling = performance.now()
      value = await apply(collected.results.map((r) => r.bytes!))
      if (applyCounts) applyMs += performance.now() - calling
    } catch (error) {
      if (this.refusedByWorker(error, collected)) return {status: 'refused'}
      throw error
    }
    return {status: 'applied', value, event: this.applied(round, value.paramHash, collected, applyMs)}
  }

  /**
   * The worker refused a result we validated (validateResult and its decoder disagree: a bug, never expected). Its
   * decoder is as deterministic as ours, so every replica refuses the same result: it is dropped, and the round is
   * collected again without it.
   */
  private refusedByWorker(error: unknown, collected: Collected): boolean {
    if (!(error instanceof WorkerRequestError) || error.kind !== 'bad_result' || error.index === undefined) return false
    const r = collected.results[error.index]
    if (!r) return false
    r.invalid = `${FORMAT_INVALID}the worker refused it: ${error.message}`
    this.ctx.log({event: 'result_dropped', client_id: r.client_id, step: collected.step, reason: r.invalid})
    this.collected.delete(collected.step)
    return true
  }

  /** The bookkeeping after an apply (the one place for it); returns the round event, which report() logs. */
  private applied(round: Round, hash: string, collected: Collected, applyMs: number): RoundEvent {
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
      applied: collected.results.length,
      trainers: roundTrainers(ctx.state.config, round),
      // Every accepted result is fetched before the apply (else we wait, or drop out); one that fails validation
      // is dropped by every replica alike, so applied < accepted only by such drops.
      peers_applied: collected.peers,
      peers_accepted: collected.peersAccepted,
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
    this.intake.forget(round.step - 1)
    for (const step of this.collected.keys()) if (step <= round.step) this.collected.delete(step)
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
