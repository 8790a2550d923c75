import {MAX_SAVE_FAILURE_CHARS, type ReportBody} from '../protocol/messages.js'
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
  /** The last round's report, sent again when the state of the checkpoint saves changes. */
  private last: {step: number; report: ReportBody} | undefined
  /** The last checkpoint save failed: carried in every report until a save succeeds. */
  private saveFailed: {step: number; message: string} | undefined

  /** seqLen: tokens per sample (tokens/s = batches × seqLen / compute seconds). */
  constructor(private readonly seqLen: number) {}

  /**
   * The report to send for the event, if any: a round's, or the last round's again when a checkpoint save fails or a
   * later one succeeds (so that status shows a failed save without waiting for the next round).
   */
  observe(e: Record<string, unknown>): {step: number; report: ReportBody} | undefined {
    if (e.event === 'checkpoint_save_failed' && typeof e.step === 'number') {
      this.saveFailed = {step: e.step, message: oneLine(String(e.message ?? 'unknown error'))}
      return this.resend()
    }
    if (e.event === 'checkpoint_saved' && this.saveFailed) {
      this.saveFailed = undefined
      return this.resend()
    }
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
    this.last = {
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
    if (this.saveFailed) this.last.report.checkpoint_save_failed = this.saveFailed
    return this.last
  }

  private resend(): {step: number; report: ReportBody} | undefined {
    if (!this.last) return undefined
    const {checkpoint_save_failed: _, ...report} = this.last.report
    this.last = {step: this.last.step, report: this.saveFailed ? {...report, checkpoint_save_failed: this.saveFailed} : report}
    return this.last
  }
}

/** A save's error as one line of printable text, within the report's bound. */
function oneLine(message: string): string {
  const line = message.replace(/[\u0000-\u001f\u007f-\u009f]+/g, ' ').trim() || 'unknown error'
  return line.length > MAX_SAVE_FAILURE_CHARS ? `${line.slice(0, MAX_SAVE_FAILURE_CHARS - 1)}…` : line
}
