import {EventEmitter} from 'node:events'
import type {CoordinatorBackend, PeerDirectory} from '../../src/core/backend/types.js'
import type {ClientComponents, ClientWorker} from '../../src/core/client/components.js'
import {ClientContext} from '../../src/core/client/context.js'
import {finalRounds} from '../../src/core/client/decide.js'
import type {ClientOptions} from '../../src/core/client/options.js'
import type {HubRepo} from '../../src/core/config/types.js'
import type {EquivocationProof} from '../../src/core/coordinator/equivocation.js'
import {
  applyEvent,
  assignBatches,
  buildWitnessProof,
  selectWitnesses,
  type AccusationReason,
  type ClientId,
  type CoordinatorState,
  type Round,
} from '../../src/core/coordinator/index.js'
import type {EventLine} from '../../src/core/events.js'
import {resultCommitment} from '../../src/core/primitives/pieces.js'
import {generateIdentity, type Identity} from '../../src/core/protocol/identity.js'
import {ok, toFirstRound} from '../coordinator/helpers.js'
import {DeterministicWorker, ManualClock, MemoryNetwork, memoryData, SIM_SEQ_LEN, type MemoryP2P} from '../sim/harness.js'

/**
 * Fakes for the unit tests of the client's phase modules: a phase runs on a real ClientContext whose coordinator
 * state comes from the pure machine (test/coordinator/helpers.ts, as decide.test.ts builds it), with the simulation's
 * in-memory parts (test/sim/harness.ts: the map-backed P2P layer, the deterministic worker, the manual clock) and a
 * coordinator connection that records what the phase sends.
 */

export {settle} from '../sim/harness.js'

/** A coordinator connection that records every message and accepts it. */
export class RecordingBackend extends EventEmitter implements CoordinatorBackend {
  state: CoordinatorState | undefined
  peers: PeerDirectory = {}
  readonly sent: {kind: string; args: unknown[]}[] = []
  /** What agreedScores() returns (the run's moving averages of verifiers' reports). */
  readonly agreed = new Map<ClientId, {average: number; count: number; last_step: number}>()

  private record(kind: string, ...args: unknown[]): boolean {
    this.sent.push({kind, args})
    return true
  }

  /** The arguments of each message of `kind`, in order. */
  of(kind: string): unknown[][] {
    return this.sent.filter((m) => m.kind === kind).map((m) => m.args)
  }

  sendWitness(step: number, proof: unknown): boolean {
    return this.record('witness', step, proof)
  }
  sendWarmupReady(): boolean {
    return this.record('warmup_ready')
  }
  sendCooldownWitness(step: number, paramHash: string): boolean {
    return this.record('cooldown_witness', step, paramHash)
  }
  sendHealthCheck(step: number, accused: ClientId[]): boolean {
    return this.record('health_check', step, accused)
  }
  sendAccusation(step: number, accused: ClientId, reason: AccusationReason): boolean {
    return this.record('accuse', step, accused, reason)
  }
  sendScores(step: number, scores: {client_id: ClientId; score: number}[]): boolean {
    return this.record('scores', step, scores)
  }
  agreedScores(): ReadonlyMap<ClientId, {average: number; count: number; last_step: number}> {
    return this.agreed
  }
  sendEquivocation(proof: EquivocationProof): boolean {
    return this.record('equivocation', proof)
  }
  sendWithdraw(): boolean {
    return this.record('withdraw')
  }
  sendCheckpoint(repo: HubRepo, paramHash?: string): boolean {
    return this.record('checkpoint', repo, paramHash)
  }
  async close(): Promise<void> {}
}

/** A run of `n` clients (identities: their ids are the run's client ids) at its first RoundTrain; every client witnesses. */
export function firstRound(n = 3, config: Record<string, unknown> = {}): {identities: Identity[]; ids: ClientId[]; state: CoordinatorState; now: number} {
  const identities = Array.from({length: n}, () => generateIdentity())
  const ids = identities.map((i) => i.id)
  const {state, now} = toFirstRound(ids, {witness_nodes: n, ...config})
  return {identities, ids, state, now}
}

/** A trainer's batch range in the current round (or `round`). */
export function rangeOf(state: CoordinatorState, id: ClientId, round = state.epoch.round!): {start: number; end: number} {
  return assignBatches(state, round).get(id)!
}

/**
 * Every witness of the current round attests the results in `commitments` (producer → sha256 hex); then the machine
 * ticks, a second at a time, until the next round trains (the witnessed round is final then: `previous`).
 */
export function witnessAndAdvance(state: CoordinatorState, now: number, commitments: Map<ClientId, string>): {state: CoordinatorState; now: number; previous: Round} {
  const round = state.epoch.round!
  const seen = [...assignBatches(state, round)]
    .filter(([id, r]) => r.end > r.start && commitments.has(id))
    .map(([id, range]) => ({id, range, commitment: Buffer.from(commitments.get(id)!, 'hex')}))
  for (const w of selectWitnesses(state, round)) state = ok(state, {type: 'witness', from: w, step: round.step, proof: buildWitnessProof(state.config, round, seen)}, now)
  for (let i = 0; i < 100 && !(state.run_state === 'RoundTrain' && state.epoch.round!.step > round.step); i++) state = applyEvent(state, {type: 'tick'}, (now += 1000)).state
  const previous = finalRounds(state).find((r) => r.step === round.step)
  if (!previous) throw new Error(`round ${round.step} did not become final (run state ${state.run_state})`)
  return {state, now, previous}
}

/** Commitments (resultCommitment) of results by producer. */
export function commitmentsOf(results: Map<ClientId, Uint8Array>): Map<ClientId, string> {
  return new Map([...results].map(([id, bytes]) => [id, resultCommitment(bytes)]))
}

/** One phase's world: its context, what it logged and sent, and the fakes behind it. */
export interface PhaseWorld<W extends ClientWorker = DeterministicWorker> {
  ctx: ClientContext
  events: EventLine[]
  conn: RecordingBackend
  worker: W
  net: MemoryNetwork
  p2p: MemoryP2P
  clock: ManualClock
  /** How often the phase asked for the coordinator messages due to be sent, and woke the work loop. */
  calls: {flush: number; poke: number}
  /** The events of one kind, in order. */
  logged(kind: string): EventLine[]
  /** A P2P node of another client on the same network, connected to ours. */
  peer(identity: Identity): Promise<MemoryP2P>
}

/**
 * A ClientContext for `identity` following `state` (as pushed by the coordinator), with our model at `modelStep`,
 * on in-memory parts. `worker` defaults to the simulation's deterministic worker.
 */
export function phaseWorld<W extends ClientWorker = DeterministicWorker>(o: {
  identity: Identity
  state: CoordinatorState
  modelStep?: number | null
  worker?: W
  opts?: Partial<ClientOptions>
  components?: Partial<ClientComponents>
}): PhaseWorld<W> {
  const events: EventLine[] = []
  const calls = {flush: 0, poke: 0}
  const clock = new ManualClock()
  const net = new MemoryNetwork(o.state.run_id)
  const p2p = net.node(o.identity)
  const worker = (o.worker ?? new DeterministicWorker()) as W
  const conn = new RecordingBackend()
  const opts: ClientOptions = {
    id: o.identity.id,
    runId: o.state.run_id,
    plan: {model: {kind: 'config', configPath: 'test/config.json', config: {test: true}}, seqLen: SIM_SEQ_LEN, microBatch: 1, optimizer: 'adamw'} as never,
    seed: 7,
    log: (e) => events.push(e),
    ...o.opts,
  }
  const components: ClientComponents = {
    backend: {description: 'test coordinator', connect: async () => conn},
    p2p,
    worker,
    data: memoryData(SIM_SEQ_LEN),
    clock,
    ...o.components,
  }
  const ctx = new ClientContext(
    opts,
    components,
    () => calls.flush++,
    () => calls.poke++,
  )
  ctx.conn = conn
  conn.state = o.state
  ctx.state = o.state
  ctx.modelStep = o.modelStep === undefined ? 0 : o.modelStep
  return {
    ctx,
    events,
    conn,
    worker,
    net,
    p2p,
    clock,
    calls,
    logged: (kind) => events.filter((e) => e.event === kind),
    peer: async (identity) => {
      const node = net.node(identity)
      await node.connect(p2p.addresses())
      return node
    },
  }
}
