import {existsSync, readFileSync} from 'node:fs'
import {roundTrainers} from '../coordinator/rules.js'
import type {CoordinatorState} from '../coordinator/types.js'
import {PsycheError} from '../errors.js'
import {writeFileAtomicSync} from '../protocol/atomic-file.js'

/**
 * A run's metrics over time, kept by the coordinator server for its dashboard: one point per round, from the
 * server's own events (phase changes: round time, participation, witnesses) and the clients' reports (loss,
 * throughput, compute time, bytes). Saved atomically (temporary file + rename) so a reload or a restarted
 * server shows the same history.
 */

/** One round. Keys are snake_case and stable (the dashboard's /api/history and the saved file). */
export interface HistoryPoint {
  step: number
  epoch: number
  /** Unix milliseconds when the round began (RoundTrain entered). */
  time: number
  /** Wall seconds from this RoundTrain to the next round (or the end of the epoch); null while running. */
  round_seconds: number | null
  /** Median of the reporting clients' compute times; the rest of the round is coordination (round - compute). */
  compute_seconds: number | null
  coordination_seconds: number | null
  trainers: number
  witnesses: number
  /** Mean training loss of the clients that reported the round, and mean validation loss (null: none reported). */
  loss: number | null
  val_loss: number | null
  /** Sum over reporting clients of tokens per second of compute. */
  tokens_per_second: number | null
  /** P2P bytes every reporting client received / sent since its previous report. */
  bytes_in: number
  bytes_out: number
  /** Results applied, out of those accepted (the minimum over reporting clients). */
  applied: number | null
  accepted: number | null
  reports: number
}

/** The latest report of each client: the dashboard's client table. */
export interface ClientRow {
  id: string
  step: number
  loss: number | null
  tokens_per_second: number | null
  bytes_in: number
  bytes_out: number
  peers: number
  /** Rounds in a row in which others trained and none of their results reached it (0: it exchanges). */
  rounds_without_exchange: number
  /** Its last checkpoint save failed: at which step and why (null: its saves go well, or it saves none). */
  checkpoint_save_failed: {step: number; message: string} | null
  /** Unix milliseconds of the report. */
  time: number
}

interface Saved {
  type: 'psyche-metrics-history'
  version: 1
  run_id: string
  points: HistoryPoint[]
  clients: ClientRow[]
}

export const HISTORY_FILE = 'metrics-history.json'
const MAX_POINTS = 20_000
const MAX_CLIENT_ROWS = 10_000

type Report = {
  loss: number | null
  val_loss: number | null
  tokens_per_second: number | null
  compute_ms: number | null
  bytes_in: number
  bytes_out: number
  applied: number
  accepted: number
  peers: number
}
const num = (v: unknown): number | null => (typeof v === 'number' && Number.isFinite(v) ? v : null)
const mean = (xs: number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null)
const median = (xs: number[]) => {
  if (!xs.length) return null
  const s = [...xs].sort((a, b) => a - b)
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2
}

export class RunHistory {
  private readonly points: HistoryPoint[] = []
  private readonly byStep = new Map<number, HistoryPoint>()
  private readonly reports = new Map<number, Map<string, Report>>()
  private readonly clients = new Map<string, ClientRow>()
  private readonly lastBytes = new Map<string, {in: number; out: number}>()
  private roundStart: {step: number; at: number} | undefined
  private dirty = false
  private timer: NodeJS.Timeout | undefined
  private onSaveError: ((error: Error) => void) | undefined
  /** Bumped on every change: watchers poll with it. */
  version = 0

  private constructor(
    readonly runId: string,
    private readonly path: string | undefined,
    private readonly now: () => number,
  ) {}

  /** A history for the run, loaded from `path` when it exists (a file of another run is an error naming it). */
  /**
   * opts.onSaveError: a write of the history (once a second at most, in the background) failed: it is told, and the
   * history is written again at its next change (a failing disk must not end the process that keeps the history).
   */
  static open(runId: string, opts: {path?: string; now?: () => number; onSaveError?: (error: Error) => void} = {}): RunHistory {
    const h = new RunHistory(runId, opts.path, opts.now ?? Date.now)
    h.onSaveError = opts.onSaveError
    if (opts.path && existsSync(opts.path)) h.load(opts.path)
    return h
  }

  private load(path: string): void {
    const bad = (what: string) => new PsycheError(`metrics history ${path}: ${what} (move the file away to start a new history)`, {code: 'EHISTORY'})
    let saved: Saved
    try {
      saved = JSON.parse(readFileSync(path, 'utf8'))
    } catch (error) {
      throw bad(`cannot read: ${(error as Error).message}`)
    }
    if (saved?.type !== 'psyche-metrics-history' || saved.version !== 1 || !Array.isArray(saved.points)) throw bad('not a psyche metrics history (version 1)')
    if (saved.run_id !== this.runId) throw bad(`it is run "${saved.run_id}", this server runs "${this.runId}"`)
    for (const p of saved.points) {
      if (typeof p?.step !== 'number') continue
      this.points.push(p)
      this.byStep.set(p.step, p)
    }
    for (const c of Array.isArray(saved.clients) ? saved.clients : []) if (typeof c?.id === 'string') this.clients.set(c.id, c)
    this.version++
  }

  history(sinceStep = -Infinity): HistoryPoint[] {
    return this.points.filter((p) => p.step > sinceStep)
  }

  clientRows(): ClientRow[] {
    return [...this.clients.values()]
  }

  /** One server event, with the server's state after it. */
  observe(e: Record<string, unknown>, state: CoordinatorState): void {
    if (e.event === 'transition') this.onTransition(e, state)
    else if (e.event === 'client_report') this.onReport(e)
  }

  private onTransition(e: Record<string, unknown>, state: CoordinatorState): void {
    const at = this.now()
    const endRound = () => {
      if (!this.roundStart) return
      const p = this.byStep.get(this.roundStart.step)
      if (p) {
        p.round_seconds = (at - this.roundStart.at) / 1000
        this.split(p)
        // The round's witness proofs, as the coordinator recorded them.
        const r = state.epoch.previous_round?.step === p.step ? state.epoch.previous_round : state.epoch.round?.step === p.step ? state.epoch.round : undefined
        if (r) p.witnesses = r.witnesses.length
      }
      this.roundStart = undefined
      this.changed()
    }
    if (e.to === 'RoundTrain') {
      endRound()
      const round = state.epoch.round
      if (!round) return
      let p = this.byStep.get(round.step)
      if (!p) {
        p = {
          step: round.step,
          epoch: state.progress.epoch,
          time: at,
          round_seconds: null,
          compute_seconds: null,
          coordination_seconds: null,
          trainers: roundTrainers(state.config, round),
          witnesses: 0,
          loss: null,
          val_loss: null,
          tokens_per_second: null,
          bytes_in: 0,
          bytes_out: 0,
          applied: null,
          accepted: null,
          reports: 0,
        }
        this.add(p)
      }
      this.roundStart = {step: round.step, at}
      this.changed()
    } else if (e.to !== 'RoundWitness') {
      endRound()
    }
  }

  private add(p: HistoryPoint): void {
    // Steps only grow within a run; a restarted epoch may repeat a step: the newer point replaces the older.
    const old = this.byStep.get(p.step)
    if (old) this.points.splice(this.points.indexOf(old), 1)
    this.points.push(p)
    this.points.sort((a, b) => a.step - b.step)
    this.byStep.set(p.step, p)
    while (this.points.length > MAX_POINTS) this.byStep.delete(this.points.shift()!.step)
    for (const step of this.reports.keys()) if (step < p.step - 4) this.reports.delete(step)
  }

  private onReport(e: Record<string, unknown>): void {
    const client = typeof e.client === 'string' ? e.client : undefined
    const step = num(e.step)
    if (!client || step === null) return
    const p = this.byStep.get(step)
    let byClient = this.reports.get(step)
    if (!byClient) this.reports.set(step, (byClient = new Map()))
    const saveFailed = saveFailure(e.checkpoint_save_failed)
    if (byClient.has(client)) {
      // One report per client and round; one sent again says how its checkpoint saves go now.
      const row = this.clients.get(client)
      if (row) row.checkpoint_save_failed = saveFailed
      return
    }
    const r: Report = {
      loss: num(e.loss),
      val_loss: num(e.val_loss),
      tokens_per_second: num(e.tokens_per_second),
      compute_ms: num(e.compute_ms),
      bytes_in: num(e.bytes_in) ?? 0,
      bytes_out: num(e.bytes_out) ?? 0,
      applied: num(e.applied) ?? 0,
      accepted: num(e.accepted) ?? 0,
      peers: num(e.peers) ?? 0,
    }
    byClient.set(client, r)
    const last = this.lastBytes.get(client)
    // A restarted client counts from zero again.
    const dIn = last && r.bytes_in >= last.in ? r.bytes_in - last.in : r.bytes_in
    const dOut = last && r.bytes_out >= last.out ? r.bytes_out - last.out : r.bytes_out
    this.lastBytes.set(client, {in: r.bytes_in, out: r.bytes_out})
    if (this.clients.size >= MAX_CLIENT_ROWS && !this.clients.has(client)) this.clients.delete(this.clients.keys().next().value!)
    this.clients.set(client, {
      id: client,
      step,
      loss: r.loss,
      tokens_per_second: r.tokens_per_second,
      bytes_in: r.bytes_in,
      bytes_out: r.bytes_out,
      peers: r.peers,
      rounds_without_exchange: num(e.rounds_without_exchange) ?? 0,
      checkpoint_save_failed: saveFailed,
      time: this.now(),
    })
    if (p) {
      const all = [...byClient.values()]
      const vals = (f: (r: Report) => number | null) => all.map(f).filter((x): x is number => x !== null)
      p.reports = all.length
      p.loss = mean(vals((x) => x.loss))
      p.val_loss = mean(vals((x) => x.val_loss))
      const tps = vals((x) => x.tokens_per_second)
      p.tokens_per_second = tps.length ? tps.reduce((a, b) => a + b, 0) : null
      p.bytes_in += dIn
      p.bytes_out += dOut
      p.applied = Math.min(...all.map((x) => x.applied))
      p.accepted = Math.max(...all.map((x) => x.accepted))
      const compute = vals((x) => x.compute_ms)
      p.compute_seconds = compute.length ? median(compute)! / 1000 : null
      this.split(p)
    }
    this.changed()
  }

  private split(p: HistoryPoint): void {
    p.coordination_seconds = p.round_seconds !== null && p.compute_seconds !== null ? Math.max(0, p.round_seconds - p.compute_seconds) : null
  }

  private changed(): void {
    this.version++
    if (!this.path) return
    this.dirty = true
    // At most one write a second: a round's reports arrive together.
    this.timer ??= setTimeout(() => {
      this.timer = undefined
      try {
        this.save()
      } catch (error) {
        this.dirty = true
        this.onSaveError?.(error as Error)
      }
    }, 1000)
    this.timer.unref()
  }

  /** Writes the history now (atomically), if it changed since the last write. */
  save(): void {
    clearTimeout(this.timer)
    this.timer = undefined
    if (!this.path || !this.dirty) return
    this.dirty = false
    const saved: Saved = {type: 'psyche-metrics-history', version: 1, run_id: this.runId, points: this.points, clients: this.clientRows()}
    writeFileAtomicSync(this.path, JSON.stringify(saved))
  }
}

/** A report's checkpoint_save_failed (validated on the wire), or null. */
function saveFailure(v: unknown): {step: number; message: string} | null {
  if (typeof v !== 'object' || v === null) return null
  const f = v as Record<string, unknown>
  return typeof f.step === 'number' && typeof f.message === 'string' ? {step: f.step, message: f.message} : null
}
