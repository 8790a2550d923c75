import type {ReportBody} from '../protocol/messages.js'
import {acceptedOf} from './metrics.js'

const num = (v: unknown): number | null => (typeof v === 'number' && Number.isFinite(v) && v >= 0 ? v : null)
const count = (v: unknown): number => (typeof v === 'number' && Number.isSafeInteger(v) && v >= 0 ? v : 0)

/**
 * Turns a client's event stream into the per-round reports it sends its coordinator (display only: the
 * dashboard's loss, throughput, round-time split and bytes). One report per applied round, built from the
 * round event and this client's trained event of the same step.
 */
export class RoundReporter {
  private readonly trained = new Map<number, Record<string, unknown>>()

  /** seqLen: tokens per sample (tokens/s = batches × seqLen / compute seconds). */
  constructor(private readonly seqLen: number) {}

  observe(e: Record<string, unknown>): {step: number; report: ReportBody} | undefined {
    if (e.event === 'trained' && typeof e.step === 'number') {
      this.trained.set(e.step, e)
      for (const step of this.trained.keys()) if (step < e.step - 4) this.trained.delete(step)
      return undefined
    }
    if (e.event !== 'round' || typeof e.step !== 'number') return undefined
    const t = this.trained.get(e.step)
    this.trained.delete(e.step)
    const computeMs = num(e.compute_ms) ?? num(t?.compute_ms)
    const batches = num(t?.batches)
    return {
      step: e.step,
      report: {
        loss: num(e.loss),
        val_loss: num(e.val_loss),
        tokens_per_second: computeMs && batches ? (batches * this.seqLen) / (computeMs / 1000) : null,
        compute_ms: computeMs,
        apply_ms: num(e.apply_ms),
        result_bytes: num(e.result_bytes),
        bytes_in: count(e.bytes_in),
        bytes_out: count(e.bytes_out),
        applied: count(e.applied),
        accepted: count(acceptedOf(e)),
        peers: count(e.peers),
        rounds_without_exchange: count(e.rounds_without_exchange),
      },
    }
  }
}
