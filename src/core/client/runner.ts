import type {CoordinatorBackend, PeerDirectory, RejectionInfo} from '../backend/types.js'
import {batchRangeFor, buildWitnessProof, isCheckpointP2P, isRoundPhase, isVerifier, wasEjected, type ClientId, type CoordinatorState, type Round} from '../coordinator/index.js'
import type {HubRepo} from '../config/types.js'
import {errorMessage, PsycheError} from '../errors.js'
import type {ModelSnapshot, ResultAnnouncement} from '../p2p/index.js'
import {loadModel} from '../train/load-model.js'
import type {TrainPlan} from '../train/plan.js'
import {copyReason, nearCopies} from '../verify/copy.js'
import {FORMAT_INVALID, ResultIntake} from '../verify/intake.js'
import type {ResultFormat} from '../verify/result.js'
import {randomBatchIds, roundScale, scoreOf, Scorer, type Losses} from '../verify/score.js'
import {WorkerCrashedError, WorkerRequestError} from '../worker/client.js'
import type {ClientComponents} from './components.js'
import {acceptedResults, belongsToRound, finalRounds, messagesToSend, nextWork, trainersWithBatches, type ClientView, type HeldResult, type Message, type Work} from './decide.js'
import {StepLedger} from './ledger.js'
import {Checkpointer, CHECKPOINT_META_FILE, readCheckpointMeta, type CheckpointMeta} from '../checkpoint/checkpointer.js'
import {evalDue, heldOutIds, type EvalSettings} from './eval.js'
import {downloadCheckpoint} from '../checkpoint/hub.js'
import {existsSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join, resolve} from 'node:path'
import type {EventLog, RoundEvent} from '../events.js'

/** What a client trains with: the resolved plan's model, data and worker settings; LR and optimizer come from the run. */
export type ClientPlan = Pick<TrainPlan, 'model' | 'seqLen' | 'microBatch' | 'optimizer'>

export interface ClientOptions {
  /** This client's identity id (the key its P2P layer signs with and the coordinator knows it by). */
  id: ClientId
  runId: string
  plan: ClientPlan
  /** Model init: every first-epoch client must use the same (seedForRun). */
  seed: number
  /** Structured events, one object per line in --json mode. */
  log: EventLog
  /** How long an apply waits for a witnessed result it has no announcement of before applying without it. */
  missingResultWaitMs?: number
  /** Relays (multiaddrs) to reserve a slot on besides the coordinator's; `relay: false` uses none. */
  relays?: string[]
  relay?: boolean
  /**
   * Test-only (no CLI flag reaches it): replaces how this client publishes its result, so the adversarial tests
   * run the real client with a hostile producer (test/adversarial/).
   */
  producer?: ResultProducer
  /**
   * The Hugging Face Hub: where a `Hub` checkpoint the coordinator names is downloaded from, and — with `repo` —
   * where this client, as a checkpointer (Psyche's `--hub-repo`), uploads the model after each epoch.
   */
  hub?: {url?: string; token?: string; cacheDir?: string; repo?: string; revision?: string; stagingDir?: string; maxShardBytes?: number}
  /**
   * How many times a worker that died is replaced by a new one (components.restartWorker) before the client gives
   * up (default 0: a dead worker withdraws the client and ends it). A replaced worker has lost the model: the
   * client leaves the epoch and rejoins at the next one with the model from its peers.
   */
  workerRestarts?: number
  /** Validation loss on held-out samples after every `every`-th round (eval.ts); absent or every 0: none. */
  eval?: EvalSettings
}

/** What a hostile producer gets: the honest result, the peers' results so far, and a way to publish anything. */
export interface ProducerContext {
  step: number
  range: {start: number; end: number}
  honest: Uint8Array
  format: ResultFormat | undefined
  /** Downloaded results of peers for `step`, by producer. */
  peerResults(step: number): Map<ClientId, Uint8Array>
  /** Signs, serves and gossips `bytes` as our result for `step` (any step, any batches). */
  publish(bytes: Uint8Array, step?: number, range?: {start: number; end: number}): Promise<ResultAnnouncement>
  /** The current coordinator state. */
  state(): CoordinatorState
}

export interface ResultProducer {
  /** Which batch ids to train on instead of the assigned ones (default: the assigned ones). */
  batches?(ids: number[], round: Round): number[]
  /** Publishes this round's result its own way; returns what this client keeps as its own result (or nothing). */
  publish(ctx: ProducerContext): Promise<Uint8Array | undefined>
}

/** Applied rounds in a row without any peer's result (while others trained) before the no_exchange warning. */
export const NO_EXCHANGE_WARN_ROUNDS = 3
/** In Warmup, how long a loaded client waits to be connected to its peers before it reports ready anyway. */
const WARMUP_CONNECT_WAIT_MS = 20_000

/** One line per applied round (declared with every other event in core/events.ts). */
export type {RoundEvent} from '../events.js'

export interface ClientSummary {
  rounds: number
  lastStep: number | null
  paramHash: string | null
  bytesIn: number
  bytesOut: number
}

/**
 * The client's I/O loop: follows the coordinator's state pushes, and executes what decide.ts says — work on
 * the worker one piece at a time, messages to the coordinator as soon as they are due. Results travel over
 * the P2P layer: ours are published after training; everyone else's are downloaded as soon as announced.
 * Its parts (backend, p2p, worker, data, clock) come from outside: see components.ts.
 */
export class PsycheClient {
  private conn!: CoordinatorBackend
  private state!: CoordinatorState
  private modelStep: number | null = null
  private trainedStep = 0
  private warmupReported: number | null = null
  /** Per-step memory (results, training, witness and health-check sends...), pruned as rounds are applied. */
  private readonly ledger = new StepLedger()
  /** `${step}:${producer}` (and `…:low_score`) of the accusations sent. */
  private readonly accused = new Set<string>()
  private readonly equivocationsSent = new Set<string>()
  private readonly intake = new ResultIntake(undefined)
  private readonly scorer = new Scorer()
  private resultFormat: ResultFormat | undefined
  /** The results of the apply under way, in the order handed to the worker. */
  private applying: HeldResult[] = []
  private snapshot: ModelSnapshot | undefined
  private knownTopicPeers = 0
  private wake: (() => void) | undefined
  private stopped = false
  private lastJoinAttempt = Number.NEGATIVE_INFINITY
  /** The epoch record (its start_time) in which we found ourselves ejected (logged once per epoch). */
  private bannedEpochStart: number | undefined
  private roundsApplied = 0
  private lastHash: string | null = null
  private workerGone: WorkerCrashedError | undefined
  private connectionLost: PsycheError | undefined
  private noExchangeRounds = 0
  private readyWaitSince: number | undefined
  private worker: ClientComponents['worker']
  private workerRestarts = 0
  private readonly p2p: ClientComponents['p2p']
  private readonly data: ClientComponents['data']
  private readonly clock: ClientComponents['clock']
  private readonly checkpointer: Checkpointer | undefined
  private checkpointedEpoch: number | null = null

  private constructor(
    private readonly opts: ClientOptions,
    private readonly components: ClientComponents,
  ) {
    ;({worker: this.worker, p2p: this.p2p, data: this.data, clock: this.clock} = components)
    const hub = opts.hub
    if (hub?.repo) {
      if (!this.worker.save) throw new PsycheError('this worker cannot save models, so the client cannot be a checkpointer')
      if (!hub.token) throw new PsycheError('a checkpointer needs a Hub token (--hub-token or HF_TOKEN)')
      this.checkpointer = new Checkpointer({
        repo: hub.repo,
        revision: hub.revision,
        hubUrl: hub.url,
        token: hub.token,
        maxShardBytes: hub.maxShardBytes,
        stagingDir: hub.stagingDir ?? join(tmpdir(), `psyche-checkpoints-${opts.id.slice(0, 16)}`),
        save: (dir, card) => this.worker.save!(dir, {card: {...card, run_id: opts.runId}}),
        log: opts.log,
        onUploaded: (c) => {
          // the coordinator takes a checkpoint only in the Cooldown of the epoch it ends
          // Finished after the Cooldown (or another checkpointer reported first): the commit is on the Hub branch
          // but the coordinator will not take it; it is reported here, with what a user needs to find it.
          if (this.state.run_state !== 'Cooldown' || this.state.progress.epoch !== c.epoch || this.state.epoch.checkpointed) {
            this.opts.log({
              event: 'checkpoint_late',
              step: c.step,
              epoch: c.epoch,
              repo_id: c.repo_id,
              revision: c.revision,
              reason: this.state.epoch.checkpointed
                ? 'another checkpointer reported this epoch first'
                : `the upload finished in ${this.state.run_state} of epoch ${this.state.progress.epoch}, after the Cooldown the coordinator takes checkpoints in`,
            })
            return
          }
          if (this.conn.sendCheckpoint({repo_id: c.repo_id, revision: c.revision}))
            this.opts.log({event: 'checkpoint', step: c.step, epoch: c.epoch, repo_id: c.repo_id, revision: c.revision})
        },
      })
    }
  }

  /** A checkpointer saves the model once per epoch, when the epoch's last round is applied (Cooldown); the upload runs in the background. */
  private async maybeCheckpoint(round: Round): Promise<void> {
    if (!this.checkpointer || this.state.run_state !== 'Cooldown' || this.state.epoch.round?.step !== round.step) return
    const epoch = this.state.progress.epoch
    if (this.checkpointedEpoch === epoch) return
    this.checkpointedEpoch = epoch
    await this.checkpointer
      .checkpoint(round.step, epoch, {run_id: this.opts.runId, param_hash: this.lastHash ?? undefined})
      .catch((error: unknown) => this.opts.log({event: 'checkpoint_save_failed', step: round.step, message: errorMessage(error)}))
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
      p2p.onAnnouncement((a) => client.onAnnouncement(a))
      client.watchWorker(worker)
      p2p.serveModel(async () => {
        if (!client.snapshot) throw new PsycheError('no model loaded yet')
        return client.snapshot
      })
      await client.connect()
      // New addresses (a relay reservation, a confirmed observed address) go to every peer through the coordinator.
      p2p.onAddressesChanged?.((addrs) => client.conn.sendAddresses?.(addrs))
      opts.log({event: 'started', client_id: opts.id, p2p: p2p.addresses(), worker_pid: worker.pid})
      return client
    } catch (error) {
      client.stopped = true
      await p2p.stop().catch(() => {})
      await components.data.close().catch(() => {})
      await components.evalData?.close().catch(() => {})
      await worker.shutdown().catch(() => {})
      throw error
    }
  }

  /** A worker that dies while we wait for the next round is noticed at once, not at the next request. */
  private watchWorker(worker: ClientComponents['worker']): void {
    void worker.exited.then(() => {
      if (this.stopped || this.worker !== worker) return
      this.workerGone = new WorkerCrashedError(`worker${worker.pid === undefined ? '' : ` (pid ${worker.pid})`} exited unexpectedly`)
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
    if (!restart || this.stopped || this.workerRestarts >= (this.opts.workerRestarts ?? 0)) return false
    this.workerRestarts++
    this.opts.log({event: 'worker_crashed', message: error.message, restarting: true})
    this.conn.sendWithdraw()
    await this.worker.shutdown().catch(() => {})
    this.modelStep = null
    this.snapshot = undefined
    this.begun = undefined
    this.applying = []
    this.worker = await restart()
    this.workerGone = undefined
    this.watchWorker(this.worker)
    this.opts.log({event: 'worker_restarted', restarts: this.workerRestarts, worker_pid: this.worker.pid})
    return true
  }

  private async connect(): Promise<void> {
    const conn = await this.components.backend.connect({p2pAddrs: this.p2p.addresses()})
    const runSeqLen = conn.state!.model.LLM.max_seq_len
    if (runSeqLen !== this.opts.plan.seqLen) {
      await conn.close()
      throw new PsycheError(
        `run ${this.opts.runId}: the coordinator trains sequences of ${runSeqLen} tokens, but this client's config gives ${this.opts.plan.seqLen} (pass the run's state.toml with --config)`,
      )
    }
    this.conn = conn
    conn.on('state', (s: CoordinatorState, peers: PeerDirectory) => {
      if (this.conn === conn) this.onState(s, peers)
    })
    conn.on('rejected', (reason: string, info: RejectionInfo) => this.opts.log({event: 'rejected', reason, ...info}))
    conn.on('reconnected', () => {
      // A restarted server resumes from its last saved transition: proofs sent since may be lost. Forget what we
      // sent; decide.ts re-sends what the pushed state does not record.
      this.ledger.forgetWitnessesSent()
      this.warmupReported = null
      this.opts.log({event: 'reconnected'})
      this.useRelays()
      this.flushMessages()
    })
    conn.on('closed', () => {
      // The coordinator refused us for good while reconnecting: nothing left to follow.
      if (this.conn !== conn || this.stopped) return
      this.connectionLost = new PsycheError(`${this.components.backend.description} closed the connection for good (see the rejected event)`, {code: 'ECOORDINATOR'})
      this.poke()
    })
    // The first state arrived during connect(), before these listeners.
    this.onState(conn.state!, conn.peers)
    this.useRelays()
  }

  /** Reserve a slot on the coordinator's relay (and any --relay): peers behind NAT reach us through it. */
  private useRelays(): void {
    if (this.opts.relay === false || !this.p2p.useRelays) return
    const relays = [...(this.opts.relays ?? []), ...(this.conn.relayAddrs ?? [])]
    if (relays.length === 0) return
    this.opts.log({event: 'relay', addrs: relays})
    void this.p2p.useRelays(relays)
  }

  private view(): ClientView {
    return {
      id: this.id,
      modelStep: this.modelStep,
      trainedStep: this.trainedStep,
      warmupReported: this.warmupReported,
      witnessSent: this.ledger.witnessSent(),
      healthChecked: this.ledger.healthChecked(),
      finalRounds: this.ledger.finalRounds(),
      results: this.ledger.results(),
      accused: this.accused,
      witnessGrace: this.witnessGrace,
    }
  }

  /** Steps in whose witness window we still wait for downloads in flight (decide.ts messagesToSend). */
  private readonly witnessGrace = new Set<number>()
  private readonly witnessWindowsSeen = new Set<number>()

  /** On a step's first RoundWitness: wait up to half the window for results still downloading, then send what we have. */
  private startWitnessGrace(state: CoordinatorState): void {
    const round = state.epoch.round
    if (state.run_state !== 'RoundWitness' || !round || this.witnessWindowsSeen.has(round.step)) return
    this.witnessWindowsSeen.add(round.step)
    for (const step of this.witnessWindowsSeen) if (step < round.step - 1) this.witnessWindowsSeen.delete(step)
    this.witnessGrace.add(round.step)
    void this.clock.sleep((state.config.round_witness_time * 1000) / 2).then(() => {
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
    this.state = state
    const round = state.epoch.round
    if (round) this.ledger.at(round.step).epoch ??= state.progress.epoch
    for (const r of finalRounds(state)) this.ledger.at(r.step).finalRound = r
    this.startWitnessGrace(state)
    const addrs = Object.entries(peers)
      .filter(([id]) => id !== this.id)
      .flatMap(([, a]) => a)
    void this.p2p.connect(addrs).then(() => this.reannounceIfNewPeers())
    this.flushMessages()
    this.poke()
  }

  /** Gossip is not replayed to peers that subscribe later: publish our latest result again when new ones appear. */
  private async reannounceIfNewPeers(): Promise<void> {
    const n = this.p2p.topicPeers()
    if (n <= this.knownTopicPeers) return
    this.knownTopicPeers = n
    const latest = this.ledger.get(this.trainedStep)?.own
    if (latest) await this.p2p.reannounce(latest).catch((e) => this.opts.log({event: 'reannounce_failed', message: errorMessage(e)}))
  }

  private onAnnouncement(a: ResultAnnouncement): void {
    const floor = this.modelStep ?? 0
    if (a.step <= floor) return
    const round = this.state?.epoch.round
    if (round && round.step === a.step && !belongsToRound(this.state, round, a)) {
      this.opts.log({
        event: 'announcement_ignored',
        client_id: a.client_id,
        step: a.step,
        reason: `batches [${a.batch_start}, ${a.batch_end}) are not its assignment in step ${a.step}`,
      })
      return
    }
    const record = this.ledger.at(a.step)
    const verdict = this.intake.announcement(a)
    if (!verdict.ok && 'proof' in verdict) {
      // Two signed results for one step: the proof goes to the coordinator, which ejects the producer and
      // excludes it from the round; we stop counting either result.
      const first = record.results.get(a.client_id)
      if (first) first.invalid = verdict.reason
      const key = `${a.step}:${a.client_id}`
      if (!this.equivocationsSent.has(key)) {
        this.equivocationsSent.add(key)
        this.opts.log({event: 'result_rejected', client_id: a.client_id, step: a.step, reason: verdict.reason})
        if (this.conn.sendEquivocation(verdict.proof)) this.opts.log({event: 'equivocation_reported', client_id: a.client_id, step: a.step})
        this.flushMessages()
      }
      return
    }
    if (record.results.has(a.client_id)) return // first valid announcement per producer and step wins
    const held: HeldResult = {client_id: a.client_id, step: a.step, batch_start: a.batch_start, batch_end: a.batch_end, commitment: a.commitment}
    record.results.set(a.client_id, held)
    if (!verdict.ok) {
      // Refused without downloading (a size no result of this model has): counted as arrived, and invalid.
      held.invalid = verdict.reason
      held.bytes = new Uint8Array(0)
      this.opts.log({event: 'result_rejected', client_id: a.client_id, step: a.step, reason: verdict.reason})
      this.flushMessages()
      this.poke()
      return
    }
    record.announcements.set(a.client_id, a)
    this.p2p.fetchResult(a).then(
      (bytes) => {
        this.received(held, bytes)
        this.flushMessages()
        this.poke()
      },
      (error) => this.opts.log({event: 'result_fetch_failed', client_id: a.client_id, step: a.step, message: errorMessage(error)}),
    )
  }

  /** Validates downloaded bytes before they count anywhere (decide.ts never attests or applies an invalid one). */
  private received(held: HeldResult, bytes: Uint8Array): void {
    if (held.bytes) return
    const reason = held.invalid ?? this.intake.bytes(held, bytes)
    held.bytes = bytes
    if (reason !== undefined && held.invalid === undefined) {
      held.invalid = reason
      this.opts.log({event: 'result_rejected', client_id: held.client_id, step: held.step, reason})
    }
  }

  private flushMessages(): void {
    if (!this.state || this.stopped) return
    for (const m of messagesToSend(this.state, this.view())) this.send(m)
  }

  private send(m: Message): void {
    switch (m.kind) {
      case 'warmup_ready':
        if (!this.peersReachable()) return
        if (this.conn.sendWarmupReady()) {
          this.readyWaitSince = undefined
          this.warmupReported = m.epoch
          this.opts.log({event: 'warmup_ready', epoch: m.epoch, step: this.modelStep})
        }
        return
      case 'witness': {
        const round = this.state.epoch.round!
        const proof = buildWitnessProof(
          round,
          m.seen.map((r) => ({id: r.client_id, range: {start: r.batch_start, end: r.batch_end}, commitment: Buffer.from(r.commitment, 'hex')})),
        )
        if (this.conn.sendWitness(m.step, proof)) {
          this.ledger.at(m.step).witnessSent = true
          this.opts.log({event: 'witness', step: m.step, seen: m.seen.length})
        }
        return
      }
      case 'accuse':
        if (this.conn.sendAccusation(m.step, m.accused, 'invalid_result')) {
          this.accused.add(`${m.step}:${m.accused}`)
          this.opts.log({event: 'accused', step: m.step, client_id: m.accused, reason: m.detail})
        }
        return
      case 'health_check':
        this.ledger.at(m.judged).healthChecked = true
        if (m.accused.length > 0 && this.conn.sendHealthCheck(m.step, m.accused)) this.opts.log({event: 'health_check', step: m.step, judged: m.judged, accused: m.accused})
        return
    }
  }

  /**
   * "Ready" in Warmup also means ready to exchange: connected to the epoch's other clients (directly or through a
   * relay), so the first round's results reach everyone. Not forever: after WARMUP_CONNECT_WAIT_MS we report
   * ready anyway (the rounds then show who could not be reached, and the no_exchange warning names them).
   */
  private peersReachable(): boolean {
    if (!this.p2p.notConnected) return true
    const others = this.state.epoch.clients.map((c) => c.id).filter((id) => id !== this.id)
    if (this.p2p.notConnected(others).length === 0) return true
    this.readyWaitSince ??= this.clock.now()
    if (this.clock.now() - this.readyWaitSince >= WARMUP_CONNECT_WAIT_MS) return true
    void this.clock.sleep(500).then(() => this.flushMessages())
    return false
  }

  /** Runs until the run is Finished (or stop()). A crashed worker withdraws us and rejects. */
  async run(): Promise<ClientSummary> {
    try {
      while (!this.stopped) {
        if (this.workerGone) {
          if (await this.replaceWorker(this.workerGone)) continue
          throw this.workerGone
        }
        if (this.connectionLost) throw this.connectionLost
        const work = nextWork(this.state, this.view())
        if (work?.kind === 'finished') break
        if (!work) {
          await new Promise<void>((resolve) => {
            this.wake = resolve
            void this.clock.sleep(1000).then(resolve)
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
        if (!progressed) await this.clock.sleep(250)
      }
    } catch (error) {
      if (error instanceof WorkerCrashedError) {
        this.opts.log({event: 'worker_crashed', message: error.message})
        this.conn.sendWithdraw()
        await this.close()
        throw new PsycheError(`${error.message}; withdrew from run ${this.opts.runId}`, {code: 'EWORKERCRASHED'})
      }
      await this.close()
      throw error
    }
    // the last epoch's checkpoint upload is not abandoned when the run finishes
    await this.checkpointer?.idle()
    const stats = this.p2p.stats()
    await this.close()
    return {rounds: this.roundsApplied, lastStep: this.modelStep, paramHash: this.lastHash, bytesIn: stats.bytesReceived, bytesOut: stats.bytesSent}
  }

  /** Ends run() after the piece of work under way (run() then closes the components and resolves with the summary). */
  stop(): void {
    this.stopped = true
    this.poke()
  }

  /**
   * Tells the coordinator we leave (synchronously: usable from a signal handler right before the process exits).
   * The coordinator then drops us at once instead of waiting for a disconnect or a health check.
   */
  withdrawNow(): boolean {
    if (this.stopped || !this.conn) return false
    const sent = this.conn.sendWithdraw()
    if (sent) this.opts.log({event: 'withdrawn', reason: 'signal'})
    return sent
  }

  private async close(): Promise<void> {
    this.stopped = true
    this.poke()
    await this.conn?.close().catch(() => {})
    await this.p2p.stop().catch(() => {})
    await this.data.close().catch(() => {})
    await this.components.evalData?.close().catch(() => {})
    await this.worker.shutdown().catch(() => {})
  }

  /** Executes one piece of work; false when it could not make progress yet (the loop waits a little). */
  private async execute(work: Exclude<Work, {kind: 'finished'}>): Promise<boolean> {
    switch (work.kind) {
      case 'join': {
        if (this.clock.now() - this.lastJoinAttempt < 3000) return false
        // Ejected: the coordinator refuses our join until the next epoch begins (a new epoch record); wait for it.
        if (wasEjected(this.state, this.id)) {
          if (this.bannedEpochStart !== this.state.epoch.start_time) {
            this.bannedEpochStart = this.state.epoch.start_time
            this.opts.log({event: 'banned', epoch: this.state.progress.epoch, detail: 'ejected: waiting for the next epoch to begin before joining again'})
          }
          return false
        }
        this.lastJoinAttempt = this.clock.now()
        this.opts.log({event: 'rejoining', run_state: this.state.run_state})
        const old = this.conn
        // Join again through a new connection (a join is part of the hello); the old one's close is not a loss.
        await this.connect()
        await old.close()
        return true
      }
      case 'load_model':
        return this.loadModel(work.step, work.from)
      case 'apply':
        return this.applyRound(work.round)
      case 'train':
        return this.train(work.round, work.range, work.previous)
    }
  }

  private parameters: number | undefined

  /**
   * The model directory of the coordinator's `Hub` checkpoint (downloaded into the Hub cache: resumable,
   * hash-checked), or undefined when the checkpoint is not a Hub repository (the plan's model is used), or null
   * when the download failed (retried on the next pass).
   */
  private async hubCheckpointDir(step: number): Promise<string | undefined | null> {
    const checkpoint = this.state.model.LLM.checkpoint
    if (typeof checkpoint !== 'object' || !('Hub' in checkpoint)) return undefined
    return this.downloadHubRepo(step, checkpoint.Hub)
  }

  private async downloadHubRepo(step: number, repo: HubRepo): Promise<string | undefined | null> {
    const {repo_id, revision} = repo
    if (!repo_id || existsSync(join(resolve(repo_id), 'config.json'))) return undefined // a local directory: the plan resolved it
    try {
      const got = await downloadCheckpoint({
        repo: repo_id,
        revision: revision ?? undefined,
        hubUrl: this.opts.hub?.url,
        token: this.opts.hub?.token,
        cacheDir: this.opts.hub?.cacheDir,
      })
      this.opts.log({event: 'checkpoint_downloaded', step, repo_id, revision: got.commit, bytes: got.bytes, downloaded_bytes: got.downloaded_bytes})
      return got.dir
    } catch (error) {
      this.opts.log({event: 'checkpoint_download_failed', step, repo_id, message: errorMessage(error)})
      return null
    }
  }

  /**
   * Loads a Hub checkpoint's directory into the worker and checks it against its psyche-checkpoint.json: the
   * parameters must hash to its param_hash, and with `exactStep` it must be the model at that step (a P2P epoch's
   * fallback: anything else would fork us from our peers). Returns the parameter hash, or undefined (logged).
   */
  private async loadCheckpointDir(dir: string, step: number, exactStep: boolean): Promise<string | undefined> {
    let meta: CheckpointMeta | undefined
    try {
      meta = await readCheckpointMeta(dir)
    } catch (error) {
      this.opts.log({event: 'checkpoint_rejected', step, message: errorMessage(error)})
      return undefined
    }
    if (exactStep && meta?.step !== step) {
      const why = meta ? `it is the model at step ${meta.step}` : `it has no ${CHECKPOINT_META_FILE} naming its step`
      this.opts.log({event: 'checkpoint_rejected', step, message: `the Hub checkpoint cannot stand in for our peers' model at step ${step}: ${why}`})
      return undefined
    }
    await this.initModel(dir)
    const {frames, paramHash} = await this.worker.exportParams()
    if (meta?.param_hash !== undefined && meta.param_hash !== paramHash) {
      this.opts.log({event: 'checkpoint_rejected', step, message: `its parameters hash to ${paramHash}, its ${CHECKPOINT_META_FILE} says ${meta.param_hash}`})
      return undefined
    }
    // A whole run restarted from its last checkpoint: the coordinator may have closed rounds nobody trained since.
    if (meta && meta.step !== step) this.opts.log({event: 'checkpoint_step', step, checkpoint_step: meta.step})
    this.snapshot = {step, paramHash, frames: frames.map((f) => ({name: f.name!, dtype: f.dtype, shape: f.shape, data: f.data as Uint8Array}))}
    return paramHash
  }

  private async initModel(fromDir?: string): Promise<void> {
    const {microBatch} = this.opts.plan
    const model = fromDir ? ({kind: 'dir', dir: fromDir} as const) : this.opts.plan.model
    // The run's state is authoritative for what every replica must agree on: the LR schedule, and DisTrO's
    // settings when the run names DisTrO (the network path needs it; other optimizers fall back to the plan's).
    const llm = this.state.model.LLM
    const optimizer = typeof llm.optimizer === 'object' && 'Distro' in llm.optimizer ? llm.optimizer : this.opts.plan.optimizer
    const lrSchedule = llm.lr_schedule
    const info = await loadModel(this.worker, model, this.opts.seed, this.opts.plan.seqLen)
    this.parameters = info.parameters
    const {resultFormat} = await this.worker.configure({
      optimizer: optimizer as Record<string, unknown>,
      lr_schedule: lrSchedule as Record<string, unknown>,
      micro_batch: microBatch,
      delay_correction: true,
    })
    this.resultFormat = resultFormat
    this.intake.setFormat(resultFormat)
  }

  private async loadModel(step: number, from: 'checkpoint' | ClientId[]): Promise<boolean> {
    if (from === 'checkpoint') {
      const dir = await this.hubCheckpointDir(step)
      if (dir === null) return false
      if (dir === undefined) {
        await this.initModel()
        const {frames, paramHash} = await this.worker.exportParams()
        this.snapshot = {step, paramHash, frames: frames.map((f) => ({name: f.name!, dtype: f.dtype, shape: f.shape, data: f.data as Uint8Array}))}
        this.setLoaded(step, paramHash, 'checkpoint')
        return true
      }
      const hash = await this.loadCheckpointDir(dir, step, false)
      if (hash === undefined) return false
      this.setLoaded(step, hash, 'checkpoint')
      return true
    }
    let snapshot: ModelSnapshot
    try {
      // Every peer is asked for its signed manifest; only those whose model is at `step` count.
      snapshot = await this.p2p.fetchModel(from, {step})
    } catch (error) {
      this.opts.log({event: 'model_fetch_failed', step, message: errorMessage(error)})
      return this.hubFallback(step)
    }
    if (snapshot.step !== step) {
      this.opts.log({event: 'model_fetch_failed', step, message: `a peer served the model at step ${snapshot.step}, the epoch starts after step ${step}`})
      return false
    }
    await this.initModel() // the model's structure, and a fresh optimizer: any momentum we had belongs to rounds we missed
    const hash = await this.worker.importParams(snapshot.frames.map((f) => ({name: f.name, dtype: f.dtype as 'float32', shape: f.shape, data: f.data})))
    if (hash !== snapshot.paramHash) {
      this.opts.log({event: 'model_fetch_failed', step, message: `imported parameters hash to ${hash}, the peer announced ${snapshot.paramHash}`})
      return false
    }
    this.snapshot = snapshot
    this.setLoaded(step, hash, 'peers')
    return true
  }

  /**
   * Nobody served the model in a P2P epoch: load the last Hub checkpoint the coordinator took (the P2P checkpoint
   * names its repository and revision), if it is the model at this step.
   */
  private async hubFallback(step: number): Promise<boolean> {
    const checkpoint = this.state.model.LLM.checkpoint
    if (!isCheckpointP2P(checkpoint) || !checkpoint.P2P.repo_id) return false
    const dir = await this.downloadHubRepo(step, checkpoint.P2P)
    if (!dir) return false
    const hash = await this.loadCheckpointDir(dir, step, true)
    if (hash === undefined) return false
    this.setLoaded(step, hash, 'hub_fallback')
    return true
  }

  private setLoaded(step: number, hash: string, source: string): void {
    this.modelStep = step
    this.trainedStep = Math.max(this.trainedStep, step)
    this.lastHash = hash
    this.opts.log({event: 'model_loaded', step, source, param_hash: hash, parameters: this.parameters})
    this.flushMessages()
  }

  /**
   * The accepted results of a final round, downloaded. Undefined while some are not here yet: a witnessed result
   * we have no announcement of, or whose download failed. After missingResultWaitMs we give up on this epoch
   * rather than apply a different set than our peers (that would fork the replica): the model is dropped, we
   * stop training (health checks drop us), rejoin, and load the model from a peer at the next Warmup.
   */
  private async acceptedBytes(round: Round): Promise<(Uint8Array[] & {peers?: number; peersAccepted?: number}) | undefined> {
    const record = this.ledger.get(round.step)
    for (const r of acceptedResults(this.state, round, record?.results).accepted) {
      if (r.bytes) continue
      const a = record?.announcements.get(r.client_id)
      try {
        const bytes = a ? await this.p2p.fetchResult(a) : this.p2p.getResult(r.commitment)
        if (bytes) this.received(r, bytes)
      } catch (error) {
        this.opts.log({event: 'result_fetch_failed', client_id: r.client_id, step: round.step, message: errorMessage(error)})
      }
    }
    // Again, now that every accepted result we could get is downloaded and validated.
    const {accepted, missing, dropped} = acceptedResults(this.state, round, record?.results)
    const unfetched = accepted.filter((r) => !r.bytes).map((r) => r.client_id)
    if (missing.length === 0 && unfetched.length === 0) {
      // The same on every replica: the witnessed bytes are the same everywhere, and so is their validation.
      for (const r of dropped) this.opts.log({event: 'result_dropped', client_id: r.client_id, step: round.step, reason: r.invalid})
      const excluded = round.excluded ?? []
      if (excluded.length > 0) this.opts.log({event: 'results_excluded', step: round.step, client_ids: excluded})
      this.applying = accepted.filter((r) => !dropped.includes(r))
      // Copies by index overlap among the witnessed results: a pure function of their bytes in canonical order,
      // so every replica drops the same ones (a copied update counts once).
      if (this.resultFormat) {
        const copies = nearCopies(this.applying as {client_id: ClientId; bytes: Uint8Array}[], this.resultFormat)
        for (const c of copies) this.opts.log({event: 'result_dropped', client_id: c.client_id, step: round.step, reason: copyReason(c.of, round.step, c.overlap)})
        const gone = new Set(copies.map((c) => c.index))
        this.applying = this.applying.filter((_, i) => !gone.has(i))
      }
      // Verification never stops an apply: a failure is logged and the round goes on.
      await this.verify(round, this.applying).catch((error) => this.opts.log({event: 'verify_failed', step: round.step, message: errorMessage(error)}))
      const out: Uint8Array[] & {peers?: number; peersAccepted?: number} = this.applying.map((r) => r.bytes!)
      out.peers = this.applying.filter((r) => r.client_id !== this.id).length
      out.peersAccepted = accepted.filter((r) => r.client_id !== this.id).length
      return out
    }
    const since = (this.ledger.at(round.step).missingSince ??= this.clock.now())
    if (this.clock.now() - since < (this.opts.missingResultWaitMs ?? 10_000)) return undefined
    this.opts.log({
      event: 'out_of_sync',
      step: round.step,
      unannounced: missing,
      unfetched,
      detail: 'a witness quorum accepted results that never reached us; dropping the model until the next epoch rather than fork',
    })
    this.modelStep = null
    this.snapshot = undefined
    return undefined
  }

  /**
   * As a verifier of the current round: scores each peer's result of the final `round` (before it is applied,
   * so the worker's parameters are those its producers trained from), keeps moving averages, and accuses peers
   * whose average stays low. Scores appear as `scored` events.
   */
  private async verify(round: Round, results: HeldResult[]): Promise<void> {
    const current = this.state.epoch.round
    if (!current || !isRoundPhase(this.state.run_state) || !isVerifier(this.state, this.id, current) || !this.worker.scoreResults) return
    const peers = results.filter((r) => r.client_id !== this.id && r.bytes)
    if (peers.length === 0) return
    const size = Math.max(...peers.map((r) => r.batch_end - r.batch_start))
    const batches = []
    for (const r of peers) {
      const ids = Array.from({length: r.batch_end - r.batch_start}, (_, i) => r.batch_start + i)
      batches.push({tokens: await this.data.getSamples(ids), rows: ids.length})
    }
    const randomIds = randomBatchIds(round, size)
    batches.push({tokens: await this.data.getSamples(randomIds), rows: randomIds.length})
    const {before, after} = await this.worker.scoreResults(
      round.step,
      peers.map((r) => r.bytes!),
      batches,
    )
    const k = peers.length
    const reported: {client_id: ClientId; score: number}[] = []
    const scored: {r: HeldResult; l: Losses}[] = []
    for (const [j, r] of peers.entries()) {
      const losses = after[j]
      if (losses) scored.push({r, l: {assigned: {before: before[j], after: losses[j]}, random: {before: before[k], after: losses[k]}}})
    }
    const scale = roundScale(scored.map((x) => x.l))
    for (const {r, l} of scored) {
      const score = scoreOf(l, scale)
      const peer = this.scorer.add(r.client_id, score)
      reported.push({client_id: r.client_id, score: Math.max(-1, Math.min(1, score))})
      this.opts.log({
        event: 'scored',
        step: round.step,
        client_id: r.client_id,
        score,
        average: peer.average,
        count: peer.count,
        gain_assigned: l.assigned.before - l.assigned.after,
        gain_random: l.random.before - l.random.after,
      })
    }
    // The server keeps moving averages of what verifiers report (psyche status, dashboards).
    if (reported.length > 0) this.conn.sendScores?.(round.step, reported)
    for (const id of this.scorer.lowScorers()) {
      const key = `${current.step}:${id}:low_score`
      const range = batchRangeFor(this.state, id, current)
      if (this.accused.has(key) || !range || range.end === range.start || current.excluded?.includes(id)) continue
      if (this.conn.sendAccusation(current.step, id, 'low_score')) {
        this.accused.add(key)
        this.opts.log({
          event: 'accused',
          step: current.step,
          client_id: id,
          reason: `low_score: moving average ${this.scorer.get(id)!.average.toFixed(3)} below ${this.scorer.settings.threshold}`,
        })
      }
    }
  }

  /**
   * The worker refused a result we validated (validateResult and its decoder disagree: a bug, never expected).
   * Its decoder is as deterministic as ours, so every replica refuses the same result: drop it and try again.
   */
  private refusedByWorker(error: unknown, step: number): boolean {
    if (!(error instanceof WorkerRequestError) || error.kind !== 'bad_result') return false
    const index = Number(/result (\d+):/.exec(error.message)?.[1])
    const r = this.applying[index]
    if (!r) return false
    r.invalid = `${FORMAT_INVALID}the worker refused it: ${error.message}`
    this.opts.log({event: 'result_dropped', client_id: r.client_id, step, reason: r.invalid})
    return true
  }

  private async applyRound(round: Round): Promise<boolean> {
    const started = performance.now()
    const results = await this.acceptedBytes(round)
    if (!results) return this.modelStep === null
    let hash: string
    try {
      hash = await this.worker.applyResults(round.step, results)
    } catch (error) {
      if (this.refusedByWorker(error, round.step)) return false
      throw error
    }
    await this.reportRound(this.afterApply(round, hash, results.length, results.peers ?? 0, results.peersAccepted ?? 0, performance.now() - started))
    // Past the epoch's rounds the model is what joiners of the next epoch fetch: refresh what we serve.
    if (!isRoundPhase(this.state.run_state)) {
      const {frames, paramHash} = await this.worker.exportParams()
      this.snapshot = {step: round.step, paramHash, frames: frames.map((f) => ({name: f.name!, dtype: f.dtype, shape: f.shape, data: f.data as Uint8Array}))}
      await this.maybeCheckpoint(round)
    }
    return true
  }

  /**
   * The bookkeeping after an apply; returns the round event, which reportRound() logs (after an evaluation when
   * one is due). applyMs: time spent applying outside the worker's training call (collecting the results, and a
   * separate apply).
   */
  private afterApply(round: Round, hash: string, applied: number, peersApplied: number, peersAccepted: number, applyMs: number): RoundEvent {
    this.modelStep = round.step
    this.trainedStep = Math.max(this.trainedStep, round.step)
    this.lastHash = hash
    this.roundsApplied++
    const record = this.ledger.get(round.step)
    const mine = record?.trained
    const stats = this.p2p.stats()
    const kinds = this.p2p.connectionKinds?.()
    const otherTrainers = trainersWithBatches(this.state, round).filter((t) => t.id !== this.id).length
    const event: RoundEvent = {
      event: 'round',
      step: round.step,
      epoch: record?.epoch ?? this.state.progress.epoch,
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
    }
    // Keep one applied round back: slower peers may still fetch it from us, and the next round's witnesses judge it.
    this.p2p.dropResultsBefore(round.step - 1)
    this.ledger.pruneBefore(round.step - 1)
    this.intake.forget(round.step - 1)
    for (const key of this.accused) if (Number(key.split(':')[0]) < round.step - 1) this.accused.delete(key)
    this.flushMessages()
    return event
  }

  /** Logs a round event, with the validation loss when an evaluation is due after its step. */
  private async reportRound(event: RoundEvent): Promise<void> {
    await this.evaluate(event)
    this.opts.log(event)
    this.checkExchange(event.step, event.peers_applied, event.other_trainers)
  }

  /** The held-out samples (decided once, from the run's config and the data; null: none, with an eval_unavailable event). */
  private evalSet: {ids: number[]; source: 'split' | 'tail'; tokens?: Uint32Array} | null | undefined

  /**
   * Validation (eval.ts): the loss on the held-out samples at the replicated parameters, when due after `event`'s
   * step. The worker evaluates while it would otherwise wait for the next round; a failure is logged, never fatal
   * (a dead worker still is: its error goes up).
   */
  private async evaluate(event: RoundEvent): Promise<void> {
    const settings = this.opts.eval
    if (!settings || !evalDue(event.step, settings, this.state.config.total_steps)) return
    if (this.evalSet === undefined) {
      const split = this.components.evalData
      const got = heldOutIds(this.state, settings, {trainSamples: this.data.numSamples(), split: split?.numSamples(), hasSplit: split !== undefined})
      this.evalSet = 'ids' in got ? got : null
      if ('reason' in got) this.opts.log({event: 'eval_unavailable', reason: got.reason})
      else this.opts.log({event: 'eval_set', source: got.source, samples: got.ids.length, data: (split ?? this.data).description})
    }
    const set = this.evalSet
    if (!set) return
    const started = performance.now()
    try {
      set.tokens ??= await (this.components.evalData ?? this.data).getSamples(set.ids)
      const {loss} = await this.worker.evaluate(set.tokens, set.ids.length)
      event.val_loss = loss
      event.eval_ms = Math.round(performance.now() - started)
    } catch (error) {
      if (error instanceof WorkerCrashedError) throw error
      this.opts.log({event: 'eval_failed', step: event.step, message: errorMessage(error)})
    }
  }

  /**
   * Loud, not silent: a round in which others trained but none of their results reached us is a failure of the
   * network, not a good round. After NO_EXCHANGE_WARN_ROUNDS such rounds in a row we say so, naming the peers we
   * could not dial and the addresses we tried (then again every 10 rounds while it lasts).
   */
  private checkExchange(step: number, peersApplied: number, otherTrainers: number): void {
    if (peersApplied > 0 || otherTrainers === 0) {
      this.noExchangeRounds = 0
      return
    }
    this.noExchangeRounds++
    const n = this.noExchangeRounds
    if (n < NO_EXCHANGE_WARN_ROUNDS || (n - NO_EXCHANGE_WARN_ROUNDS) % 10 !== 0) return
    const unreachable = (this.p2p.unreachablePeers?.() ?? []).map((f) => ({peer_id: f.peer_id, addrs: f.addrs, reason: f.reason.slice(0, 300)}))
    this.opts.log({
      event: 'no_exchange',
      step,
      rounds: n,
      other_trainers: otherTrainers,
      peers: this.p2p.stats().peers,
      unreachable,
      detail: `applied no peer's results for ${n} rounds while ${otherTrainers} other client(s) trained: this client trains alone`,
    })
  }

  /** This round's forward/backward, started before the previous round's results are all here (train). */
  private begun: {step: number; batches: number; done: Promise<number>} | undefined

  private async train(round: Round, range: {start: number; end: number}, previous?: Round): Promise<boolean> {
    // Overlap: the forward/backward of this round needs only this round's data, so it runs on the worker while the
    // previous round's accepted results finish downloading; applying them and producing our result come after.
    if (this.begun?.step !== round.step) {
      const assigned = Array.from({length: range.end - range.start}, (_, i) => range.start + i)
      const ids = this.opts.producer?.batches?.(assigned, round) ?? assigned
      const tokens = await this.data.getSamples(ids)
      const started = performance.now()
      this.begun = {step: round.step, batches: ids.length, done: this.worker.beginRound(tokens, ids.length, round.step).then(() => performance.now() - started)}
    }
    const begun = this.begun
    let before: {applyStep: number; results: Uint8Array[]; peers: number; peersAccepted: number} | undefined
    let applyMs = 0
    if (previous) {
      const collecting = performance.now()
      const results = await this.acceptedBytes(previous)
      applyMs = performance.now() - collecting
      if (!results) {
        await begun.done // one request at a time on the worker; retried (or the model dropped) after this
        if (this.modelStep === null) this.begun = undefined
        return this.modelStep === null
      }
      before = {applyStep: previous.step, results, peers: results.peers ?? 0, peersAccepted: results.peersAccepted ?? 0}
    }
    const forwardBackwardMs = await begun.done
    // finish_round consumes the forward/backward whatever happens: a retry begins the round again
    this.begun = undefined
    const finishing = performance.now()
    let r: Awaited<ReturnType<ClientComponents['worker']['finishRound']>>
    try {
      r = await this.worker.finishRound(round.step, before)
    } catch (error) {
      if (previous && this.refusedByWorker(error, previous.step)) return false
      throw error
    }
    const computeMs = forwardBackwardMs + performance.now() - finishing
    this.trainedStep = round.step
    this.ledger.at(round.step).trained = {loss: r.loss, resultBytes: r.result.length, computeMs}
    // The previous round's event waits until our result is out (and the validation loss, when due, is in).
    const applied = previous && before ? this.afterApply(previous, r.paramHash, before.results.length, before.peers, before.peersAccepted, applyMs) : undefined
    const producing = performance.now()
    const own = this.opts.producer
      ? await this.hostilePublish(round, range, r.result)
      : {announcement: await this.p2p.publishResult(round.step, range.start, range.end, r.result), bytes: r.result}
    const produceMs = performance.now() - producing
    const record = this.ledger.at(round.step)
    if (own) {
      record.own = own.announcement
      this.intake.own(own.announcement, own.bytes)
      record.results.set(this.id, {client_id: this.id, step: round.step, batch_start: range.start, batch_end: range.end, commitment: own.announcement.commitment, bytes: own.bytes})
    }
    this.flushMessages()
    if (applied) await this.reportRound(applied)
    this.opts.log({
      event: 'trained',
      step: round.step,
      loss: r.loss,
      batches: begun.batches,
      result_bytes: r.result.length,
      compute_ms: Math.round(computeMs),
      produce_ms: Math.round(produceMs),
    })
    this.flushMessages()
    return true
  }
  /** Test-only: a hostile producer publishes instead of us (ClientOptions.producer). */
  private async hostilePublish(round: Round, range: {start: number; end: number}, honest: Uint8Array): Promise<{announcement: ResultAnnouncement; bytes: Uint8Array} | undefined> {
    let first: ResultAnnouncement | undefined
    const ctx: ProducerContext = {
      step: round.step,
      range,
      honest,
      format: this.resultFormat,
      peerResults: (step) => {
        const out = new Map<ClientId, Uint8Array>()
        for (const [id, h] of this.ledger.get(step)?.results ?? []) if (id !== this.id && h.bytes && h.bytes.length > 0) out.set(id, h.bytes)
        return out
      },
      publish: async (bytes, step = round.step, r = range) => {
        const announcement = await this.p2p.publishResult(step, r.start, r.end, bytes)
        if (step === round.step) first ??= announcement
        return announcement
      },
      state: () => this.state,
    }
    const kept = await this.opts.producer!.publish(ctx)
    return kept && first ? {announcement: first, bytes: kept} : undefined
  }
}

/** The model-init seed of a run: every client of the first epoch initialises identical parameters from it. */
export function seedForRun(runId: string): number {
  let h = 2166136261
  for (const byte of Buffer.from(`psyche/init/${runId}`, 'utf8')) h = Math.imul(h ^ byte, 16777619) >>> 0
  return h & 0x7fffffff
}
