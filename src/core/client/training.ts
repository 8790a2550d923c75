import type {BatchRange, ClientId, Round} from '../coordinator/index.js'
import type {RoundEvent} from '../events.js'
import type {ResultAnnouncement} from '../p2p/index.js'
import {honestProducer, type ClientWorker, type ProducerContext, type ResultProducer} from './components.js'
import type {ClientContext} from './context.js'
import type {RoundResults} from './round-results.js'

type Finished = Awaited<ReturnType<ClientWorker['finishRound']>>

/** A round's compute begun on the worker (Training.begin); `done` resolves with its milliseconds. */
interface Begun {
  step: number
  range: BatchRange
  batches: number
  speculative: boolean
  done: Promise<number>
}

/**
 * Training (decide.ts's `train`): this round's forward/backward on our batches, overlapped with collecting the
 * previous round's accepted results (round-results.ts); then the worker applies those and produces our result, which
 * the producer (components.producer, honest by default) publishes.
 */
export class Training {
  /**
   * This round's forward/backward, started before the previous round's results are all here; `speculative` while it
   * runs on the batches predicted for a round that has not begun yet (speculate).
   */
  private begun: Begun | undefined
  private readonly producer: ResultProducer

  constructor(
    private readonly ctx: ClientContext,
    private readonly results: RoundResults,
  ) {
    this.producer = ctx.components.producer ?? honestProducer
  }

  /** Forgets a forward/backward under way (its worker died). */
  reset(): void {
    this.begun = undefined
  }

  /** The speculative round under way (decide.ts ClientView.speculation), until the real round confirms it. */
  get speculation(): {step: number; range: BatchRange} | undefined {
    const b = this.begun
    return b?.speculative ? {step: b.step, range: b.range} : undefined
  }

  /** Whether the worker can undo a speculative round (only then does this client speculate). */
  get canSpeculate(): boolean {
    return this.ctx.worker.discardRound !== undefined
  }

  /**
   * decide.ts's `speculate`: begins the next round's compute now, on the batches this client predicts for it
   * (rules.ts predictNextRound), while this round's results still move. When the round begins with these batches, train
   * (or score) takes it as begun (outcome `used`); otherwise discard undoes it first.
   */
  async speculate(round: Round, range: BatchRange): Promise<boolean> {
    const begun = await this.begin(round, range, true)
    this.ctx.log({event: 'speculation', step: round.step, outcome: 'begun', batches: begun.batches})
    return true
  }

  /** decide.ts's `discard`: the real round gave this client other batches than the speculative round `step` (or none). */
  async discard(step: number, reason: string): Promise<boolean> {
    const begun = this.begun
    if (!begun || begun.step !== step || !begun.speculative) return true
    await begun.done.catch(() => {})
    this.begun = undefined
    await this.ctx.worker.discardRound!(step)
    this.ctx.speculation.discarded++
    this.ctx.log({event: 'speculation', step, outcome: 'discarded', batches: begun.batches, reason})
    return true
  }

  /**
   * Begins `round`'s forward/backward on our batches (unless it is under way): it needs only this round's data, so it
   * runs on the worker while the previous round's accepted results finish downloading (and, as a verifier, are
   * scored: decide.ts's `score` job begins it first); applying them and producing our result come after (train).
   */
  async begin(round: Round, range: BatchRange, speculative = false): Promise<Begun> {
    const begun = this.begun
    if (begun?.step === round.step) {
      if (begun.range.start === range.start && begun.range.end === range.end) {
        if (begun.speculative && !speculative) {
          // the round began as predicted: the work under way (or done) is this round's, bit for bit
          begun.speculative = false
          this.ctx.speculation.used++
          this.ctx.log({event: 'speculation', step: round.step, outcome: 'used', batches: begun.batches})
        }
        return begun
      }
      if (begun.speculative) await this.discard(round.step, `the round gave batches [${range.start}, ${range.end}), not [${begun.range.start}, ${begun.range.end})`)
    }
    const assigned = Array.from({length: range.end - range.start}, (_, i) => range.start + i)
    const ids = this.producer.batches?.(assigned, round) ?? assigned
    const tokens = await this.ctx.data.getSamples(ids)
    const started = performance.now()
    const done = this.ctx.worker.beginRound(tokens, ids.length, round.step, speculative ? {speculative} : undefined).then(() => performance.now() - started)
    // a speculation nobody waits for yet must not be an unhandled rejection (the worker's death is noticed elsewhere)
    done.catch(() => {})
    this.begun = {step: round.step, range: {start: range.start, end: range.end}, batches: ids.length, speculative, done}
    return this.begun
  }

  /**
   * The previous round's results are not all here yet: waits for the forward/backward under way (one request at a
   * time on the worker), which is kept for the retry unless the model was dropped meanwhile.
   */
  async stall(): Promise<void> {
    await this.begun?.done
    if (this.ctx.modelStep === null) this.begun = undefined
  }

  async train(round: Round, range: BatchRange, previous?: Round): Promise<boolean> {
    const ctx = this.ctx
    const begun = await this.begin(round, range)
    let forwardBackwardMs = 0
    let finishing = 0
    const finish = async (results?: Uint8Array[]): Promise<Finished> => {
      forwardBackwardMs = await begun.done
      // finish_round consumes the forward/backward whatever happens: a retry begins the round again
      this.begun = undefined
      finishing = performance.now()
      return ctx.worker.finishRound(round.step, previous && results ? {applyStep: previous.step, results} : undefined)
    }
    let r: Finished
    /** The previous round's event: it waits until our result is out (and the validation loss, when due, is in). */
    let applied: RoundEvent | undefined
    if (previous) {
      const out = await this.results.applyWithTraining(previous, finish)
      if (out.status === 'refused') return false
      if (out.status === 'waiting') {
        await this.stall()
        return ctx.modelStep === null
      }
      applied = out.event
      r = out.value
    } else r = await finish()
    const computeMs = forwardBackwardMs + performance.now() - finishing
    ctx.trainedStep = round.step
    ctx.ledger.at(round.step).trained = {loss: r.loss, resultBytes: r.result.length, computeMs}
    const producing = performance.now()
    const own = await this.publish(round, range, r.result)
    const produceMs = performance.now() - producing
    if (own) this.results.own(own.announcement, own.bytes)
    ctx.flushMessages()
    if (applied) await this.results.report(applied)
    ctx.log({
      event: 'trained',
      step: round.step,
      loss: r.loss,
      batches: begun.batches,
      result_bytes: r.result.length,
      compute_ms: Math.round(computeMs),
      produce_ms: Math.round(produceMs),
    })
    ctx.flushMessages()
    return true
  }

  /** The producer publishes our result; the first announcement it publishes for the round's step is our own. */
  private async publish(round: Round, range: {start: number; end: number}, honest: Uint8Array): Promise<{announcement: ResultAnnouncement; bytes: Uint8Array} | undefined> {
    const ctx = this.ctx
    let first: ResultAnnouncement | undefined
    const producerContext: ProducerContext = {
      step: round.step,
      range,
      honest,
      format: ctx.resultFormat,
      peerResults: (step) => {
        const out = new Map<ClientId, Uint8Array>()
        for (const [id, h] of ctx.ledger.get(step)?.results ?? []) if (id !== ctx.id && h.bytes && h.bytes.length > 0) out.set(id, h.bytes)
        return out
      },
      publish: async (bytes, step = round.step, r = range) => {
        const announcement = await ctx.p2p.publishResult(step, r.start, r.end, bytes)
        if (step === round.step) first ??= announcement
        return announcement
      },
      state: () => ctx.state,
    }
    const kept = await this.producer.publish(producerContext)
    return kept && first ? {announcement: first, bytes: kept} : undefined
  }
}
