import type {PeerDirectory, RejectionInfo} from '../backend/types.js'
import {buildWitnessProof, wasEjected, type ClientId, type CoordinatorState} from '../coordinator/index.js'
import {errorMessage, PsycheError} from '../errors.js'
import {WorkerCrashedError} from '../worker/client.js'
import {Checkpointing} from './checkpointing.js'
import {whenToDial, type DialedFrom} from './peer-connect.js'
import type {ClientComponents} from './components.js'
import {ClientContext} from './context.js'
import {finalRounds, messagesToSend, nextWork, type ClientView, type Message, type Work} from './decide.js'
import {Evaluation} from './evaluation.js'
import {ExchangeHealth} from './exchange-health.js'
import {ModelLoading} from './model-loading.js'
import type {ClientOptions, ClientSummary} from './options.js'
import {RoundResults} from './round-results.js'
import {Training} from './training.js'
import {Verification} from './verification.js'

export type {ClientOptions, ClientSummary} from './options.js'
export type {ProducerContext, ResultProducer} from './components.js'
/** One line per applied round (declared with every other event in core/events.ts). */
export type {RoundEvent} from '../events.js'
export {DEFAULT_MAX_ROUNDS_WITHOUT_EXCHANGE} from './exchange-health.js'

/** In Warmup, how long a loaded client waits to be connected to its peers before it reports ready anyway. */
const WARMUP_CONNECT_WAIT_MS = 20_000

/**
 * The client's I/O loop: follows the coordinator's state pushes, and dispatches what decide.ts says — work on
 * the worker one piece at a time (to the phase that does it: model-loading.ts, verification.ts, round-results.ts,
 * training.ts), messages to the coordinator as soon as they are due. Results travel over the P2P layer: ours
 * are published after training; everyone else's are downloaded as soon as announced. Its parts (backend, p2p,
 * worker, data, clock, and a result producer) come from outside: see components.ts.
 */
export class PsycheClient {
  /** What the phases share: the run's state, our model's position, the per-step ledger. */
  private readonly ctx: ClientContext
  private readonly models: ModelLoading
  private readonly verification: Verification
  /** A round's results, from announcement to applied. */
  private readonly results: RoundResults
  private readonly training: Training
  private readonly checkpointing: Checkpointing
  private warmupReported: number | null = null
  /** The step whose Cooldown witness we sent (decide.ts messagesToSend). */
  private cooldownWitnessSent: number | null = null
  private knownTopicPeers = 0
  /** What we last handed the P2P layer the run's members from (connectPeers), and whether a held-back plan is due. */
  private dialedFrom: DialedFrom | undefined
  private dialDue = false
  private wake: (() => void) | undefined
  private lastJoinAttempt = Number.NEGATIVE_INFINITY
  /** The epoch record (its start_time) in which we found ourselves ejected (logged once per epoch). */
  private bannedEpochStart: number | undefined
  private workerGone: WorkerCrashedError | undefined
  private connectionLost: PsycheError | undefined
  private readyWaitSince: number | undefined
  private workerRestarts = 0
  /** Steps in whose witness window we still wait for downloads in flight (decide.ts messagesToSend). */
  private readonly witnessGrace = new Set<number>()
  private readonly witnessWindowsSeen = new Set<number>()

  private constructor(
    private readonly opts: ClientOptions,
    private readonly components: ClientComponents,
  ) {
    const ctx = (this.ctx = new ClientContext(
      opts,
      components,
      () => this.flushMessages(),
      () => this.poke(),
    ))
    this.models = new ModelLoading(ctx)
    this.verification = new Verification(ctx)
    this.checkpointing = new Checkpointing(ctx)
    this.results = new RoundResults(ctx, new Evaluation(ctx), new ExchangeHealth(ctx), this.checkpointing)
    this.training = new Training(ctx, this.results)
  }

  get id(): ClientId {
    return this.opts.id
  }

  /**
   * Wires the components together and joins the run (resolves once the first state is in). From here on the
   * client owns the components: run() (or a failed start) stops them all.
   */
  static async start(opts: ClientOptions, components: ClientComponents): Promise<PsycheClient> {
    const client = new PsycheClient(opts, components)
    const {worker, p2p} = components
    try {
      p2p.onAnnouncement((a) => client.results.onAnnouncement(a))
      client.watchWorker(worker)
      p2p.serveModel(async () => {
        if (!client.ctx.snapshot) throw new PsycheError('no model loaded yet')
        return client.ctx.snapshot
      })
      await client.connect()
      // New addresses (a relay reservation, a confirmed observed address) go to every peer through the coordinator.
      p2p.onAddressesChanged?.((addrs) => client.ctx.conn.sendAddresses?.(addrs))
      opts.log({event: 'started', client_id: opts.id, p2p: p2p.addresses(), worker_pid: worker.pid})
      return client
    } catch (error) {
      client.ctx.stopped = true
      await p2p.stop().catch(() => {})
      await components.data.close().catch(() => {})
      await components.evalData?.close().catch(() => {})
      await worker.shutdown().catch(() => {})
      throw error
    }
  }

  /** A worker that dies while we wait for the next round is noticed at once, not at the next request. */
  private watchWorker(worker: ClientComponents['worker']): void {
    void worker.exited.then((why) => {
      if (this.ctx.stopped || this.ctx.worker !== worker) return
      this.workerGone = why instanceof WorkerCrashedError ? why : new WorkerCrashedError(`worker${worker.pid === undefined ? '' : ` (pid ${worker.pid})`} exited unexpectedly`)
      this.poke()
    })
  }

  /**
   * Replaces a dead worker (components.restartWorker), up to opts.workerRestarts times; false when not allowed.
   * The model died with it: we withdraw from the epoch at once (peers need not wait for our results, nor drop us by
   * health checks), and the work loop rejoins and loads the model from a peer at the next epoch.
   */
  private async replaceWorker(error: WorkerCrashedError): Promise<boolean> {
    const restart = this.components.restartWorker
    if (!restart || this.ctx.stopped || this.workerRestarts >= (this.opts.workerRestarts ?? 0)) return false
    this.workerRestarts++
    this.opts.log({event: 'worker_crashed', message: error.message, restarting: true})
    this.ctx.conn.sendWithdraw()
    await this.ctx.worker.shutdown().catch(() => {})
    this.ctx.modelStep = null
    this.ctx.snapshot = undefined
    this.training.reset()
    this.ctx.worker = await restart()
    this.workerGone = undefined
    this.watchWorker(this.ctx.worker)
    this.opts.log({event: 'worker_restarted', restarts: this.workerRestarts, worker_pid: this.ctx.worker.pid})
    return true
  }

  private async connect(): Promise<void> {
    const conn = await this.components.backend.connect({p2pAddrs: this.ctx.p2p.addresses()})
    const runSeqLen = conn.state!.model.LLM.max_seq_len
    if (runSeqLen !== this.opts.plan.seqLen) {
      await conn.close()
      throw new PsycheError(
        `run ${this.opts.runId}: the coordinator trains sequences of ${runSeqLen} tokens, but this client's config gives ${this.opts.plan.seqLen} (pass the run's state.toml with --config)`,
      )
    }
    this.ctx.conn = conn
    conn.on('state', (s: CoordinatorState, peers: PeerDirectory) => {
      if (this.ctx.conn === conn) this.onState(s, peers)
    })
    conn.on('rejected', (reason: string, info: RejectionInfo) => this.opts.log({event: 'rejected', reason, ...info}))
    conn.on('reconnected', () => {
      // A restarted server resumes from its last saved transition: proofs sent since may be lost. Forget what we
      // sent; decide.ts re-sends what the pushed state does not record.
      this.ctx.ledger.forgetWitnessesSent()
      this.warmupReported = null
      this.cooldownWitnessSent = null
      this.opts.log({event: 'reconnected'})
      this.useRelays()
      this.flushMessages()
    })
    conn.on('closed', () => {
      // The coordinator refused us for good while reconnecting: nothing left to follow.
      if (this.ctx.conn !== conn || this.ctx.stopped) return
      this.connectionLost = new PsycheError(`${this.components.backend.description} closed the connection for good (see the rejected event)`, {code: 'ECOORDINATOR'})
      this.poke()
    })
    // The first state arrived during connect(), before these listeners.
    this.onState(conn.state!, conn.peers)
    this.useRelays()
  }

  /** Reserve a slot on the coordinator's relay (and any --relay): peers behind NAT reach us through it. */
  private useRelays(): void {
    if (this.opts.relay === false || !this.ctx.p2p.useRelays) return
    const relays = [...(this.opts.relays ?? []), ...(this.ctx.conn.relayAddrs ?? [])]
    if (relays.length === 0) return
    this.opts.log({event: 'relay', addrs: relays})
    void this.ctx.p2p.useRelays(relays)
  }

  private view(): ClientView {
    return {
      id: this.id,
      modelStep: this.ctx.modelStep,
      trainedStep: this.ctx.trainedStep,
      warmupReported: this.warmupReported,
      witnessSent: this.ctx.ledger.witnessSent(),
      healthChecked: this.ctx.ledger.healthChecked(),
      scored: this.ctx.ledger.scored(),
      finalRounds: this.ctx.ledger.finalRounds(),
      results: this.ctx.ledger.results(),
      accused: this.ctx.accused,
      witnessGrace: this.witnessGrace,
      paramHash: this.ctx.lastHash,
      cooldownWitnessSent: this.cooldownWitnessSent,
      canSpeculate: this.training.canSpeculate && this.opts.speculate !== false,
      speculation: this.training.speculation,
    }
  }

  /** On a step's first RoundWitness: wait up to half the window for results still downloading, then send what we have. */
  private startWitnessGrace(state: CoordinatorState): void {
    const round = state.epoch.round
    if (state.run_state !== 'RoundWitness' || !round || this.witnessWindowsSeen.has(round.step)) return
    this.witnessWindowsSeen.add(round.step)
    for (const step of this.witnessWindowsSeen) if (step < round.step - 1) this.witnessWindowsSeen.delete(step)
    this.witnessGrace.add(round.step)
    void this.ctx.clock.sleep((state.config.round_witness_time * 1000) / 2).then(() => {
      this.witnessGrace.delete(round.step)
      this.flushMessages()
    })
  }

  private poke(): void {
    const wake = this.wake
    this.wake = undefined
    wake?.()
  }

  private onState(state: CoordinatorState, peers: PeerDirectory): void {
    this.ctx.state = state
    const round = state.epoch.round
    if (round) this.ctx.ledger.at(round.step).epoch ??= state.progress.epoch
    for (const r of finalRounds(state)) this.ctx.ledger.at(r.step).finalRound = r
    this.startWitnessGrace(state)
    this.checkpointing.onState()
    this.connectPeers(state, peers)
    this.flushMessages()
    this.poke()
  }

  /**
   * Connects to the run's members (p2p.connect: all of them in a small run, our overlay neighbours in a large one):
   * not on every state, but when peer-connect.ts whenToDial says so; a plan it holds back runs when its gap ends.
   */
  private connectPeers(state: CoordinatorState, peers: PeerDirectory): void {
    const now = this.ctx.clock.now()
    const when = whenToDial(this.dialedFrom, state, peers, now, this.id, (ids) => this.ctx.p2p.notConnected?.(ids) ?? ids)
    if (when.dial === 'plan' || when.dial === 'retry') {
      this.dialedFrom = {clients: state.epoch.clients, runState: state.run_state, peers, at: now}
      const addrs: string[] = []
      for (const [id, a] of Object.entries(peers)) if (id !== this.id) addrs.push(...a)
      void this.ctx.p2p.connect(addrs, {retry: when.dial === 'retry'}).then(() => this.reannounceIfNewPeers())
      return
    }
    if (when.dial === 'later' && !this.dialDue) {
      this.dialDue = true
      void this.ctx.clock.sleep(when.inMs).then(() => {
        this.dialDue = false
        if (!this.ctx.stopped && this.ctx.state && this.ctx.conn) this.connectPeers(this.ctx.state, this.ctx.conn.peers)
      })
    }
    void this.reannounceIfNewPeers()
  }

  /** Gossip is not replayed to peers that subscribe later: publish our latest result again when new ones appear. */
  private async reannounceIfNewPeers(): Promise<void> {
    const n = this.ctx.p2p.topicPeers()
    if (n <= this.knownTopicPeers) return
    this.knownTopicPeers = n
    const latest = this.ctx.ledger.get(this.ctx.trainedStep)?.own
    if (latest) await this.ctx.p2p.reannounce(latest).catch((e) => this.opts.log({event: 'reannounce_failed', message: errorMessage(e)}))
  }

  private flushMessages(): void {
    if (!this.ctx.state || this.ctx.stopped) return
    for (const m of messagesToSend(this.ctx.state, this.view())) this.send(m)
  }

  private send(m: Message): void {
    switch (m.kind) {
      case 'warmup_ready':
        if (!this.peersReachable()) return
        if (this.ctx.conn.sendWarmupReady()) {
          this.readyWaitSince = undefined
          this.warmupReported = m.epoch
          this.opts.log({event: 'warmup_ready', epoch: m.epoch, step: this.ctx.modelStep})
        }
        return
      case 'witness': {
        const round = this.ctx.state.epoch.round!
        const proof = buildWitnessProof(
          this.ctx.state.config,
          round,
          m.seen.map((r) => ({id: r.client_id, range: {start: r.batch_start, end: r.batch_end}, commitment: Buffer.from(r.commitment, 'hex')})),
        )
        if (this.ctx.conn.sendWitness(m.step, proof)) {
          this.ctx.ledger.at(m.step).witnessSent = true
          this.opts.log({event: 'witness', step: m.step, seen: m.seen.length})
        }
        return
      }
      case 'cooldown_witness': {
        const send = this.ctx.conn.sendCooldownWitness
        // A backend that cannot carry it: nothing to retry.
        if (!send) this.cooldownWitnessSent = m.step
        else if (send.call(this.ctx.conn, m.step, m.param_hash)) {
          this.cooldownWitnessSent = m.step
          this.opts.log({event: 'cooldown_witness', step: m.step, param_hash: m.param_hash})
        }
        return
      }
      case 'accuse':
        if (this.ctx.conn.sendAccusation(m.step, m.accused, 'invalid_result')) {
          this.ctx.accused.add(`${m.step}:${m.accused}`)
          this.opts.log({event: 'accused', step: m.step, client_id: m.accused, reason: m.detail})
        }
        return
      case 'health_check':
        this.ctx.ledger.at(m.judged).healthChecked = true
        if (m.accused.length > 0 && this.ctx.conn.sendHealthCheck(m.step, m.accused)) this.opts.log({event: 'health_check', step: m.step, judged: m.judged, accused: m.accused})
        return
    }
  }

  /**
   * "Ready" in Warmup also means ready to exchange: connected to the epoch's other clients (directly or through a
   * relay), so the first round's results reach everyone. Not forever: after WARMUP_CONNECT_WAIT_MS we report
   * ready anyway (the rounds then show who could not be reached, and the no_exchange warning names them).
   */
  private peersReachable(): boolean {
    if (!this.ctx.p2p.notConnected) return true
    const others = this.ctx.state.epoch.clients.map((c) => c.id).filter((id) => id !== this.id)
    if (this.ctx.p2p.notConnected(others).length === 0) return true
    this.readyWaitSince ??= this.ctx.clock.now()
    if (this.ctx.clock.now() - this.readyWaitSince >= WARMUP_CONNECT_WAIT_MS) return true
    void this.ctx.clock.sleep(500).then(() => this.flushMessages())
    return false
  }

  /** Runs until the run is Finished (or stop()). A crashed worker withdraws us and rejects. */
  async run(): Promise<ClientSummary> {
    try {
      while (!this.ctx.stopped) {
        if (this.workerGone) {
          if (await this.replaceWorker(this.workerGone)) continue
          throw this.workerGone
        }
        if (this.connectionLost) throw this.connectionLost
        const work = nextWork(this.ctx.state, this.view())
        if (work?.kind === 'finished') break
        if (!work) {
          await new Promise<void>((resolve) => {
            this.wake = resolve
            void this.ctx.clock.sleep(1000).then(resolve)
          })
          continue
        }
        let progressed: boolean
        try {
          progressed = await this.execute(work)
        } catch (error) {
          // a request the dying worker did not answer (its exit may be noticed a moment later)
          const gone = this.workerGone ?? (error instanceof WorkerCrashedError ? error : undefined)
          if (gone && (await this.replaceWorker(gone))) continue
          throw error
        }
        if (!progressed) await this.ctx.clock.sleep(250)
      }
    } catch (error) {
      if (error instanceof WorkerCrashedError) {
        this.opts.log({event: 'worker_crashed', message: error.message})
        this.ctx.conn.sendWithdraw()
        await this.close()
        throw new PsycheError(`${error.message}; withdrew from run ${this.opts.runId}`, {code: 'EWORKERCRASHED'})
      }
      if (error instanceof PsycheError && error.code === 'ENOEXCHANGE') {
        this.ctx.conn.sendWithdraw()
        await this.close()
        throw new PsycheError(`${error.message} Withdrew from run ${this.opts.runId}.`, {code: 'ENOEXCHANGE'})
      }
      await this.close()
      throw error
    }
    // the last epoch's checkpoint upload is not abandoned when the run finishes
    await this.checkpointing.idle()
    const stats = this.ctx.p2p.stats()
    await this.close()
    return {rounds: this.ctx.roundsApplied, lastStep: this.ctx.modelStep, paramHash: this.ctx.lastHash, bytesIn: stats.bytesReceived, bytesOut: stats.bytesSent}
  }

  /** Ends run() after the piece of work under way (run() then closes the components and resolves with the summary). */
  stop(): void {
    this.ctx.stopped = true
    this.poke()
  }

  /**
   * Tells the coordinator we leave (synchronously: usable from a signal handler right before the process exits).
   * The coordinator then drops us at once instead of waiting for a disconnect or a health check.
   */
  withdrawNow(): boolean {
    if (this.ctx.stopped || !this.ctx.conn) return false
    const sent = this.ctx.conn.sendWithdraw()
    if (sent) this.opts.log({event: 'withdrawn', reason: 'signal'})
    return sent
  }

  private async close(): Promise<void> {
    this.ctx.stopped = true
    this.poke()
    await this.ctx.conn?.close().catch(() => {})
    await this.ctx.p2p.stop().catch(() => {})
    await this.ctx.data.close().catch(() => {})
    await this.components.evalData?.close().catch(() => {})
    await this.ctx.worker.shutdown().catch(() => {})
  }

  /** Executes one piece of work; false when it could not make progress yet (the loop waits a little). */
  private async execute(work: Exclude<Work, {kind: 'finished'}>): Promise<boolean> {
    switch (work.kind) {
      case 'join': {
        if (this.ctx.clock.now() - this.lastJoinAttempt < 3000) return false
        // Ejected: the coordinator refuses our join until the next epoch begins (a new epoch record); wait for it.
        if (wasEjected(this.ctx.state, this.id)) {
          if (this.bannedEpochStart !== this.ctx.state.epoch.start_time) {
            this.bannedEpochStart = this.ctx.state.epoch.start_time
            this.opts.log({event: 'banned', epoch: this.ctx.state.progress.epoch, detail: 'ejected: waiting for the next epoch to begin before joining again'})
          }
          return false
        }
        this.lastJoinAttempt = this.ctx.clock.now()
        this.opts.log({event: 'rejoining', run_state: this.ctx.state.run_state})
        const old = this.ctx.conn
        // Join again through a new connection (a join is part of the hello); the old one's close is not a loss.
        await this.connect()
        await old.close()
        return true
      }
      case 'load_model':
        return this.models.load(work.step, work.from)
      case 'score': {
        if (work.train) await this.training.begin(work.train.round, work.train.range)
        const collected = await this.results.collect(work.round)
        if (!collected) {
          await this.training.stall()
          return this.ctx.modelStep === null
        }
        await this.verification.score(work.round, work.current, collected.results)
        return true
      }
      case 'apply':
        return this.results.applyAlone(work.round)
      case 'train':
        return this.training.train(work.round, work.range, work.previous)
      case 'speculate':
        return this.training.speculate(work.round, work.range)
      case 'discard':
        return this.training.discard(work.step, work.reason)
    }
  }
}

/** The model-init seed of a run: every client of the first epoch initialises identical parameters from it. */
export function seedForRun(runId: string): number {
  let h = 2166136261
  for (const byte of Buffer.from(`psyche/init/${runId}`, 'utf8')) h = Math.imul(h ^ byte, 16777619) >>> 0
  return h & 0x7fffffff
}
