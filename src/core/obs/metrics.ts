import {createServer, type Server} from 'node:http'
import {Counter, Gauge, Histogram, Registry, collectDefaultMetrics} from 'prom-client'
import {RUN_STATES} from '../layout/layout-table.js'
import {CLIENT_STATES, type CoordinatorState} from '../coordinator/types.js'
import {PsycheError} from '../errors.js'
import type {SaveStatus} from '../protocol/messages.js'

/**
 * Prometheus metrics of a server and of a client, derived from their structured event streams (the `log`
 * callbacks), so the coordinator and client logic stay free of metrics code. Names and units follow the
 * Prometheus conventions: a `psyche_` prefix, base units in the name (`_seconds`, `_bytes`), `_total` on counters.
 */

const TIME_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300]
const SIZE_BUCKETS = [1e3, 4e3, 16e3, 64e3, 256e3, 1e6, 4e6, 16e6, 64e6]
/** Peers with a label of their own in the per-peer byte counters (bounded label cardinality). */
export const MAX_PEER_LABELS = 32

type Event = Record<string, unknown>
const num = (v: unknown): number | undefined => (typeof v === 'number' && Number.isFinite(v) ? v : undefined)
const text = (v: unknown): string | undefined => (typeof v === 'string' && v.length > 0 ? v.slice(0, 64) : undefined)

/**
 * Results the witness quorum accepted in a round event: `accepted` when given, else this client's own applied
 * results plus the peers' accepted ones (peers_applied/peers_accepted), else the round's trainers.
 */
export function acceptedOf(e: Event): number | undefined {
  const applied = num(e.applied)
  const peersApplied = num(e.peers_applied)
  const peersAccepted = num(e.peers_accepted)
  if (num(e.accepted) !== undefined) return num(e.accepted)
  if (applied !== undefined && peersApplied !== undefined && peersAccepted !== undefined) return applied - peersApplied + peersAccepted
  return num(e.trainers)
}

/** The coordinator server's metrics: fed by its log events; run state and clients are read from the state at scrape time. */
export class ServerMetrics {
  readonly registry = new Registry()
  private readonly phaseSeconds: Histogram<'phase'>
  private readonly roundSeconds: Histogram
  private readonly rejected: Counter<'reason'>
  private readonly accepted: Counter<'kind'>
  private readonly reports: Counter
  private readonly transitions: Counter<'to'>
  private phase: {name: string; since: number} | undefined
  private roundStarted: number | undefined

  /** source.saves: a server that saves its state (--save-state-dir): how its saves go (undefined: it saves nothing). */
  constructor(source: {state: () => CoordinatorState; connected: () => number; saves?: () => SaveStatus | undefined}, opts: {now?: () => number} = {}) {
    const now = opts.now ?? (() => performance.now() / 1000)
    this.now = now
    // eslint-disable-next-line @typescript-eslint/no-this-alias -- prom-client calls collect() with the metric as `this`
    const self = this
    const r = this.registry
    collectDefaultMetrics({register: r, prefix: 'psyche_server_'})
    new Gauge({
      name: 'psyche_coordinator_step',
      help: "The run's current step (round number)",
      registers: [r],
      collect() {
        this.set(source.state().progress.step)
      },
    })
    new Gauge({
      name: 'psyche_coordinator_epoch',
      help: "The run's current epoch",
      registers: [r],
      collect() {
        this.set(source.state().progress.epoch)
      },
    })
    new Gauge({
      name: 'psyche_coordinator_run_state',
      help: "The coordinator's phase: 1 for the current one, 0 for the others",
      labelNames: ['state'],
      registers: [r],
      collect() {
        const s = source.state().run_state
        for (const state of RUN_STATES) this.set({state}, state === s ? 1 : 0)
      },
    })
    new Gauge({
      name: 'psyche_coordinator_phase_elapsed_seconds',
      help: 'Seconds since the coordinator entered its current phase',
      registers: [r],
      collect() {
        this.set(self.phase ? now() - self.phase.since : 0)
      },
    })
    new Gauge({
      name: 'psyche_clients',
      help: 'Clients of the current epoch by state, and clients pending for the next epoch (state="Pending")',
      labelNames: ['state'],
      registers: [r],
      collect() {
        const s = source.state()
        for (const state of CLIENT_STATES) this.set({state}, s.epoch.clients.filter((c) => c.state === state).length + s.epoch.exited.filter((c) => c.state === state).length)
        this.set({state: 'Pending'}, s.pending.length)
      },
    })
    new Gauge({
      name: 'psyche_coordinator_connections',
      help: 'Clients connected to the server now (said hello)',
      registers: [r],
      collect() {
        this.set(source.connected())
      },
    })
    new Gauge({
      name: 'psyche_coordinator_round_witnesses',
      help: 'Witness proofs received for the current round',
      registers: [r],
      collect() {
        this.set(source.state().epoch.round?.witnesses.length ?? 0)
      },
    })
    if (source.saves) {
      const saves = source.saves
      new Gauge({
        name: 'psyche_coordinator_save_failures_in_a_row',
        help: 'Saves of the coordinator state (--save-state-dir) that failed since the last one that succeeded: above 0 the state on disk is behind; at --max-save-failures the server halts',
        registers: [r],
        collect() {
          const s = saves()
          if (s) this.set(s.failures_in_a_row)
        },
      })
      let counted = 0
      new Counter({
        name: 'psyche_coordinator_save_failures_total',
        help: 'Saves of the coordinator state that failed since the server started',
        registers: [r],
        collect() {
          const s = saves()
          if (s && s.failures > counted) this.inc(s.failures - counted)
          if (s) counted = s.failures
        },
      })
      new Gauge({
        name: 'psyche_coordinator_saved_step',
        help: 'The step of the last coordinator state saved to disk',
        registers: [r],
        collect() {
          const s = saves()
          if (s?.last_saved_step != null) this.set(s.last_saved_step)
        },
      })
    }
    this.phaseSeconds = new Histogram({
      name: 'psyche_coordinator_phase_duration_seconds',
      help: 'How long each completed phase lasted',
      labelNames: ['phase'],
      buckets: TIME_BUCKETS,
      registers: [r],
    })
    this.roundSeconds = new Histogram({
      name: 'psyche_coordinator_round_duration_seconds',
      help: 'Wall time from one RoundTrain to the next (or the end of the epoch)',
      buckets: TIME_BUCKETS,
      registers: [r],
    })
    this.rejected = new Counter({
      name: 'psyche_coordinator_rejected_messages_total',
      help: 'Messages refused by the server, by reason code',
      labelNames: ['reason'],
      registers: [r],
    })
    this.accepted = new Counter({
      name: 'psyche_coordinator_accepted_messages_total',
      help: 'Client messages the coordinator applied, by kind',
      labelNames: ['kind'],
      registers: [r],
    })
    this.reports = new Counter({name: 'psyche_coordinator_client_reports_total', help: 'Per-round metric reports received from clients', registers: [r]})
    this.transitions = new Counter({name: 'psyche_coordinator_transitions_total', help: 'Phase changes, by the phase entered', labelNames: ['to'], registers: [r]})
  }

  private readonly now: () => number

  /** One server log event. */
  observe(e: Event): void {
    switch (e.event) {
      case 'listening':
      case 'resumed':
        if (!this.phase && text(e.run_state)) this.phase = {name: text(e.run_state)!, since: this.now()}
        break
      case 'transition': {
        const to = text(e.to)
        const t = this.now()
        if (this.phase && this.phase.name !== to) this.phaseSeconds.observe({phase: this.phase.name}, t - this.phase.since)
        if (to) {
          this.transitions.inc({to})
          if (!this.phase || this.phase.name !== to) this.phase = {name: to, since: t}
          // A new round: RoundTrain entered (from RoundWitness, or the first of the epoch from Warmup).
          if (to === 'RoundTrain') {
            if (this.roundStarted !== undefined && e.from === 'RoundWitness') this.roundSeconds.observe(t - this.roundStarted)
            this.roundStarted = t
          } else if (to !== 'RoundWitness') {
            if (this.roundStarted !== undefined && e.from === 'RoundWitness') this.roundSeconds.observe(t - this.roundStarted)
            this.roundStarted = undefined
          }
        }
        break
      }
      case 'rejected':
        this.rejected.inc({reason: text(e.code) ?? 'unknown'})
        break
      case 'accepted':
        this.accepted.inc({kind: text(e.kind) ?? 'unknown'})
        break
      case 'client_report':
        this.reports.inc()
        break
    }
  }
}

/** A client's metrics, fed by its event stream (PsycheClient's `log`). */
export class ClientMetrics {
  readonly registry = new Registry()
  private readonly step: Gauge
  private readonly epoch: Gauge
  private readonly loss: Gauge
  private readonly valLoss: Gauge
  private readonly evalSeconds: Histogram
  private readonly tokensPerSecond: Gauge
  private readonly compute: Histogram
  private readonly apply: Histogram
  private readonly produce: Histogram
  private readonly resultBytes: Histogram
  private readonly received: Counter
  private readonly sent: Counter
  private readonly peerReceived: Counter<'peer'>
  private readonly peerSent: Counter<'peer'>
  private readonly peerLabels = new Map<string, string>()
  private readonly relayedReceived: Counter
  private readonly relayedSent: Counter
  private readonly peerRelayedReceived: Counter<'peer'>
  private readonly peerRelayedSent: Counter<'peer'>
  private readonly withoutExchange: Gauge
  private readonly checkpointSaveFailed: Gauge
  private readonly checkpointSaveFailures: Counter
  private lastRelayedIn = 0
  private lastRelayedOut = 0
  private readonly peers: Gauge
  private readonly connections: Gauge<'kind'>
  private readonly rejected: Counter<'reason'>
  private readonly rounds: Counter
  private readonly applied: Gauge
  private readonly accepted: Gauge
  private readonly witness: Counter
  private readonly trainedBatches: Counter
  private readonly trainedTokens: Counter
  private readonly workerRestarts: Counter
  private readonly workerCrashes: Counter
  private lastIn = 0
  private lastOut = 0
  private readonly lastPeer = new Map<string, number>()

  /** seqLen: tokens per sample, for tokens/s. */
  constructor(opts: {seqLen: number}) {
    const r = this.registry
    const seqLen = opts.seqLen
    this.seqLen = seqLen
    collectDefaultMetrics({register: r, prefix: 'psyche_client_'})
    this.step = new Gauge({name: 'psyche_client_step', help: 'The last round this client applied', registers: [r]})
    this.epoch = new Gauge({name: 'psyche_client_epoch', help: 'The epoch of the last round this client applied', registers: [r]})
    this.loss = new Gauge({name: 'psyche_client_loss', help: "Training loss of this client's batches in its last trained round (nats per token)", registers: [r]})
    this.valLoss = new Gauge({
      name: 'psyche_client_validation_loss',
      help: 'Loss on the held-out samples at the parameters after the last evaluated round (nats per token; the same on every replica)',
      registers: [r],
    })
    this.evalSeconds = new Histogram({
      name: 'psyche_client_eval_duration_seconds',
      help: 'Worker time of one validation (the held-out samples)',
      buckets: TIME_BUCKETS,
      registers: [r],
    })
    this.tokensPerSecond = new Gauge({name: 'psyche_client_tokens_per_second', help: 'Tokens trained per second of compute in the last trained round', registers: [r]})
    this.compute = new Histogram({
      name: 'psyche_client_compute_duration_seconds',
      help: 'Worker time to train a round (forward/backward, DisTrO compression)',
      buckets: TIME_BUCKETS,
      registers: [r],
    })
    this.apply = new Histogram({
      name: 'psyche_client_apply_duration_seconds',
      help: "Time to apply a round's accepted results (download wait + worker apply)",
      buckets: TIME_BUCKETS,
      registers: [r],
    })
    this.produce = new Histogram({
      name: 'psyche_client_produce_duration_seconds',
      help: 'Time from a trained result to its announcement to peers (hash, sign, publish)',
      buckets: TIME_BUCKETS,
      registers: [r],
    })
    this.resultBytes = new Histogram({name: 'psyche_client_result_size_bytes', help: "Size of this client's compressed result per round", buckets: SIZE_BUCKETS, registers: [r]})
    this.received = new Counter({name: 'psyche_p2p_received_bytes_total', help: 'Bytes of results and models downloaded from peers', registers: [r]})
    this.sent = new Counter({name: 'psyche_p2p_sent_bytes_total', help: 'Bytes of results and models served to peers', registers: [r]})
    this.peerReceived = new Counter({
      name: 'psyche_p2p_peer_received_bytes_total',
      help: `Bytes of results and models downloaded from each peer (its client id's first 16 characters; peers after the first ${MAX_PEER_LABELS} count as "other")`,
      labelNames: ['peer'],
      registers: [r],
    })
    this.peerSent = new Counter({
      name: 'psyche_p2p_peer_sent_bytes_total',
      help: `Bytes of results and models served to each peer (its client id's first 16 characters; peers after the first ${MAX_PEER_LABELS} count as "other")`,
      labelNames: ['peer'],
      registers: [r],
    })
    this.relayedReceived = new Counter({
      name: 'psyche_p2p_relayed_received_bytes_total',
      help: "Of psyche_p2p_received_bytes_total, bytes that came through a circuit relay (each crossed the relay operator's link twice)",
      registers: [r],
    })
    this.relayedSent = new Counter({name: 'psyche_p2p_relayed_sent_bytes_total', help: 'Of psyche_p2p_sent_bytes_total, bytes that went through a circuit relay', registers: [r]})
    this.peerRelayedReceived = new Counter({
      name: 'psyche_p2p_peer_relayed_received_bytes_total',
      help: 'Of psyche_p2p_peer_received_bytes_total, bytes that came through a circuit relay, per peer',
      labelNames: ['peer'],
      registers: [r],
    })
    this.peerRelayedSent = new Counter({
      name: 'psyche_p2p_peer_relayed_sent_bytes_total',
      help: 'Of psyche_p2p_peer_sent_bytes_total, bytes that went through a circuit relay, per peer',
      labelNames: ['peer'],
      registers: [r],
    })
    this.withoutExchange = new Gauge({
      name: 'psyche_client_rounds_without_exchange',
      help: 'Rounds in a row in which other clients trained and none of their results reached this client (0: exchanging); see join --max-rounds-without-exchange',
      registers: [r],
    })
    this.checkpointSaveFailed = new Gauge({
      name: 'psyche_client_checkpoint_save_failed',
      help: "1 while this client's last checkpoint save (join --checkpoint-dir, or a checkpointer's) failed; 0 once one succeeds",
      registers: [r],
    })
    this.checkpointSaveFailures = new Counter({name: 'psyche_client_checkpoint_save_failures_total', help: 'Checkpoint saves that failed', registers: [r]})
    this.peers = new Gauge({name: 'psyche_p2p_peers', help: 'Connected libp2p peers', registers: [r]})
    this.connections = new Gauge({
      name: 'psyche_p2p_connections',
      help: 'libp2p connections now, by kind: direct, or relayed through a circuit relay',
      labelNames: ['kind'],
      registers: [r],
    })
    this.rejected = new Counter({
      name: 'psyche_client_rejected_messages_total',
      help: 'Messages refused: by the coordinator (its reason code) or by this client (announcements, results)',
      labelNames: ['reason'],
      registers: [r],
    })
    this.rounds = new Counter({name: 'psyche_client_rounds_applied_total', help: 'Rounds this client applied', registers: [r]})
    this.applied = new Gauge({name: 'psyche_client_results_applied', help: 'Results applied in the last applied round', registers: [r]})
    this.accepted = new Gauge({
      name: 'psyche_client_results_accepted',
      help: "Results the witness quorum accepted in the last applied round (the round's trainers when not reported)",
      registers: [r],
    })
    this.witness = new Counter({name: 'psyche_client_witness_proofs_total', help: 'Witness proofs this client sent', registers: [r]})
    this.trainedBatches = new Counter({name: 'psyche_client_trained_batches_total', help: 'Batches (sequences) this client trained', registers: [r]})
    this.trainedTokens = new Counter({name: 'psyche_client_trained_tokens_total', help: 'Tokens (batches × sequence length) this client trained', registers: [r]})
    this.workerRestarts = new Counter({
      name: 'psyche_worker_restarts_total',
      help: 'PyTorch worker processes this client started again after its worker died',
      registers: [r],
    })
    this.workerCrashes = new Counter({name: 'psyche_worker_crashes_total', help: 'PyTorch worker processes of this client that died unexpectedly', registers: [r]})
  }

  private readonly seqLen: number

  /** One client event. */
  observe(e: Event): void {
    switch (e.event) {
      case 'worker_restarted':
        this.workerRestarts.inc()
        break
      case 'trained': {
        const computeMs = num(e.compute_ms)
        const batches = num(e.batches)
        if (num(e.loss) !== undefined) this.loss.set(num(e.loss)!)
        if (computeMs !== undefined) this.compute.observe(computeMs / 1000)
        if (computeMs && batches) this.tokensPerSecond.set((batches * this.seqLen) / (computeMs / 1000))
        if (batches) {
          this.trainedBatches.inc(batches)
          this.trainedTokens.inc(batches * this.seqLen)
        }
        if (num(e.result_bytes) !== undefined) this.resultBytes.observe(num(e.result_bytes)!)
        if (num(e.produce_ms) !== undefined) this.produce.observe(num(e.produce_ms)! / 1000)
        break
      }
      case 'round': {
        if (num(e.step) !== undefined) this.step.set(num(e.step)!)
        if (num(e.epoch) !== undefined) this.epoch.set(num(e.epoch)!)
        this.rounds.inc()
        if (num(e.applied) !== undefined) this.applied.set(num(e.applied)!)
        const accepted = acceptedOf(e)
        if (accepted !== undefined) this.accepted.set(accepted)
        if (num(e.apply_ms) !== undefined) this.apply.observe(num(e.apply_ms)! / 1000)
        if (num(e.val_loss) !== undefined) this.valLoss.set(num(e.val_loss)!)
        if (num(e.eval_ms) !== undefined) this.evalSeconds.observe(num(e.eval_ms)! / 1000)
        const bytesIn = num(e.bytes_in)
        const bytesOut = num(e.bytes_out)
        if (bytesIn !== undefined && bytesIn >= this.lastIn) this.received.inc(bytesIn - this.lastIn)
        if (bytesOut !== undefined && bytesOut >= this.lastOut) this.sent.inc(bytesOut - this.lastOut)
        if (bytesIn !== undefined) this.lastIn = bytesIn
        if (bytesOut !== undefined) this.lastOut = bytesOut
        if (num(e.peers) !== undefined) this.peers.set(num(e.peers)!)
        const direct = num(e.conn_direct) ?? num(e.peers_direct)
        const relayed = num(e.conn_relayed) ?? num(e.peers_relayed)
        if (direct !== undefined) this.connections.set({kind: 'direct'}, direct)
        if (relayed !== undefined) this.connections.set({kind: 'relayed'}, relayed)
        this.observePeerBytes(e.peer_bytes, this.peerReceived, this.peerSent, '')
        const relayedIn = num(e.relayed_in)
        const relayedOut = num(e.relayed_out)
        if (relayedIn !== undefined && relayedIn >= this.lastRelayedIn) this.relayedReceived.inc(relayedIn - this.lastRelayedIn)
        if (relayedOut !== undefined && relayedOut >= this.lastRelayedOut) this.relayedSent.inc(relayedOut - this.lastRelayedOut)
        if (relayedIn !== undefined) this.lastRelayedIn = relayedIn
        if (relayedOut !== undefined) this.lastRelayedOut = relayedOut
        this.observePeerBytes(e.peer_relayed_bytes, this.peerRelayedReceived, this.peerRelayedSent, 'relayed')
        if (num(e.rounds_without_exchange) !== undefined) this.withoutExchange.set(num(e.rounds_without_exchange)!)
        break
      }
      case 'witness':
        this.witness.inc()
        break
      case 'rejected':
        this.rejected.inc({reason: text(e.code) ?? 'unknown'})
        break
      case 'announcement_ignored':
        this.rejected.inc({reason: 'announcement_not_assigned'})
        break
      case 'result_fetch_failed':
        this.rejected.inc({reason: 'result_fetch_failed'})
        break
      case 'worker_crashed':
        this.workerCrashes.inc()
        break
      case 'checkpoint_save_failed':
        this.checkpointSaveFailed.set(1)
        this.checkpointSaveFailures.inc()
        break
      case 'checkpoint_saved':
        this.checkpointSaveFailed.set(0)
        break
    }
  }

  /**
   * peer_bytes: {peer: {in, out}} cumulative, as the round event carries it. Label cardinality is bounded: the
   * first MAX_PEER_LABELS peers seen get their own `peer` label (the first 16 characters of the client id), any
   * later peer counts under peer="other".
   */
  private observePeerBytes(v: unknown, peerReceived: Counter<'peer'>, peerSent: Counter<'peer'>, kind: string): void {
    if (!v || typeof v !== 'object') return
    for (const [peer, b] of Object.entries(v as Record<string, unknown>).slice(0, 1024)) {
      if (!b || typeof b !== 'object') continue
      let label = this.peerLabels.get(peer)
      if (label === undefined) {
        label = peer !== 'other' && this.peerLabels.size < MAX_PEER_LABELS ? peer.slice(0, 16) : 'other'
        this.peerLabels.set(peer, label)
      }
      for (const [direction, counter] of [
        ['in', peerReceived],
        ['out', peerSent],
      ] as const) {
        const total = num((b as Record<string, unknown>)[direction])
        if (total === undefined) continue
        const key = `${peer}\0${direction}\0${kind}`
        const last = this.lastPeer.get(key) ?? 0
        if (total > last) counter.inc({peer: label}, total - last)
        this.lastPeer.set(key, total)
      }
    }
  }
}

/** An HTTP endpoint serving GET /metrics from a registry (Prometheus text format). */
export async function serveMetrics(registry: Registry, opts: {port: number; host?: string}): Promise<{port: number; close: () => Promise<void>}> {
  const server: Server = createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0]
    if (req.method !== 'GET' || (path !== '/metrics' && path !== '/')) {
      res.writeHead(404, {'content-type': 'text/plain'}).end('not found: metrics are at /metrics\n')
      return
    }
    registry.metrics().then(
      (body) => res.writeHead(200, {'content-type': registry.contentType}).end(body),
      (error: Error) => res.writeHead(500, {'content-type': 'text/plain'}).end(`${error.message}\n`),
    )
  })
  const host = opts.host ?? '127.0.0.1'
  await new Promise<void>((resolve, reject) => {
    server.once('error', (error: NodeJS.ErrnoException) =>
      reject(new PsycheError(`--metrics-port: cannot listen on ${host}:${opts.port}: ${error.code ?? error.message}`, {cause: error})),
    )
    server.listen(opts.port, host, () => resolve())
  })
  const address = server.address()
  return {
    port: typeof address === 'object' && address ? address.port : opts.port,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  }
}
