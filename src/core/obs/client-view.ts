import type {CoordinatorState} from '../coordinator/types.js'
import type {EventLine} from '../events.js'
import {describeEvent, eventSeverity} from './event-text.js'
import {acceptedOf} from './metrics.js'
import {RoundReporter} from './report.js'
import {checkpointNotSavedText, summarizeRun, waitingFor} from './summary.js'
import type {TerminalView} from './terminal-format.js'
import {Warnings} from './terminal-view.js'

/**
 * What a client (`psyche join`) shows of its events: with --json each event as one JSON line; on a terminal the
 * figures of its live view; piped, a plain line for each event worth one. The events are the client's, its P2P
 * node's and its coordinator connection's (core/events.ts).
 */

function mb(bytes: number): string {
  return `${(bytes / 1e6).toFixed(2)} MB`
}

/** Client events the live view lists (news and problems apart: event-text.ts). */
const SHOWN_EVENTS = new Set([
  'waiting',
  'model_loaded',
  'reconnected',
  'rejoining',
  'worker_crashed',
  'worker_restarted',
  'rejected',
  'out_of_sync',
  'health_check',
  'result_fetch_failed',
  'model_fetch_failed',
  'model_peer_dropped',
  'checkpoint_late',
  'checkpoint_rejected',
  'checkpoint_save_failed',
])

/** Events a plain (piped) client prints as a sentence of event-text.ts. */
const NOTED_EVENTS = new Set(['waiting', 'model_loaded', 'worker_crashed', 'worker_restarted', 'rejected', 'out_of_sync', 'health_check', 'rejoining', 'reconnected'])

export class ClientEventRenderer {
  private readonly losses: number[] = []
  private valLoss: number | null = null
  private last: Record<string, unknown> | undefined
  private tokensPerSecond: number | null = null
  /** The last checkpoint save failed (shown on our row until a later save succeeds). */
  private saveFailed: {step: number; message: string} | undefined
  private readonly warnings = new Warnings()
  private readonly notes = new Warnings()
  /** The round reports' throughput (tokens/s), for the live view. */
  private readonly reporter: RoundReporter

  constructor(
    private readonly o: {
      mode: 'json' | 'live' | 'plain'
      /** Tokens per sample (the throughput's unit). */
      seqLen: number
      /** --json: writes one line to stdout. */
      write: (line: string) => void
      /** plain: prints a line that stays. */
      note: (line: string) => void
      /** The coordinator's state as last seen (a finished run's server closing the connection is not news). */
      state: () => CoordinatorState | undefined
    },
  ) {
    this.reporter = new RoundReporter(o.seqLen)
  }

  render(event: EventLine): void {
    const report = this.reporter.observe(event)
    if (event.event === 'checkpoint_save_failed') this.saveFailed = {step: event.step, message: event.message}
    else if (event.event === 'checkpoint_saved') this.saveFailed = undefined
    if (this.o.mode === 'json') return this.o.write(`${JSON.stringify(event)}\n`)
    if (this.o.mode === 'live') {
      if (event.event === 'round') {
        this.last = event
        if (typeof event.loss === 'number') this.losses.push(event.loss)
        if (typeof event.val_loss === 'number') this.valLoss = event.val_loss
        if (this.losses.length > 200) this.losses.shift()
        this.tokensPerSecond = report?.report.tokens_per_second ?? this.tokensPerSecond
      } else if (SHOWN_EVENTS.has(event.event)) {
        // News (a model loaded, a rejoin) apart from what went wrong: the view shows them differently.
        ;(eventSeverity(event) === 'info' ? this.notes : this.warnings).add(describeEvent(event))
      }
      return
    }
    const line = this.plainLine(event)
    if (line !== undefined) this.o.note(line)
  }

  /** A piped client's line for the event, if it is worth one. */
  private plainLine(event: EventLine): string | undefined {
    switch (event.event) {
      case 'round': {
        const loss = typeof event.loss === 'number' ? event.loss.toFixed(3) : '  -  '
        const alone = event.rounds_without_exchange > 0 ? `  NO EXCHANGE: no peer's result for ${event.rounds_without_exchange} round(s)` : ''
        const relayed =
          typeof event.relayed_in === 'number' && event.relayed_in + (event.relayed_out ?? 0) > 0 ? ` (relayed in ${mb(event.relayed_in)} out ${mb(event.relayed_out ?? 0)})` : ''
        return `round ${event.step} (epoch ${event.epoch})  loss ${loss}  hash ${event.param_hash.slice(0, 12)}  peers' results applied ${event.peers_applied}/${event.peers_accepted} accepted (${event.other_trainers} others trained)  connected ${event.peers}  in ${mb(event.bytes_in)}  out ${mb(event.bytes_out)}${relayed}${alone}`
      }
      case 'no_exchange': {
        const unreachable = event.unreachable.map((u) => `${u.peer_id.slice(0, 16)}… at ${u.addrs.join(', ')} (${u.reason})`)
        return `WARNING: ${event.detail}. ${unreachable.length ? `Could not dial: ${unreachable.join('; ')}` : `Connected to ${event.peers} peer(s), yet no result arrived`}. See the README, "Training across machines".`
      }
      case 'checkpoint_saved':
        return `model ${event.staged ? 'staged for upload in' : 'saved to'} ${event.dir} (step ${event.step}, epoch ${event.epoch})`
      case 'checkpoint_save_failed':
        return `error: could not save the model: ${event.message}`
      case 'disconnected':
        // A finished run's server closes every connection: nothing to reconnect to, nothing to report.
        if (event.source === 'coordinator' && this.o.state()?.run_state !== 'Finished') return `disconnected from the coordinator ${event.addr}; reconnecting`
        return undefined
      default: {
        if (!NOTED_EVENTS.has(event.event)) return undefined
        const severity = eventSeverity(event)
        return `${severity === 'info' ? '' : `${severity}: `}${describeEvent(event)}`
      }
    }
  }

  /** The live view: the run as the coordinator's state shows it, and this client's own figures from its round events. */
  view(o: {title: string; me: string; nowSeconds: number}): TerminalView {
    const state = this.o.state()
    const summary = state ? summarizeRun(state, o.nowSeconds) : undefined
    const last = this.last
    const n = (v: unknown) => (typeof v === 'number' ? v : null)
    return {
      title: o.title,
      summary,
      // Our own row from our own round reports; the others' figures are the server's to show (server run, dashboard).
      clients: (summary?.clients ?? []).map((c) =>
        c.id === o.me
          ? {
              name: `${c.id.slice(0, 12)}… (me)`,
              state: c.state,
              step: n(last?.step),
              loss: n(last?.loss),
              ...(this.saveFailed ? {note: checkpointNotSavedText(this.saveFailed)} : {}),
            }
          : {name: `${c.id.slice(0, 12)}…`, state: c.state},
      ),
      losses: this.losses,
      valLoss: this.valLoss,
      tokensPerSecond: this.tokensPerSecond,
      bytesIn: n(last?.bytes_in),
      bytesOut: n(last?.bytes_out),
      applied: n(last?.applied),
      accepted: last ? (acceptedOf(last) ?? null) : null,
      peers: last ? {all: n(last.peers) ?? 0, direct: n(last.conn_direct) ?? n(last.peers_direct), relayed: n(last.conn_relayed) ?? n(last.peers_relayed)} : null,
      warnings: this.warnings.list,
      notes: this.notes.list,
    }
  }
}

/**
 * Outside the epoch (waiting for members, or joined mid-epoch), what a client waits for and about how long: a
 * `waiting` event once per change (also piped and in --json), checked on every state and every half second.
 */
export class WaitingEvents {
  private key = ''

  constructor(private readonly log: (event: EventLine) => void) {}

  check(state: CoordinatorState | undefined, id: string, nowSeconds: number): void {
    if (!state) return
    const w = waitingFor(state, id, nowSeconds)
    const key = w ? `${w.reason} ${state.progress.epoch} ${state.pending.length} ${state.run_state === 'WaitingForMembers' ? '' : state.epoch.clients.length}` : ''
    if (key === this.key) return
    this.key = key
    if (w) this.log({event: 'waiting', reason: w.reason, detail: w.detail, seconds: w.seconds === null ? null : Math.round(w.seconds)})
  }
}
