import type {BackendConnector} from '../backend/types.js'
import type {Clock} from '../primitives/clock.js'
import type {ClientId, CoordinatorState, Round} from '../coordinator/index.js'
import type {DataProvider} from '../data/provider.js'
import type {ModelSnapshot, ResultAnnouncement} from '../p2p/index.js'
import type {ResultFormat} from '../verify/result.js'
import type {Frame} from '../worker/client.js'
import type {ModelInfo, StepResult, TrainingSetup} from '../worker/model-worker.js'

/**
 * The parts a PsycheClient runs with, passed in from outside (the way js-libp2p passes its components): the
 * `join` command builds the real ones (TCP coordinator connection, libp2p node, PyTorch worker, data provider,
 * system clock); the in-process simulation builds in-memory ones. The client owns them once started: it stops
 * them all when it ends.
 */
export interface ClientComponents {
  backend: BackendConnector
  p2p: ClientP2P
  worker: ClientWorker
  data: DataProvider
  clock: Clock
  /** A held-out split for the validation loss (eval.ts); without it the tail of `data` is held out, when the run never reaches it. */
  evalData?: DataProvider
  /** Starts a new worker, set up like the first, in place of one that died (ClientOptions.workerRestarts). */
  restartWorker?: () => Promise<ClientWorker>
  /**
   * How this client trains on its batches and publishes its result; default honestProducer. Tests give a hostile
   * one (test/adversarial/, test/sim/adversarial.test.ts) to run the real client as an attacker; no CLI flag does.
   */
  producer?: ResultProducer
}

/** What a result producer gets: the honest result, the peers' results so far, and a way to publish anything. */
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
  /**
   * Publishes this round's result; returns what this client keeps as its own result (or nothing). The first
   * announcement published for the round's step is our own one.
   */
  publish(ctx: ProducerContext): Promise<Uint8Array | undefined>
}

/** The producer every real client uses: trains on its assigned batches and publishes the honest result. */
export const honestProducer: ResultProducer = {
  async publish(ctx) {
    await ctx.publish(ctx.honest)
    return ctx.honest
  },
}

/** Traffic counters of the P2P layer, reported in each round event. */
export interface ClientP2PStats {
  bytesSent: number
  bytesReceived: number
  peers: number
  /** Bytes per remote peer (client id, or libp2p peer id), cumulative; absent when the P2P layer does not count them. */
  peerBytes?: Record<string, {in: number; out: number}>
  /** Of those, bytes that went through a circuit relay: in total and per peer; absent when not counted. */
  relayedSent?: number
  relayedReceived?: number
  peerRelayedBytes?: Record<string, {in: number; out: number}>
}

/** What the client needs from its P2P layer (the libp2p P2PNode satisfies it). */
export interface ClientP2P {
  /** Our addresses, published to the other clients through the coordinator's peer directory. */
  addresses(): string[]
  /**
   * Connects to peers learned from the coordinator's peer directory (a failed dial is retried by a later call;
   * `retry`: a call for that alone, which leaves out the addresses of another LAN that already did not answer).
   */
  connect(addrs: string[], options?: {retry?: boolean}): Promise<void>
  /** Stores our result for serving and announces it to the run. */
  publishResult(step: number, batchStart: number, batchEnd: number, blob: Uint8Array): Promise<ResultAnnouncement>
  /** Announces one of ours again to the peers that have not had it from us (new peers do not get earlier gossip). */
  reannounce(a: ResultAnnouncement): Promise<void>
  /** How many peers receive our announcements. */
  topicPeers(): number
  /** Verified announcements of other clients' results, each delivered once. */
  onAnnouncement(handler: (a: ResultAnnouncement) => void): void
  /** Downloads an announced result (bytes checked against its commitment). */
  fetchResult(a: ResultAnnouncement): Promise<Uint8Array>
  /** A result already held (ours, or downloaded). */
  getResult(commitment: string): Uint8Array | undefined
  dropResultsBefore(step: number): void
  /** What we answer model requests with (a rejoining client's source). */
  serveModel(provider: () => Promise<ModelSnapshot>): void
  /**
   * Downloads the model from these clients: the tensors of the manifest of the model with `paramHash` (the run's
   * current model; without it, the manifest a majority of them sign), at `step` when given, spread over its signers
   * and each checked against its hash.
   */
  fetchModel(fromClientIds: string[], options?: {step?: number; paramHash?: string}): Promise<ModelSnapshot>
  stats(): ClientP2PStats
  stop(): Promise<void>
  // Networking across hosts (libp2p); an in-process P2P layer has no addresses to change and no relays.
  /** Called with our new addresses when they change (a relay reservation, a confirmed observed address). */
  onAddressesChanged?(handler: (addrs: string[]) => void): void
  /** Reserve a slot on these circuit relays (multiaddrs ending in /p2p/<relay id>). */
  useRelays?(addrs: string[]): Promise<void>
  /** Of these clients, the ones we are not connected to (or that do not receive our announcements yet). */
  notConnected?(clientIds: string[]): string[]
  /** Peers we were told about and could not dial, with the addresses tried. */
  unreachablePeers?(): {peer_id: string; addrs: string[]; reason: string}[]
  /** Connections now, direct and relayed. */
  connectionKinds?(): {direct: number; relayed: number}
}

/** What the client needs from its model worker (the PyTorch ModelWorker satisfies it). */
export interface ClientWorker {
  /** For logs: the worker's process id (undefined in-process). */
  readonly pid: number | undefined
  /** Settles when the worker is gone, with why when it can tell (a crash while the client waits is noticed at once). */
  readonly exited: Promise<Error | void>
  load(modelDir: string, seed?: number): Promise<ModelInfo>
  initFromConfig(config: Record<string, unknown>, seed: number): Promise<ModelInfo>
  /** Sets up training; the reply says how results are laid out when the worker knows (DisTrO). */
  configure(setup: TrainingSetup): Promise<{resultFormat?: ResultFormat}>
  /**
   * A round in two requests (ModelWorker.trainRound split): the forward/backward of `step` on `tokens`, then —
   * once the previous round's accepted results are downloaded — apply them and produce this step's result.
   */
  beginRound(tokens: Uint32Array, rows: number, step: number, options?: {speculative?: boolean}): Promise<{loss: number; grad_norm: number}>
  /**
   * Undoes a beginRound of `step` begun with `speculative` (on batches predicted before the round began; the round gave
   * this client others): the worker's state is as if it had never run. A worker without it is never asked to speculate.
   */
  discardRound?(step: number): Promise<void>
  finishRound(step: number, previous?: {applyStep: number; results: Uint8Array[]}): Promise<StepResult & {result: Uint8Array; paramHash: string; applied: number}>
  applyResults(step: number, results: Uint8Array[]): Promise<string>
  /** The mean loss on `tokens` at the replicated parameters (speculation set aside); changes nothing. */
  evaluate(tokens: Uint32Array, rows: number): Promise<{loss: number; tokens: number}>
  /**
   * Verification (optional: a worker without it does not verify): `batches` = each result's assigned batch, then a shared
   * one; losses before, and after each result alone on its own batch and the shared one (ModelWorker.scoreResults).
   */
  scoreResults?(step: number, results: Uint8Array[], batches: {tokens: Uint32Array; rows: number}[]): Promise<{before: number[]; after: ([number, number] | null)[]}>
  exportParams(): Promise<{frames: Frame[]; paramHash: string}>
  importParams(frames: Frame[]): Promise<string>
  /** Writes the model directory (config, weights, tokenizer, card): what a checkpointer uploads. */
  save?(dir: string, options?: {card?: Record<string, string | number>}): Promise<void>
  shutdown(): Promise<void>
}

export {systemClock, type Clock} from '../primitives/clock.js'
