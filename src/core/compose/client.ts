import {resolve} from 'node:path'
import {CoordinatorConnection, type BackendConnector, type CoordinatorBackend} from '../backend/index.js'
import type {JoinRequest} from '../backend/types.js'
import {systemClock, type ClientComponents} from '../client/components.js'
import type {ClientOptions} from '../client/options.js'
import {PsycheClient, seedForRun, type ClientSummary} from '../client/runner.js'
import type {CoordinatorState} from '../coordinator/types.js'
import {openDataProvider, type DataProvider} from '../data/index.js'
import type {EventLine} from '../events.js'
import {WaitingEvents} from '../obs/client-view.js'
import {RoundReporter} from '../obs/report.js'
import {coordinatorSeconds} from '../obs/summary.js'
import {P2PNode, type P2PNodeOptions} from '../p2p/index.js'
import {generateIdentity, loadIdentity, type Identity} from '../protocol/identity.js'
import type {TrainPlan} from '../train/plan.js'
import {shuffleSeedFor} from '../train/single-node.js'
import {ModelWorker} from '../worker/model-worker.js'
import type {SolanaSetup} from './solana.js'

// The composition root: where a client's real components are built and wired, for either backend (commands only
// parse flags, call this and render; tests that run the real client, such as test/adversarial, build it here too).

type ProviderLocation = Parameters<typeof openDataProvider>[0]
type Log = (event: EventLine) => void

/** libp2p listen and announce addresses; quic false: TCP only (join --no-quic); WebRTC's options (join --stun, --webrtc-*); model uploads to joiners (join --max-model-uploads*); connection and serving bounds (join --p2p-max-connections, --max-serves-*). */
type P2PSetup = {listen: string[]} & Pick<P2PNodeOptions, 'announce' | 'quic' | 'webrtc' | 'stun' | 'webrtcLimits' | 'modelServeLimits' | 'maxPeerConnections' | 'serving'>

/**
 * The real components of a client: a PyTorch worker, the run's data, a libp2p node, and the coordinator: the TCP
 * server (a new connection per join), or `backend` (the Solana program). Whatever started is stopped again if a
 * later part fails.
 */
export async function startComponents(
  o: ({serverAddr: string} | {backend: BackendConnector}) & {
    runId: string
    identity: Identity
    plan: TrainPlan
    seed: number
    log: Log
    p2p: P2PSetup
  },
): Promise<ClientComponents> {
  const {runId, identity, plan, log} = o
  const startWorker = () =>
    ModelWorker.start({threads: plan.threads, device: plan.device, dataParallel: plan.dataParallel, shard: plan.shard, precision: plan.precision, label: 'client'})
  const worker = await startWorker()
  let p2p: P2PNode | undefined
  let data: DataProvider | undefined
  let evalData: DataProvider | undefined
  try {
    data = await openDataProvider(plan.data as ProviderLocation, {seqLen: plan.seqLen, baseDir: plan.dataBaseDir, shuffleSeed: shuffleSeedFor(o.seed), wrap: true})
    // The held-out split, in the run's shuffled order (the same samples on every client: client/eval.ts).
    if (plan.validation && plan.evalEvery > 0)
      evalData = await openDataProvider(plan.validation as ProviderLocation, {seqLen: plan.seqLen, baseDir: plan.dataBaseDir, shuffleSeed: shuffleSeedFor(o.seed)})
    p2p = await P2PNode.start({identity, runId, ...o.p2p, log: (e) => log({...e, source: 'p2p'})})
  } catch (error) {
    await p2p?.stop()
    await data?.close()
    await evalData?.close()
    await worker.shutdown()
    throw error
  }
  const backend = 'backend' in o ? o.backend : serverConnector({addr: o.serverAddr, runId, identity, log})
  return {backend, p2p, worker, data, evalData, clock: systemClock, restartWorker: startWorker}
}

/** A BackendConnector whose connections are the centralized server's. */
interface ServerConnector {
  readonly description: string
  connect(join: JoinRequest): Promise<CoordinatorConnection>
}

/** The TCP coordinator server at `addr`: a new connection per join (a join is part of the hello). */
function serverConnector(o: {addr: string; runId: string; identity: Identity; log: Log}): ServerConnector {
  return {
    description: `coordinator ${o.addr}`,
    connect: ({p2pAddrs}) =>
      CoordinatorConnection.connect({addr: o.addr, runId: o.runId, identity: o.identity, p2pAddrs, join: true, log: (e) => o.log({...e, source: 'coordinator'})}),
  }
}

/** A client as `psyche join` runs it: which run, which coordinator, with what (its flags, parsed). */
export interface ClientSetup {
  runId: string
  /** The coordinator: the TCP server at host:port, or the run's program on Solana. */
  coordinator: {server: string} | {solana: SolanaSetup}
  /** An identity file (join --identity); default: a new identity (on Solana: the keypair's key). */
  identity?: string
  plan: TrainPlan
  p2p: P2PSetup
  /** What the client runs with beyond its identity, run and plan (join's flags). */
  client: Pick<ClientOptions, 'relays' | 'hub' | 'checkpointDir' | 'keepCheckpoints' | 'workerRestarts' | 'maxRoundsWithoutExchange'>
  /** Every event of the client, its P2P node and its coordinator connection (marked `source`). */
  log: Log
}

/**
 * A client as `psyche join` runs it, for either backend: its key, its coordinator connector, and once started the
 * connection in use (replaced on each rejoin), whose state and clock the command renders. Display-only round reports
 * go over the centralized server's connection; `waiting` events say what the client waits for outside the epoch.
 */
export class ComposedClient {
  private client: PsycheClient | undefined
  private current: CoordinatorBackend | undefined
  /** The centralized server's connection (the Solana program takes no reports and tells no time). */
  private server: CoordinatorConnection | undefined
  private readonly reporter: RoundReporter
  private readonly waiting: WaitingEvents
  private waitTimer: NodeJS.Timeout | undefined

  private constructor(
    private readonly setup: ClientSetup,
    readonly identity: Identity,
    /** Where the coordinator is, for messages. */
    readonly target: string,
    private readonly coordinator: {server: ServerConnector} | {solana: {connector: BackendConnector; address: string; closePeerRecord: () => Promise<boolean>}},
  ) {
    this.reporter = new RoundReporter(setup.plan.seqLen)
    this.waiting = new WaitingEvents(this.log)
  }

  /**
   * Resolves the client's key and its coordinator (on Solana: the keypair, and the program's connector); nothing is
   * started yet (start()).
   */
  static async compose(setup: ClientSetup): Promise<ComposedClient> {
    const c = setup.coordinator
    // The connectors log through the composed client's log (bound once it exists: they log only once connecting).
    let composed: ComposedClient | undefined
    const log: Log = (event) => composed?.log(event)
    if ('server' in c) {
      const identity = setup.identity ? await loadIdentity(resolve(setup.identity)) : generateIdentity()
      composed = new ComposedClient(setup, identity, c.server, {server: serverConnector({addr: c.server, runId: setup.runId, identity, log})})
    } else {
      // The Solana client libraries load only for a Solana run.
      const {solanaCoordinator} = await import('./solana.js')
      const s = await solanaCoordinator(c.solana, {runId: setup.runId, identity: setup.identity, log})
      composed = new ComposedClient(setup, s.identity, `${c.solana.rpc} (Solana)`, {solana: s})
    }
    return composed
  }

  /** The events of the client's parts: rendered by the command; a round's report goes to the server too. */
  private readonly log: Log = (event) => {
    const r = this.reporter.observe(event)
    if (r) this.server?.sendReport(r.step, r.report)
    this.setup.log(event)
  }

  /** Starts the worker, data, P2P node, and the client (joined: the first state is in). */
  async start(): Promise<PsycheClient> {
    const {setup, coordinator} = this
    const seed = seedForRun(setup.runId)
    const track = <B extends CoordinatorBackend>(b: B): B => {
      this.current = b
      b.on('state', () => this.checkWaiting())
      return b
    }
    const backend: BackendConnector =
      'server' in coordinator
        ? {description: coordinator.server.description, connect: async (join) => (this.server = track(await coordinator.server.connect(join)))}
        : {description: coordinator.solana.connector.description, connect: async (join) => track(await coordinator.solana.connector.connect(join))}
    const components = await startComponents({backend, runId: setup.runId, identity: this.identity, plan: setup.plan, seed, log: this.log, p2p: setup.p2p})
    const {plan} = setup
    this.client = await PsycheClient.start(
      {id: this.identity.id, runId: setup.runId, plan, seed, log: this.log, ...setup.client, eval: {every: plan.evalEvery, batches: plan.evalBatches}},
      components,
    )
    this.checkWaiting()
    this.waitTimer = setInterval(() => this.checkWaiting(), 500)
    this.waitTimer.unref()
    return this.client
  }

  /** Runs the client until the run is finished (PsycheClient.run). */
  async run(): Promise<ClientSummary> {
    try {
      return await this.client!.run()
    } finally {
      clearInterval(this.waitTimer)
    }
  }

  /** The coordinator's state as last pushed. */
  state(): CoordinatorState | undefined {
    return this.current?.state
  }

  /** Now on the coordinator's clock, in seconds (the server's, as it tells it; ours on Solana). */
  nowSeconds(): number {
    return coordinatorSeconds(this.server?.serverTime ?? Date.now() / 1000)
  }

  /** Ctrl-C / SIGTERM: withdraw from the run at once (on Solana a transaction: sent within the grace period), and leave. */
  async interrupt(): Promise<void> {
    this.client?.withdrawNow()
    if ('solana' in this.coordinator) await this.current?.close()
    await this.leave()
  }

  /** Leaves for good: on Solana, the client's peer record is closed (its rent comes back). */
  async leave(): Promise<void> {
    if (!('solana' in this.coordinator)) return
    const {address, closePeerRecord} = this.coordinator.solana
    await closePeerRecord().then(
      (closed) => closed && this.log({event: 'peer_record_closed', address}),
      (error: unknown) => this.log({event: 'peer_record_not_closed', message: (error as Error).message}),
    )
  }

  /** From the first state on, not only once the worker is up: a slow worker start must not hide the wait. */
  private checkWaiting(): void {
    this.waiting.check(this.current?.state, this.identity.id, this.nowSeconds())
  }
}
