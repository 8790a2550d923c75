import type {EventLine} from '../../src/core/events.js'
import {createHash} from 'node:crypto'
import {existsSync, mkdirSync, readFileSync, writeFileSync} from 'node:fs'
import {join} from 'node:path'
import {EventEmitter} from 'node:events'
import type {BackendConnector, CoordinatorBackend, JoinRequest, PeerDirectory, RejectionInfo} from '../../src/core/backend/types.js'
import type {Clock, ClientComponents, ClientP2P, ClientP2PStats, ClientWorker} from '../../src/core/client/components.js'
import {PsycheClient, type ClientOptions, type ClientSummary, type ResultProducer, type RoundEvent} from '../../src/core/client/runner.js'
import type {EvalSettings} from '../../src/core/client/eval.js'
import type {HubRepo} from '../../src/core/config/types.js'
import {
  applyEvent,
  createCoordinator,
  tick,
  type AccusationReason,
  type ClientId,
  type CoordinatorEvent,
  type CoordinatorState,
  type WitnessProof,
} from '../../src/core/coordinator/index.js'
import {emptyLedger, observeTransition, recordScores, rewardRows, scoreToFixed, type RewardRow, type RewardsLedger} from '../../src/core/coordinator/rewards.js'
import type {DataProvider} from '../../src/core/data/provider.js'
import type {ModelSnapshot, ResultAnnouncement} from '../../src/core/p2p/index.js'
import {sha256Hex, signAnnouncement} from '../../src/core/primitives/announcement.js'
import {resultCommitment} from '../../src/core/primitives/pieces.js'
import {generateIdentity, type Identity} from '../../src/core/protocol/identity.js'
import type {EquivocationProof} from '../../src/core/coordinator/equivocation.js'
import type {ResultFormat} from '../../src/core/verify/result.js'
import type {Frame} from '../../src/core/worker/client.js'
import type {ModelInfo, StepResult, TrainingSetup} from '../../src/core/worker/model-worker.js'
import {baseConfig, baseLLM} from '../coordinator/helpers.js'

/**
 * The in-process simulation: several real PsycheClients, each with in-memory components — the pure coordinator
 * machine behind a backend that delivers like a link would (asynchronously), a map-backed P2P layer, a worker
 * double with deterministic results and hashes, and one manual clock for everyone. Virtual time only moves when
 * the test advances it, so a whole epoch takes milliseconds.
 */

/** Lets every pending promise, microtask and setImmediate callback run (in-memory work never waits on timers). */
export async function settle(turns = 8): Promise<void> {
  for (let i = 0; i < turns; i++) await new Promise<void>((resolve) => setImmediate(resolve))
}

// ---- time ----

/** A clock that only moves when advanced; sleepers wake when their time has come. */
export class ManualClock implements Clock {
  private ms = 1_000_000
  private sleepers: {at: number; resolve: () => void}[] = []

  now(): number {
    return this.ms
  }

  sleep(ms: number): Promise<void> {
    return new Promise((resolve) => this.sleepers.push({at: this.ms + ms, resolve}))
  }

  /** Moves time forward by `ms` and wakes the sleepers that are due. */
  advance(ms: number): void {
    this.ms += ms
    const due = this.sleepers.filter((s) => s.at <= this.ms)
    this.sleepers = this.sleepers.filter((s) => s.at > this.ms)
    for (const s of due) s.resolve()
  }
}

// ---- coordinator ----

interface Link {
  id: ClientId
  backend: InProcessBackend
  up: boolean
}

/**
 * The coordinator in-process: the pure machine, ticked on the manual clock (milliseconds),
 * with the centralized server's rules around it — a hello joins, a lost link withdraws (withdrawOnDisconnect),
 * every accepted event is followed by a tick, and every new state is pushed to every link.
 */
class InProcessCoordinator {
  state: CoordinatorState
  peers: PeerDirectory = {}
  private readonly links = new Map<ClientId, Link>()
  /** Events the coordinator refused, for assertions. */
  readonly refusals: {from: ClientId; type: string; code: string; message: string; run_state: string; client_saw: string}[] = []
  /** Accepted client events, by type. */
  readonly accepted = new Map<string, number>()
  /** The rewards ledger, following every state adopted, as the server keeps it (coordinator/rewards.ts). */
  rewards: RewardsLedger = emptyLedger()

  constructor(
    readonly clock: ManualClock,
    state: CoordinatorState,
    private readonly o: {withdrawOnDisconnect: boolean} = {withdrawOnDisconnect: true},
  ) {
    this.state = state
  }

  /** The coordinator's clock: unix milliseconds, as the machine counts time. */
  get now(): number {
    return this.clock.now()
  }

  /** A connector for one client: each connect() is a new link (hello, join, first state). */
  connector(id: ClientId): BackendConnector {
    return {
      description: `in-process coordinator`,
      connect: async (join: JoinRequest) => {
        await settle(1)
        const backend = new InProcessBackend(this, id)
        this.hello(id, backend, join)
        return backend
      },
    }
  }

  tick(): void {
    this.commit(tick(this.state, this.now))
  }

  /** Each client's rewards, as `psyche rewards` shows them. */
  get rewardRows(): RewardRow[] {
    return rewardRows(this.rewards, this.state)
  }

  /** An authority event (pause, resume...): must be accepted. */
  authority(event: Extract<CoordinatorEvent, {type: 'pause' | 'resume' | 'eject'}>): void {
    const r = applyEvent(this.state, event, this.now)
    if (r.error) throw new Error(`${event.type} refused: ${r.error.code} ${r.error.message}`)
    this.commit(r.state)
    this.tick()
  }

  /** The link of `id` goes down; it comes back (a fresh hello on the same backend, like a reconnect) after `downMs`. */
  cutLink(id: ClientId, downMs: number): void {
    const link = this.links.get(id)
    if (!link?.up) throw new Error(`${id} has no live link`)
    link.up = false
    link.backend.emitLater('disconnected')
    this.lost(id)
    void this.clock.sleep(downMs).then(() => {
      if (link.backend.closed) return
      this.hello(id, link.backend, {p2pAddrs: link.backend.p2pAddrs})
      link.backend.emitLater('reconnected')
    })
  }

  /** A client's message (from its backend): applied, answered with a refusal if the machine says no. */
  fromClient(id: ClientId, event: CoordinatorEvent, backend: InProcessBackend, of: string): boolean {
    const link = this.links.get(id)
    if (!link || link.backend !== backend || !link.up) return false
    const r = applyEvent(this.state, event, this.now)
    if (r.error) {
      // What the client had seen when it sent: a refusal of a message sent on a stale view is a race, not a bug.
      const saw = backend.state
      this.refusals.push({
        from: id,
        type: event.type,
        code: r.error.code,
        message: r.error.message,
        run_state: `${this.state.run_state}@${this.state.progress.step}`,
        client_saw: `${saw?.run_state}@${saw?.progress.step}`,
      })
      backend.emitLater('rejected', r.error.message, {code: r.error.code, of})
      return true
    }
    this.accepted.set(event.type, (this.accepted.get(event.type) ?? 0) + 1)
    this.commit(r.state)
    this.tick()
    return true
  }

  /** True while `backend` is `id`'s live link (a cut link delivers nothing until it is back). */
  isUp(id: ClientId, backend: InProcessBackend): boolean {
    const link = this.links.get(id)
    return link !== undefined && link.backend === backend && link.up
  }

  closed(id: ClientId, backend: InProcessBackend): void {
    const link = this.links.get(id)
    if (!link || link.backend !== backend) return
    this.links.delete(id)
    if (link.up) this.lost(id)
  }

  private hello(id: ClientId, backend: InProcessBackend, join: JoinRequest): void {
    const old = this.links.get(id)
    if (old && old.backend !== backend) old.backend.replacedBy()
    this.links.set(id, {id, backend, up: true})
    backend.p2pAddrs = join.p2pAddrs
    this.peers = {...this.peers, [id]: join.p2pAddrs}
    const r = applyEvent(this.state, {type: 'join', id}, this.now)
    this.commit(r.state, true)
    this.tick()
    backend.deliver(this.state, this.peers)
  }

  private lost(id: ClientId): void {
    if (!this.o.withdrawOnDisconnect) return
    const {[id]: _gone, ...rest} = this.peers
    this.peers = rest
    this.commit(applyEvent(this.state, {type: 'withdraw', id}, this.now).state, true)
    this.tick()
  }

  private commit(next: CoordinatorState, peersChanged = false): void {
    if (next === this.state && !peersChanged) return
    this.rewards = observeTransition(this.rewards, this.state, next)
    this.state = next
    for (const link of this.links.values()) if (link.up) link.backend.pushLater()
  }
}

/** One client's link to the in-process coordinator: the CoordinatorBackend port. */
class InProcessBackend extends EventEmitter implements CoordinatorBackend {
  state: CoordinatorState | undefined
  peers: PeerDirectory = {}
  p2pAddrs: string[] = []
  closed = false
  private pushPending = false

  constructor(
    private readonly coordinator: InProcessCoordinator,
    private readonly id: ClientId,
  ) {
    super()
  }

  /** Sets the state now (the first one, during connect). */
  deliver(state: CoordinatorState, peers: PeerDirectory): void {
    this.state = state
    this.peers = peers
  }

  /** Pushes the coordinator's latest state on a later turn (coalesced, like a link delivering the newest state). */
  pushLater(): void {
    if (this.pushPending || this.closed) return
    this.pushPending = true
    setImmediate(() => {
      this.pushPending = false
      if (this.closed || !this.coordinator.isUp(this.id, this)) return
      const {state, peers} = this.coordinator
      if (state === this.state && peers === this.peers) return
      this.state = state
      this.peers = peers
      this.emit('state', state, peers)
    })
  }

  emitLater(event: 'disconnected' | 'reconnected'): void
  emitLater(event: 'rejected', reason: string, info: RejectionInfo): void
  emitLater(event: string, ...args: unknown[]): void {
    setImmediate(() => {
      if (!this.closed) this.emit(event, ...args)
    })
  }

  /** The same client connected again through another backend: this one is done. */
  replacedBy(): void {
    this.closed = true
    setImmediate(() => this.emit('closed'))
  }

  private send(event: CoordinatorEvent, of: string): boolean {
    if (this.closed) return false
    return this.coordinator.fromClient(this.id, event, this, of)
  }

  sendWitness(step: number, proof: WitnessProof): boolean {
    // The server refuses proofs for steps older than the current one before the machine sees them.
    if (this.closed) return false
    if (step < this.coordinator.state.progress.step) return true
    return this.send({type: 'witness', from: this.id, step, proof}, 'witness')
  }

  sendWarmupReady(): boolean {
    return this.send({type: 'witness', from: this.id, step: this.state?.progress.step ?? 0, proof: {participant_bloom: '', broadcast_bloom: ''}}, 'witness')
  }

  sendHealthCheck(_step: number, accused: ClientId[]): boolean {
    return this.send({type: 'health_check', from: this.id, accused}, 'health_check')
  }

  sendAccusation(step: number, accused: ClientId, reason: AccusationReason): boolean {
    return this.send({type: 'accuse', from: this.id, step, accused, reason}, 'accuse')
  }

  sendEquivocation(proof: EquivocationProof): boolean {
    return this.send({type: 'equivocation', from: this.id, proof}, 'equivocation')
  }

  /** As the server takes them: rounded to fixed point once, then by the ledger's rule (recordScores) against the coordinator's current state. */
  sendScores(step: number, scores: {client_id: ClientId; score: number}[]): boolean {
    if (this.closed) return false
    const c = this.coordinator
    const fixed = scores.map((e) => ({client_id: e.client_id, score: scoreToFixed(e.score)}))
    const out = recordScores(c.rewards, c.state, this.id, step, fixed)
    if ('code' in out) c.refusals.push({from: this.id, type: 'scores', code: out.code, message: out.reason, run_state: c.state.run_state, client_saw: this.state?.run_state ?? ''})
    else c.rewards = out
    return true
  }

  sendWithdraw(): boolean {
    return this.send({type: 'withdraw', id: this.id}, 'withdraw')
  }

  sendCooldownWitness(step: number, paramHash: string): boolean {
    return this.send({type: 'witness', from: this.id, step, proof: {participant_bloom: '', broadcast_bloom: ''}, param_hash: paramHash}, 'witness')
  }

  sendCheckpoint(repo: HubRepo, paramHash?: string): boolean {
    return this.send({type: 'checkpoint', from: this.id, repo, ...(paramHash === undefined ? {} : {param_hash: paramHash})}, 'checkpoint')
  }

  async close(): Promise<void> {
    if (this.closed) return
    this.closed = true
    this.coordinator.closed(this.id, this)
    this.emit('closed')
  }
}

// ---- P2P ----

/** The map-backed network: nodes by client id; a node that is offline neither sends, receives nor serves. */
export class MemoryNetwork {
  readonly nodes = new Map<ClientId, MemoryP2P>()
  private readonly offline = new Set<ClientId>()

  constructor(readonly runId: string) {}

  node(identity: Identity): MemoryP2P {
    const node = new MemoryP2P(this, identity)
    this.nodes.set(identity.id, node)
    return node
  }

  setOnline(id: ClientId, online: boolean): void {
    if (online) this.offline.delete(id)
    else this.offline.add(id)
  }

  online(id: ClientId): boolean {
    return !this.offline.has(id) && this.nodes.get(id)?.stopped === false
  }

  reachable(a: ClientId, b: ClientId): boolean {
    return this.online(a) && this.online(b) && this.nodes.get(a)!.connected.has(b)
  }
}

export class MemoryP2P implements ClientP2P {
  stopped = false
  readonly connected = new Set<ClientId>()
  private readonly results = new Map<string, {step: number; bytes: Uint8Array}>()
  private readonly handlers: ((a: ResultAnnouncement) => void)[] = []
  private readonly seen = new Set<string>()
  private modelProvider: (() => Promise<ModelSnapshot>) | undefined
  private bytesSent = 0
  private bytesReceived = 0
  /** Results downloaded from peers, by step. */
  readonly fetchedByStep = new Map<number, number>()

  constructor(
    private readonly net: MemoryNetwork,
    private readonly identity: Identity,
  ) {}

  get id(): ClientId {
    return this.identity.id
  }

  addresses(): string[] {
    return [`/memory/${this.id}`]
  }

  async connect(addrs: string[]): Promise<void> {
    for (const addr of addrs) {
      const peer = addr.replace('/memory/', '')
      const other = this.net.nodes.get(peer)
      if (!other || peer === this.id || other.stopped) continue
      this.connected.add(peer)
      other.connected.add(this.id)
    }
  }

  async publishResult(step: number, batchStart: number, batchEnd: number, blob: Uint8Array): Promise<ResultAnnouncement> {
    const a = signAnnouncement(this.identity, {
      run_id: this.net.runId,
      step,
      client_id: this.id,
      batch_start: batchStart,
      batch_end: batchEnd,
      commitment: resultCommitment(blob),
      size: blob.length,
    })
    this.results.set(a.commitment, {step, bytes: blob})
    this.seen.add(a.signature)
    this.gossip(a)
    return a
  }

  async reannounce(a: ResultAnnouncement): Promise<void> {
    this.gossip(a)
  }

  topicPeers(): number {
    return [...this.connected].filter((p) => this.net.reachable(this.id, p)).length
  }

  onAnnouncement(handler: (a: ResultAnnouncement) => void): void {
    this.handlers.push(handler)
  }

  async fetchResult(a: ResultAnnouncement): Promise<Uint8Array> {
    const local = this.results.get(a.commitment)
    if (local) return local.bytes
    await settle(1)
    const holders = [a.client_id, ...this.connected].filter((p) => p !== this.id && this.net.reachable(this.id, p))
    for (const holder of holders) {
      const bytes = this.net.nodes.get(holder)!.results.get(a.commitment)?.bytes
      if (!bytes || resultCommitment(bytes) !== a.commitment) continue
      this.results.set(a.commitment, {step: a.step, bytes})
      this.fetchedByStep.set(a.step, (this.fetchedByStep.get(a.step) ?? 0) + 1)
      this.bytesReceived += bytes.length
      this.net.nodes.get(holder)!.bytesSent += bytes.length
      return bytes
    }
    throw new Error(`no reachable peer holds result ${a.commitment.slice(0, 12)} of step ${a.step}`)
  }

  getResult(commitment: string): Uint8Array | undefined {
    return this.results.get(commitment)?.bytes
  }

  dropResultsBefore(step: number): void {
    for (const [c, r] of this.results) if (r.step < step) this.results.delete(c)
  }

  serveModel(provider: () => Promise<ModelSnapshot>): void {
    this.modelProvider = provider
  }

  /** The first reachable peer's model (with `paramHash`, the first serving that model, as the real download chooses). */
  async fetchModel(fromClientIds: string[], options: {step?: number; paramHash?: string} = {}): Promise<ModelSnapshot> {
    await settle(1)
    const failures: string[] = []
    for (const id of fromClientIds) {
      const peer = this.net.nodes.get(id)
      if (id === this.id || !peer?.modelProvider || !this.net.online(id) || !this.net.online(this.id)) {
        failures.push(`${id.slice(0, 8)}: unreachable`)
        continue
      }
      try {
        const snapshot = await peer.modelProvider()
        if (options.paramHash !== undefined && snapshot.paramHash !== options.paramHash) {
          failures.push(`${id.slice(0, 8)}: serves another model than the run's (${snapshot.paramHash.slice(0, 12)}…)`)
          continue
        }
        const size = snapshot.frames.reduce((n, f) => n + f.data.length, 0)
        this.bytesReceived += size
        peer.bytesSent += size
        return {...snapshot, frames: snapshot.frames.map((f) => ({...f, data: f.data.slice()}))}
      } catch (error) {
        failures.push(`${id.slice(0, 8)}: ${(error as Error).message}`)
      }
    }
    throw new Error(`could not fetch the model from any peer: ${failures.join('; ') || 'no peers given'}`)
  }

  stats(): ClientP2PStats {
    return {bytesSent: this.bytesSent, bytesReceived: this.bytesReceived, peers: this.topicPeers()}
  }

  async stop(): Promise<void> {
    this.stopped = true
  }

  /** Delivers an announcement to every reachable peer, each once, on a later turn. */
  private gossip(a: ResultAnnouncement): void {
    for (const peer of this.connected) {
      if (!this.net.reachable(this.id, peer)) continue
      const node = this.net.nodes.get(peer)!
      setImmediate(() => node.receive(a))
    }
  }

  private receive(a: ResultAnnouncement): void {
    if (this.stopped || this.seen.has(a.signature) || !this.net.online(this.id)) return
    this.seen.add(a.signature)
    for (const h of this.handlers) h(a)
  }
}

// ---- worker ----

function sha256(...parts: (string | Uint8Array)[]): Buffer {
  const h = createHash('sha256')
  for (const p of parts) h.update(p)
  return h.digest()
}

/**
 * A worker double: the "model" is 32 bytes, and every operation is a deterministic function of its inputs —
 * init from the seed, a result from (parameters, step, tokens), an apply from (parameters, step, the results
 * sorted by hash, as the real worker orders them). Replicas that apply the same results in the same steps have
 * the same hash; replicas that do not, differ.
 */
export class DeterministicWorker implements ClientWorker {
  readonly pid = undefined
  readonly exited: Promise<void>
  params: Buffer = Buffer.alloc(32)
  configured: TrainingSetup | undefined
  /** Every apply: step and how many results. */
  readonly applies: {step: number; results: number}[] = []
  private exit!: () => void
  private crashed = false

  constructor() {
    this.exited = new Promise((resolve) => (this.exit = resolve))
  }

  get paramHash(): string {
    return this.params.toString('hex')
  }

  private async op(): Promise<void> {
    if (this.crashed) throw new Error('worker is gone')
    await settle(1)
    if (this.crashed) throw new Error('worker is gone')
  }

  private info(): ModelInfo {
    return {parameters: 8, vocab_size: 256, max_position_embeddings: 1024, param_hash: this.paramHash}
  }

  /** A directory this worker saved holds its parameters (params.bin); any other is an init from its path. */
  async load(modelDir: string, seed = 0): Promise<ModelInfo> {
    await this.op()
    const saved = join(modelDir, 'params.bin')
    this.params = existsSync(saved) ? readFileSync(saved) : sha256('init', modelDir, String(seed))
    return this.info()
  }

  /** Writes the parameters as a model directory (what a checkpointer uploads). */
  async save(dir: string, options: {card?: Record<string, string | number>} = {}): Promise<void> {
    await this.op()
    mkdirSync(dir, {recursive: true})
    writeFileSync(join(dir, 'params.bin'), this.params)
    writeFileSync(join(dir, 'config.json'), JSON.stringify({sim: true}))
    writeFileSync(join(dir, 'README.md'), JSON.stringify(options.card ?? {}))
  }

  async initFromConfig(config: Record<string, unknown>, seed: number): Promise<ModelInfo> {
    await this.op()
    this.params = sha256('init', JSON.stringify(config), String(seed))
    return this.info()
  }

  async configure(setup: TrainingSetup): Promise<{resultFormat?: ResultFormat}> {
    await this.op()
    this.configured = setup
    return {}
  }

  private begun: {step: number; result: Uint8Array; tokens: number; speculative: boolean} | undefined

  /** Speculative rounds: begun, and of those, undone (discardRound). */
  speculated = 0
  discarded = 0

  /** Like the real worker: the result depends on the parameters the forward/backward ran at. */
  async beginRound(tokens: Uint32Array, rows: number, step: number, options: {speculative?: boolean} = {}): Promise<{loss: number; grad_norm: number}> {
    await this.op()
    const result = new Uint8Array(sha256('result', this.params, String(step), new Uint8Array(tokens.buffer, tokens.byteOffset, tokens.byteLength)))
    const speculative = options.speculative === true
    if (speculative) this.speculated++
    this.begun = {step, result, tokens: tokens.length - rows, speculative}
    return {loss: 2 + (result[0] / 255) * 0.5, grad_norm: 1}
  }

  /** Like the real worker's discard_round: only a speculative round that is begun. */
  async discardRound(step: number): Promise<void> {
    await this.op()
    if (this.begun?.step !== step || !this.begun.speculative) throw new Error(`discard_round for step ${step}, which is not begun speculative`)
    this.begun = undefined
    this.discarded++
  }

  async finishRound(step: number, previous?: {applyStep: number; results: Uint8Array[]}): Promise<StepResult & {result: Uint8Array; paramHash: string; applied: number}> {
    await this.op()
    if (this.begun?.step !== step) throw new Error(`finish_round for step ${step} without its begin_round`)
    const {result, tokens} = this.begun
    this.begun = undefined
    if (previous) this.apply(previous.applyStep, previous.results)
    const loss = 2 + (result[0] / 255) * 0.5
    return {loss, grad_norm: 1, lr: 1e-3, tokens, result, paramHash: this.paramHash, applied: previous?.results.length ?? 0}
  }

  /** Scores every result as honest work (its own batch's loss falls by 0.1, the shared batch's not at all); counts calls. */
  async scoreResults(_step: number, results: Uint8Array[], batches: {tokens: Uint32Array; rows: number}[]): Promise<{before: number[]; after: [number, number][]}> {
    await this.op()
    this.scored += results.length
    return {before: batches.map(() => 2), after: results.map(() => [1.9, 2])}
  }

  /** How many results scoreResults scored. */
  scored = 0

  async applyResults(step: number, results: Uint8Array[]): Promise<string> {
    await this.op()
    this.apply(step, results)
    return this.paramHash
  }

  /** A loss that is a function of the parameters and the tokens: equal on equal replicas, changed by every apply. */
  async evaluate(tokens: Uint32Array, rows: number): Promise<{loss: number; tokens: number}> {
    await this.op()
    const h = sha256('evaluate', this.params, Buffer.from(tokens.buffer, tokens.byteOffset, tokens.byteLength))
    this.evaluations++
    return {loss: 2 + h.readUInt32LE(0) / 2 ** 32, tokens: tokens.length - rows}
  }

  /** How many evaluations ran. */
  evaluations = 0

  async exportParams(): Promise<{frames: Frame[]; paramHash: string}> {
    await this.op()
    return {frames: [{name: 'params', dtype: 'uint8', shape: [32], data: new Uint8Array(this.params)}], paramHash: this.paramHash}
  }

  async importParams(frames: Frame[]): Promise<string> {
    await this.op()
    const f = frames[0]
    this.params = Buffer.from(new Uint8Array(f.data.buffer, f.data.byteOffset, f.data.byteLength))
    return this.paramHash
  }

  async shutdown(): Promise<void> {
    this.exit()
  }

  /** The worker process dies. */
  crash(): void {
    this.crashed = true
    this.exit()
  }

  private apply(step: number, results: Uint8Array[]): void {
    const sorted = [...results].sort((a, b) => sha256Hex(a).localeCompare(sha256Hex(b)))
    this.params = sha256('apply', this.params, String(step), ...sorted)
    this.applies.push({step, results: results.length})
  }
}

// ---- data ----

/** Samples as a pure function of the batch id (seqLen + 1 tokens each). */
export function memoryData(seqLen: number): DataProvider {
  return {
    description: 'memory',
    numSamples: () => undefined,
    vocabSize: () => 256,
    getSamples: async (ids) => {
      const out = new Uint32Array(ids.length * (seqLen + 1))
      ids.forEach((id, row) => {
        for (let j = 0; j <= seqLen; j++) out[row * (seqLen + 1) + j] = (id * 31 + j * 7) % 256
      })
      return out
    },
    close: async () => {},
  }
}

// ---- the simulation ----

export interface SimClient {
  name: string
  identity: Identity
  client: PsycheClient
  worker: DeterministicWorker
  p2p: MemoryP2P
  events: EventLine[]
  rounds: RoundEvent[]
  /** Settles with run()'s outcome. */
  done: Promise<ClientSummary | Error>
}

export const SIM_SEQ_LEN = 16

/** A run's coordinator config for the simulation: short phases (seconds of virtual time). */
export function simRun(config: Partial<typeof baseConfig> = {}, llm: Partial<typeof baseLLM> = {}): CoordinatorState {
  return createCoordinator(
    {
      run_id: 'sim-run',
      run_state: 'WaitingForMembers',
      config: {
        ...baseConfig,
        warmup_time: 5,
        cooldown_time: 2,
        max_round_train_time: 5,
        round_witness_time: 2,
        epoch_time: 30,
        min_clients: 2,
        init_min_clients: 3,
        witness_nodes: 2,
        total_steps: 1000,
        ...config,
      },
      // Dummy: the plan's model at the first epoch (a Hub checkpoint would be downloaded), P2P after it.
      model: {LLM: {...baseLLM, max_seq_len: SIM_SEQ_LEN, checkpoint: {Dummy: {repo_id: 'org/sim'}}, ...llm}},
    },
    {now: 1_000_000, seed: '11'.repeat(32)},
  )
}

export class Simulation {
  readonly clock = new ManualClock()
  readonly coordinator: InProcessCoordinator
  readonly net: MemoryNetwork
  readonly clients: SimClient[] = []

  constructor(state: CoordinatorState, o: {withdrawOnDisconnect?: boolean} = {}) {
    this.coordinator = new InProcessCoordinator(this.clock, state, {withdrawOnDisconnect: o.withdrawOnDisconnect ?? true})
    this.net = new MemoryNetwork(state.run_id)
  }

  /** Starts a real PsycheClient on in-memory components (joining through the in-process coordinator). */
  async addClient(
    name: string,
    identity: Identity = generateIdentity(),
    o: {
      hub?: ClientOptions['hub']
      checkpointDir?: string
      workerRestarts?: number
      eval?: EvalSettings
      evalData?: DataProvider
      producer?: ResultProducer
      speculate?: boolean
    } = {},
  ): Promise<SimClient> {
    const events: EventLine[] = []
    const worker = new DeterministicWorker()
    const p2p = this.net.node(identity)
    const components: ClientComponents = {backend: this.coordinator.connector(identity.id), p2p, worker, data: memoryData(SIM_SEQ_LEN), clock: this.clock}
    if (o.evalData) components.evalData = o.evalData
    // a hostile result producer (test/sim/adversarial.test.ts), injected as the multi-process adversary does
    if (o.producer) components.producer = o.producer
    if (o.workerRestarts) {
      components.restartWorker = async () => {
        sim.worker = new DeterministicWorker()
        return sim.worker
      }
    }
    const client = await PsycheClient.start(
      {
        id: identity.id,
        runId: this.coordinator.state.run_id,
        plan: {
          model: {kind: 'config', configPath: 'sim/config.json', config: {sim: true}},
          seqLen: SIM_SEQ_LEN,
          microBatch: 1,
          optimizer: {AdamW: {betas: [0.9, 0.95], weight_decay: 0, eps: 1e-8}},
        } as never,
        seed: 7,
        log: (e) => events.push(e),
        ...(o.hub ? {hub: o.hub} : {}),
        ...(o.checkpointDir ? {checkpointDir: o.checkpointDir} : {}),
        workerRestarts: o.workerRestarts,
        eval: o.eval,
        ...(o.speculate === false ? {speculate: false} : {}),
      },
      components,
    )
    const sim: SimClient = {
      name,
      identity,
      client,
      worker,
      p2p,
      events,
      get rounds() {
        return events.filter((e) => e.event === 'round')
      },
      done: client.run().catch((error: Error) => error),
    }
    this.clients.push(sim)
    return sim
  }

  /** Advances virtual time in `stepMs` steps (ticking the coordinator) until `until()` holds; throws after `maxMs`. */
  async runUntil(until: () => boolean, o: {maxMs?: number; stepMs?: number; what?: string} = {}): Promise<number> {
    const maxMs = o.maxMs ?? 300_000
    const stepMs = o.stepMs ?? 100
    let elapsed = 0
    await settle()
    while (!until()) {
      if (elapsed >= maxMs)
        throw new Error(
          `simulation: ${o.what ?? 'condition'} not reached within ${maxMs / 1000} s of virtual time (run state ${this.coordinator.state.run_state}, step ${this.coordinator.state.progress.step})`,
        )
      this.clock.advance(stepMs)
      elapsed += stepMs
      this.coordinator.tick()
      await settle()
    }
    return elapsed
  }

  /** Runs until every listed client has applied round `step`. */
  async untilApplied(step: number, who: SimClient[] = this.clients, maxMs?: number): Promise<void> {
    await this.runUntil(() => who.every((c) => c.rounds.some((r) => r.step >= step)), {maxMs, what: `round ${step} applied by ${who.map((c) => c.name).join(', ')}`})
  }

  /** Each step's param_hash per client (only steps the client applied). */
  hashesByStep(who: SimClient[] = this.clients): Map<number, Map<string, string>> {
    const out = new Map<number, Map<string, string>>()
    for (const c of who) {
      for (const r of c.rounds) {
        let m = out.get(r.step)
        if (!m) out.set(r.step, (m = new Map()))
        m.set(c.name, r.param_hash)
      }
    }
    return out
  }

  /** Stops every client still running and waits for their run() to end. */
  async stop(): Promise<void> {
    for (const c of this.clients) c.client.stop()
    let all = false
    void Promise.all(this.clients.map((c) => c.done)).then(() => (all = true))
    await this.runUntil(() => all, {what: 'every client to stop', maxMs: 10_000})
  }
}
