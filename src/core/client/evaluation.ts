import type {RoundEvent} from '../events.js'
import {WorkerCrashedError} from '../worker/client.js'
import {errorMessage} from '../errors.js'
import type {ClientContext} from './context.js'
import {evalDue, heldOutIds} from './eval.js'

/**
 * Validation (eval.ts): the loss on the held-out samples at the replicated parameters, when due after a round.
 * The worker evaluates while it would otherwise wait for the next round; a failure is logged, never fatal (a dead
 * worker still is: its error goes up).
 */
export class Evaluation {
  /** The held-out samples (decided once, from the run's config and the data; null: none, with an eval_unavailable event). */
  private evalSet: {ids: number[]; source: 'split' | 'tail'; tokens?: Uint32Array} | null | undefined

  constructor(private readonly ctx: ClientContext) {}

  /** Sets `event`'s val_loss and eval_ms when an evaluation is due after its step. */
  async evaluate(event: RoundEvent): Promise<void> {
    const ctx = this.ctx
    const settings = ctx.opts.eval
    if (!settings || !evalDue(event.step, settings, ctx.state.config.total_steps)) return
    if (this.evalSet === undefined) {
      const split = ctx.components.evalData
      const got = heldOutIds(ctx.state, settings, {trainSamples: ctx.data.numSamples(), split: split?.numSamples(), hasSplit: split !== undefined})
      this.evalSet = 'ids' in got ? got : null
      if ('reason' in got) ctx.log({event: 'eval_unavailable', reason: got.reason})
      else ctx.log({event: 'eval_set', source: got.source, samples: got.ids.length, data: (split ?? ctx.data).description})
    }
    const set = this.evalSet
    if (!set) return
    const started = performance.now()
    try {
      set.tokens ??= await (ctx.components.evalData ?? ctx.data).getSamples(set.ids)
      const {loss} = await ctx.worker.evaluate(set.tokens, set.ids.length)
      event.val_loss = loss
      event.eval_ms = Math.round(performance.now() - started)
    } catch (error) {
      if (error instanceof WorkerCrashedError) throw error
      ctx.log({event: 'eval_failed', step: event.step, message: errorMessage(error)})
    }
  }
}
