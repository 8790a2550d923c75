import type {EventLine} from '../../src/core/events.js'
import {join} from 'node:path'
import {CoordinatorConnection, CoordinatorServer, type CoordinatorServerOptions} from '../../src/core/backend/index.js'
import type {BackendConnector} from '../../src/core/backend/types.js'
import {systemClock, type ClientComponents, type ClientP2P} from '../../src/core/client/components.js'
import {PsycheClient, type ClientSummary, type RoundEvent} from '../../src/core/client/runner.js'
import {loadRunConfigFile} from '../../src/core/config/index.js'
import type {RunConfigFile} from '../../src/core/config/types.js'
import {witnessCount} from '../../src/core/coordinator/rules.js'
import {generateIdentity, type Identity} from '../../src/core/protocol/identity.js'
import {LoadTestWorker} from '../../src/core/worker/load-test-worker.js'
import {projectRoot} from '../../src/core/worker/python.js'
import {memoryData, MemoryNetwork} from '../sim/harness.js'

/**
 * Scale runs: many real clients (runner, result intake and validation, witnessing) against the real coordinator
 * server over loopback TCP, each with the load-test compute stand-in (LoadTestWorker) in place of PyTorch. The
 * P2P layer is given: the in-memory one of the simulation (test/scale/scale.test.ts), or real libp2p nodes
 * (bench/scale.bench.ts, several clients per process).
 */

const SCALE_SEQ_LEN = 16

interface ScaleRunConfig {
  clients: number
  /** Rounds to train (total_steps): the run finishes after them. */
  rounds: number
  witnessNodes?: number
  roundWitnessTime?: number
  maxRoundTrainTime?: number
  warmupTime?: number
  /** max_trainers_per_round (G): at most G of the clients train a round (default: all of them). */
  maxTrainers?: number
}

/** The tiny demo's run, resized: one sample per client per round, every client needed to start, `rounds` steps. */
export async function scaleRun(o: ScaleRunConfig): Promise<RunConfigFile> {
  const run = await loadRunConfigFile(join(projectRoot, 'templates', 'tiny-demo', 'state.toml'))
  run.run_id = `scale-${o.clients}`
  run.config = {
    ...run.config!,
    init_min_clients: o.clients,
    min_clients: 1,
    witness_nodes: o.witnessNodes ?? 0,
    global_batch_size_start: o.clients,
    global_batch_size_end: o.clients,
    global_batch_size_warmup_tokens: 0,
    total_steps: o.rounds,
    epoch_time: 3600,
    warmup_time: o.warmupTime ?? 60,
    max_round_train_time: o.maxRoundTrainTime ?? 30,
    round_witness_time: o.roundWitnessTime ?? 3,
    cooldown_time: 1,
    waiting_for_members_extra_time: 0,
    ...(o.maxTrainers ? {max_trainers_per_round: o.maxTrainers} : {}),
  }
  run.model!.LLM.max_seq_len = SCALE_SEQ_LEN
  run.model!.LLM.checkpoint = {Dummy: {repo_id: 'load-test/none'}} as never
  return run
}

/** The server's work counters at one instant, with this process's CPU time (ms) and resident memory (bytes). */
type WorkSnapshot = CoordinatorServer['work'] & {at: number; cpuMs: number; rss: number}

function snapshot(server: CoordinatorServer): WorkSnapshot {
  const cpu = process.cpuUsage()
  return {...server.work, at: performance.now(), cpuMs: (cpu.user + cpu.system) / 1000, rss: process.memoryUsage().rss}
}

/** The server, with its work counters snapshotted at every RoundTrain start (per-round work: consecutive differences). */
export class ScaleServer {
  readonly roundStarts = new Map<number, WorkSnapshot>()
  readonly quorumAt = new Map<number, number>()
  /** Transitions, for failure messages. */
  readonly transitions: string[] = []
  readonly joinedAt: number[] = []
  private constructor(readonly server: CoordinatorServer) {}

  static async start(run: RunConfigFile, options: Partial<CoordinatorServerOptions> = {}): Promise<ScaleServer> {
    let self: ScaleServer | undefined
    const pending: Record<string, unknown>[] = []
    const onLog = (e: Record<string, unknown>) => {
      if (!self) return void pending.push(e)
      self.observe(e)
    }
    const server = await CoordinatorServer.start({run, tickIntervalMs: 20, ...options, log: (e) => onLog(e as Record<string, unknown>)})
    self = new ScaleServer(server)
    for (const e of pending) self.observe(e)
    return self
  }

  get addr(): string {
    return `127.0.0.1:${this.server.port}`
  }

  private observe(e: Record<string, unknown>): void {
    if (e.event === 'joined') this.joinedAt.push(performance.now())
    if (e.event !== 'transition') return
    this.transitions.push(`${e.from}->${e.to}@${e.step}`)
    const step = e.step as number
    // The end of the last round (RoundWitness -> Cooldown) closes its window like a next RoundTrain would.
    if (e.to === 'RoundTrain' || e.to === 'Cooldown') this.roundStarts.set(step, snapshot(this.server))
    if (e.to === 'RoundWitness') this.quorumAt.set(step, performance.now())
  }

  /** The server's work in each round s (RoundTrain(s) start -> RoundTrain(s+1) start). */
  perRound(): {step: number; ms: number; framesOut: number; bytesOut: number; bytesIn: number; commits: number; cpuMs: number; rss: number; quorumMs: number | undefined}[] {
    const out = []
    for (const [step, a] of this.roundStarts) {
      const b = this.roundStarts.get(step + 1)
      if (!b) continue
      const q = this.quorumAt.get(step)
      out.push({
        step,
        ms: b.at - a.at,
        framesOut: b.framesOut - a.framesOut,
        bytesOut: b.bytesOut - a.bytesOut,
        bytesIn: b.bytesIn - a.bytesIn,
        commits: b.commits - a.commits,
        cpuMs: b.cpuMs - a.cpuMs,
        rss: b.rss,
        quorumMs: q === undefined ? undefined : q - a.at,
      })
    }
    return out.sort((x, y) => x.step - y.step)
  }

  /** How many witnesses a round of `clients` trainers has in this run. */
  witnesses(clients: number): number {
    return witnessCount(this.server.state.config, clients)
  }

  stop(): Promise<void> {
    return this.server.stop()
  }
}

export interface ScaleClient {
  identity: Identity
  client: PsycheClient
  worker: LoadTestWorker
  rounds: RoundEvent[]
  events: Record<string, unknown>[]
  done: Promise<ClientSummary | Error>
}

/** Starts one real client of a scale run: TCP link to the server, the given P2P layer, the load-test worker. */
export async function startScaleClient(o: {
  serverAddr: string
  runId: string
  identity: Identity
  p2p: ClientP2P
  resultBytes: number
  computeMs: number
  /** The stand-in's compute per batch of the round, on top of computeMs (default 0). */
  computeMsPerBatch?: number
  /** Keep every event (default: only rounds, problems and speculation). */
  keepEvents?: boolean
  /** ClientOptions.speculate (default true). */
  speculate?: boolean
}): Promise<ScaleClient> {
  const {identity} = o
  const rounds: RoundEvent[] = []
  const events: EventLine[] = []
  const worker = new LoadTestWorker({purpose: 'load-test', resultBytes: o.resultBytes, computeMs: o.computeMs, computeMsPerBatch: o.computeMsPerBatch})
  const backend: BackendConnector = {
    description: `coordinator ${o.serverAddr}`,
    connect: ({p2pAddrs}) => CoordinatorConnection.connect({addr: o.serverAddr, runId: o.runId, identity, p2pAddrs, join: true, connectTimeoutMs: 60_000}),
  }
  const components: ClientComponents = {backend, p2p: o.p2p, worker, data: memoryData(SCALE_SEQ_LEN), clock: systemClock}
  const log = (e: EventLine) => {
    if (e.event === 'round') rounds.push(e)
    else if (o.keepEvents || /fail|reject|error|out_of_sync|no_exchange|dropped|rejoin|speculation/.test(e.event)) events.push(e)
  }
  const client = await PsycheClient.start(
    {
      id: identity.id,
      runId: o.runId,
      plan: {
        model: {kind: 'config', configPath: 'load-test/config.json', config: {load_test: true}},
        seqLen: SCALE_SEQ_LEN,
        microBatch: 1,
        optimizer: {AdamW: {betas: [0.9, 0.95], weight_decay: 0, eps: 1e-8}},
      } as never,
      seed: 7,
      log,
      ...(o.speculate === false ? {speculate: false} : {}),
    },
    components,
  )
  return {identity, client, worker, rounds, events, done: client.run().catch((error: Error) => error)}
}

/** `n` clients in this process on the in-memory P2P layer (the simulation's), started a few at a time. */
export async function startMemoryClients(server: ScaleServer, n: number, o: {resultBytes: number; computeMs: number}): Promise<{net: MemoryNetwork; clients: ScaleClient[]}> {
  const runId = server.server.state.run_id
  const net = new MemoryNetwork(runId)
  const clients: ScaleClient[] = []
  for (let i = 0; i < n; i += 8) {
    const batch = await Promise.all(
      Array.from({length: Math.min(8, n - i)}, () => {
        const identity = generateIdentity()
        return startScaleClient({serverAddr: server.addr, runId, identity, p2p: net.node(identity), ...o})
      }),
    )
    clients.push(...batch)
  }
  return {net, clients}
}
