import {
  clockEntropy,
  applyEvent,
  assignBatches,
  globalBatchSize,
  buildWitnessProof,
  createCoordinator,
  selectVerifiers,
  selectWitnesses,
  type CoordinatorEvent,
  type CoordinatorState,
  type RejectionCode,
} from '../../src/core/coordinator/index.js'
import type {CoordinatorConfig, LLMConfig} from '../../src/core/config/index.js'
import {createHash} from 'node:crypto'
import {clientIdOf} from '../../src/core/backend/solana/layout.js'
import {signAnnouncement} from '../../src/core/primitives/announcement.js'
import {identityFromSeed} from '../../src/core/protocol/identity.js'
import type {EquivocationProof} from '../../src/core/coordinator/equivocation.js'
import {keypair} from './harness.js'
import {MAX_CLIENTS} from '../../src/core/layout/layout-table.js'
import {participantKey, witnessBloomParams} from '../../src/core/coordinator/rules.js'
import {BloomFilter} from '../../src/core/primitives/bloom.js'
import {HEALTH_CHECK_BATCH} from '../../src/core/backend/solana/instructions.js'

/**
 * Shared test vectors: event sequences run through the TypeScript reference (src/core/coordinator),
 * with the state after every event (or the rejection code). test/solana/vectors.test.ts replays them
 * against the on-chain program and requires identical states; `npm run vectors:solana` writes them
 * to a file for other implementations.
 */

interface VectorStep {
  /** The cluster clock when the event runs: unix seconds, and the slot (the program mixes both into a round's seed). */
  now: number
  slot: number
  event: CoordinatorEvent
  /** The rejection code, when the reference refuses the event. */
  error?: RejectionCode
  /** The reference's state after the event. */
  state: CoordinatorState
}

export interface Scenario {
  name: string
  run_id: string
  /** Unix seconds of init_coordinator. */
  created_at: number
  /** Client labels: keypair(label) signs for the client whose id is its public key in hex (clientIdOf its address). */
  clients: Record<string, string>
  config: CoordinatorConfig
  model: {LLM: LLMConfig}
  steps: VectorStep[]
}

export interface VectorFile {
  about: string
  scenarios: Scenario[]
}

const baseConfig: CoordinatorConfig = {
  warmup_time: 10,
  cooldown_time: 5,
  epoch_time: 100,
  max_round_train_time: 10,
  round_witness_time: 2,
  min_clients: 2,
  init_min_clients: 3,
  witness_nodes: 2,
  verification_percent: 0,
  global_batch_size_start: 8,
  global_batch_size_end: 8,
  global_batch_size_warmup_tokens: 0,
  total_steps: 1000,
  waiting_for_members_extra_time: 3,
}

const baseLLM: LLMConfig = {
  architecture: 'HfLlama',
  data_type: 'Pretraining',
  max_seq_len: 16,
  cold_start_warmup_steps: 0,
  checkpoint: {Hub: {repo_id: 'org/model'}},
  data_location: {Server: '127.0.0.1:20001'},
  lr_schedule: {Constant: {base_lr: 1e-3, warmup_steps: 0, warmup_init_lr: 0}},
  optimizer: {AdamW: {betas: [0.9, 0.95], weight_decay: 0, eps: 1e-8}},
}

/** The parameter hash the honest witnesses attest in Cooldown (and a hostile checkpointer's other one). */
const PARAMS = 'a1'.repeat(32)
const OTHER_PARAMS = 'e0'.repeat(32)

/** Records a scenario by driving the reference; every step's outcome is whatever the reference says. */
class Recorder {
  state: CoordinatorState
  now: number
  readonly steps: VectorStep[] = []

  constructor(
    readonly scenario: Omit<Scenario, 'steps'>,
    readonly ids: Record<string, string>,
  ) {
    this.now = scenario.created_at
    this.state = createCoordinator({run_id: scenario.run_id, run_state: 'Uninitialized', config: scenario.config, model: scenario.model}, {now: this.now * 1000})
  }

  apply(event: CoordinatorEvent, expect?: RejectionCode | 'ok'): CoordinatorState {
    // `now` is the chain's clock (unix seconds); the reference's clock is in milliseconds. Every event runs in a slot
    // of its own; the events that may start a round carry the clock's entropy, as the program reads it.
    const slot = 1000 + 3 * this.steps.length
    if (event.type === 'tick' || event.type === 'witness') event = {...event, entropy: clockEntropy(slot, this.now)}
    const r = applyEvent(this.state, event, this.now * 1000)
    if (expect === 'ok' && r.error) throw new Error(`${this.scenario.name}: ${event.type} at ${this.now} rejected: ${r.error.code}: ${r.error.message}`)
    if (expect && expect !== 'ok' && r.error?.code !== expect)
      throw new Error(`${this.scenario.name}: ${event.type} at ${this.now}: expected ${expect}, got ${r.error?.code ?? 'accepted'}`)
    this.state = r.state
    this.steps.push({now: this.now, slot, event, ...(r.error ? {error: r.error.code} : {}), state: r.state})
    return r.state
  }

  at(now: number): this {
    this.now = now
    return this
  }

  tick(seconds = 1): CoordinatorState {
    this.now += seconds
    return this.apply({type: 'tick'})
  }

  /** Ticks once a second until the run leaves `phase`. */
  tickOut(limit = 200): CoordinatorState {
    const phase = this.state.run_state
    for (let i = 0; i < limit; i++) if (this.tick().run_state !== phase) return this.state
    throw new Error(`${this.scenario.name}: stuck in ${phase}`)
  }

  id(label: string): string {
    const id = this.ids[label]
    if (!id) throw new Error(`unknown client ${label}`)
    return id
  }

  proof(saw?: string[]): {participant_bloom: string; broadcast_bloom: string} {
    const seen = [...assignBatches(this.state)]
      .filter(([id, r]) => r.end > r.start && (!saw || saw.includes(id)))
      .map(([id, range]) => ({id, range, commitment: Buffer.alloc(32, 7)}))
    return buildWitnessProof(this.state.config, this.state.epoch.round!, seen)
  }

  witnessAll(saw?: string[]): void {
    const step = this.state.epoch.round!.step
    for (const w of selectWitnesses(this.state)) {
      if (this.state.run_state !== 'RoundTrain' && this.state.run_state !== 'RoundWitness') break
      this.apply({type: 'witness', from: w, step, proof: this.proof(saw)}, 'ok')
    }
  }

  /**
   * Cooldown: each witness of the epoch's last round attests `hash` (those no longer in the epoch are refused); `only`:
   * just these witnesses. Returns the hash.
   */
  attest(hash: string = PARAMS, only?: string[]): string {
    const round = this.state.epoch.round!
    for (const w of selectWitnesses(this.state, round)) {
      if (only && !only.includes(w)) continue
      const member = this.state.epoch.clients.some((c) => c.id === w && c.state === 'Healthy')
      this.apply({type: 'witness', from: w, step: round.step, proof: {participant_bloom: '', broadcast_bloom: ''}, param_hash: hash}, member ? 'ok' : 'InvalidWitness')
    }
    return hash
  }

  /** In Warmup, one client reports its model loaded: the round starts when warmup_time is up (with no report, none does). */
  warmupOne(): void {
    const c = this.state.epoch.clients.find((x) => x.state === 'Healthy')
    if (this.state.run_state === 'Warmup' && c) this.apply({type: 'witness', from: c.id, step: 0, proof: {participant_bloom: '', broadcast_bloom: ''}}, 'ok')
  }

  warmupAll(): void {
    for (const c of this.state.epoch.clients)
      if (this.state.run_state === 'Warmup') this.apply({type: 'witness', from: c.id, step: 0, proof: {participant_bloom: '', broadcast_bloom: ''}}, 'ok')
  }

  /** The run resumed, these clients joined, Warmup reached and every warmup report in: the first round begins. */
  startEpoch(ids: string[]): void {
    this.apply({type: 'resume'}, 'ok')
    for (const id of ids) this.apply({type: 'join', id}, 'ok')
    this.tickOut() // → Warmup
    this.warmupAll()
  }
}

async function recorder(name: string, labels: string[], config: Partial<CoordinatorConfig> = {}, llm: Partial<LLMConfig> = {}): Promise<Recorder> {
  const clients: Record<string, string> = {}
  for (const l of labels) clients[l] = clientIdOf((await keypair(l)).address)
  return new Recorder(
    {name, run_id: `vec-${name}`.slice(0, 32), created_at: 1_700_000_000, clients, config: {...baseConfig, ...config}, model: {LLM: {...baseLLM, ...llm}}},
    clients,
  )
}

function finish(r: Recorder): Scenario {
  return {...r.scenario, steps: r.steps}
}

/** Epochs of honest rounds, a health check, a withdrawal, checkpoints, pause and resume, to Finished. */
async function fullRun(): Promise<Scenario> {
  const r = await recorder('full-run', ['a', 'b', 'c', 'd'], {rounds_per_epoch: 3, total_steps: 7})
  r.apply({type: 'config_update', config: r.scenario.config, model: r.scenario.model}, 'ok')
  r.startEpoch(['a', 'b', 'c', 'd'].map((l) => r.id(l))) // enough warmup reports start the first round
  // round 1: every witness saw everyone
  r.witnessAll()
  r.tickOut() // RoundWitness → RoundTrain (round 2)
  // round 2: witnesses did not see d; d is accused in round 3
  r.witnessAll([r.id('a'), r.id('b'), r.id('c')])
  r.tickOut()
  r.apply({type: 'health_check', from: r.id('a'), accused: [r.id('b')]}) // b was seen: rejected
  r.apply({type: 'health_check', from: r.id('a'), accused: [r.id('d')]}) // d was not (if it had batches)
  // one who is not a witness of this (the epoch's last) round leaves: its witnesses attest the parameters in Cooldown
  const leaver = ['c', 'b', 'a'].find((l) => !selectWitnesses(r.state).includes(r.id(l)))!
  r.apply({type: 'withdraw', id: r.id(leaver)}, 'ok')
  r.witnessAll()
  r.tickOut() // → Cooldown (rounds_per_epoch)
  r.attest()
  const [first, second] = r.state.epoch.clients.map((c) => c.id)
  r.apply({type: 'checkpoint', from: first, repo: {repo_id: 'org/model-step3', revision: 'main'}, param_hash: PARAMS}, 'ok')
  r.apply({type: 'checkpoint', from: second, repo: {repo_id: 'org/other'}, param_hash: PARAMS}, 'AlreadyCheckpointed')
  r.tickOut() // → WaitingForMembers, epoch 1
  r.apply({type: 'join', id: r.id(leaver)}, 'ok')
  r.apply({type: 'pause'}, 'ok')
  r.apply({type: 'tick'}, 'Halted')
  r.apply({type: 'config_update', config: {...r.state.config, cooldown_time: 4}}, 'ok')
  r.tick()
  r.apply({type: 'resume'}, 'ok')
  r.tickOut() // → Warmup
  r.warmupOne()
  r.tickOut() // warmup_time → RoundTrain
  for (let i = 0; i < 12 && !['WaitingForMembers', 'Finished', 'Paused'].includes(r.state.run_state); i++) {
    if (r.state.run_state === 'RoundTrain') r.witnessAll()
    if (r.state.run_state === 'Cooldown') r.apply({type: 'pause'}, 'ok') // pending pause: Paused after Cooldown
    r.tickOut()
  }
  if ((r.state.run_state as string) === 'Paused') {
    r.apply({type: 'resume'}, 'ok')
    r.tickOut()
    r.warmupOne()
    r.tickOut()
    for (let i = 0; i < 12 && (r.state.run_state as string) !== 'Finished'; i++) {
      if ((r.state.run_state as string) === 'RoundTrain') r.witnessAll()
      r.tickOut()
    }
  }
  r.apply({type: 'join', id: r.id('a')})
  return finish(r)
}

/** Every rejection the reference has, each against the program's state at that moment. */
async function rejections(): Promise<Scenario> {
  const r = await recorder('rejections', ['a', 'b', 'c', 'e'])
  r.apply({type: 'tick'}, 'Halted')
  r.apply({type: 'pause'}, 'Halted')
  r.apply({type: 'config_update', config: {...r.scenario.config, init_min_clients: 1}}, 'InvalidConfig')
  r.apply({type: 'resume'}, 'ok')
  r.apply({type: 'resume'}, 'CannotResume')
  r.apply({type: 'config_update', config: r.scenario.config}, 'InvalidRunState')
  r.apply({type: 'join', id: r.id('a')}, 'ok')
  r.apply({type: 'join', id: r.id('a')}, 'AlreadyJoined')
  r.apply({type: 'withdraw', id: r.id('e')}, 'InvalidWithdraw')
  r.apply({type: 'eject', id: r.id('e')}, 'UnknownClient')
  r.apply({type: 'witness', from: r.id('a'), step: 1, proof: {participant_bloom: '', broadcast_bloom: ''}}, 'InvalidRunState')
  r.apply({type: 'health_check', from: r.id('a'), accused: [r.id('b')]}, 'InvalidRunState')
  r.apply({type: 'checkpoint', from: r.id('a'), repo: {repo_id: 'x/y'}}, 'InvalidRunState')
  r.apply({type: 'join', id: r.id('b')}, 'ok')
  r.apply({type: 'join', id: r.id('c')}, 'ok')
  r.apply({type: 'join', id: r.id('e')}, 'ok')
  r.apply({type: 'withdraw', id: r.id('e')}, 'ok')
  r.tickOut() // → Warmup
  r.apply({type: 'join', id: r.id('a')}, 'AlreadyJoined')
  r.apply({type: 'witness', from: r.id('e'), step: 0, proof: {participant_bloom: '', broadcast_bloom: ''}}, 'InvalidWitness')
  r.apply({type: 'witness', from: r.id('a'), step: 0, proof: {participant_bloom: '', broadcast_bloom: ''}}, 'ok')
  r.apply({type: 'witness', from: r.id('a'), step: 0, proof: {participant_bloom: '', broadcast_bloom: ''}}, 'DuplicateWitness')
  r.tickOut() // warmup_time → RoundTrain
  const step = r.state.epoch.round!.step
  const witnesses = selectWitnesses(r.state)
  const other = Object.values(r.ids).find((id) => r.state.epoch.round!.roster.includes(id) && !witnesses.includes(id))!
  r.apply({type: 'witness', from: witnesses[0], step: step + 1, proof: r.proof()}, 'WrongStep')
  r.apply({type: 'witness', from: other, step, proof: r.proof()}, 'InvalidWitness')
  r.apply({type: 'witness', from: witnesses[0], step, proof: {participant_bloom: 'AAAA', broadcast_bloom: 'AAAA'}}, 'InvalidWitness')
  r.apply({type: 'witness', from: witnesses[0], step, proof: r.proof()}, 'ok')
  r.apply({type: 'witness', from: witnesses[0], step, proof: r.proof()}, 'DuplicateWitness')
  r.apply({type: 'health_check', from: r.id('a'), accused: [r.id('b')]}, 'NoActiveRound')
  r.apply({type: 'eject', id: r.id('b')}, 'ok')
  r.apply({type: 'pause'}, 'ok') // pending: the epoch ends first
  r.apply({type: 'resume'}, 'CannotResume')
  r.tickOut() // RoundTrain → RoundWitness (timeout)
  r.tickOut() // → Cooldown (pending pause)
  r.apply({type: 'checkpoint', from: r.id('e'), repo: {repo_id: 'x/y'}}, 'UnknownClient')
  r.apply({type: 'checkpoint', from: r.id('a'), repo: {repo_id: ''}}, 'InvalidEvent')
  r.tickOut() // → Paused
  r.apply({type: 'witness', from: r.id('a'), step, proof: r.proof()}, 'Halted')
  r.apply({type: 'health_check', from: r.id('a'), accused: [r.id('b')]}, 'Halted')
  r.apply({type: 'config_update', config: {...r.scenario.config, total_steps: 1}}, 'ok')
  r.apply({type: 'resume'}, 'ok') // step 2 > total_steps 1: Finished
  r.apply({type: 'join', id: r.id('a')}, 'Halted')
  return finish(r)
}

/** A ramped batch size, automatic witnesses, a round nobody witnessed, and a too-small Warmup. */
async function rampAndLosses(): Promise<Scenario> {
  const r = await recorder(
    'ramp-and-losses',
    ['a', 'b', 'c', 'd', 'e'],
    {
      witness_nodes: 0,
      min_clients: 3,
      init_min_clients: 3,
      global_batch_size_start: 3,
      global_batch_size_end: 11,
      global_batch_size_warmup_tokens: 16 * 40,
      waiting_for_members_extra_time: 0,
    },
    {checkpoint: {P2P: {repo_id: 'org/p2p'}}},
  )
  r.apply({type: 'resume'}, 'ok')
  for (const l of ['a', 'b', 'c']) r.apply({type: 'join', id: r.id(l)}, 'ok')
  r.tickOut() // → Warmup
  r.apply({type: 'withdraw', id: r.id('c')}, 'ok')
  r.tickOut() // too few: back to WaitingForMembers
  r.apply({type: 'join', id: r.id('c')}, 'ok')
  r.apply({type: 'join', id: r.id('d')}, 'ok')
  r.apply({type: 'join', id: r.id('e')}, 'ok')
  r.tickOut() // → Warmup
  r.warmupOne()
  r.tickOut() // → RoundTrain
  for (let round = 0; round < 6 && r.state.run_state !== 'Cooldown'; round++) {
    if (round === 3) {
      r.tickOut() // nobody witnesses: RoundWitness, then Cooldown with everyone withdrawn
      r.tickOut()
      continue
    }
    r.witnessAll()
    r.tickOut()
  }
  r.tickOut() // Cooldown → WaitingForMembers (fallback checkpoint when nobody is back)
  for (const l of ['a', 'b', 'c']) r.apply({type: 'join', id: r.id(l)}, 'ok')
  r.tickOut()
  return finish(r)
}

/** A run started from a Dummy checkpoint: the Hub checkpoint reported in Cooldown is what a run nobody returns to loads. */
async function dummyThenHub(): Promise<Scenario> {
  const r = await recorder(
    'dummy-then-hub',
    ['a', 'b', 'c'],
    {rounds_per_epoch: 2, min_clients: 2, init_min_clients: 2, cooldown_time: 50},
    {checkpoint: {Dummy: {repo_id: 'org/dummy'}}},
  )
  r.startEpoch(['a', 'b'].map((l) => r.id(l)))
  r.witnessAll()
  r.tickOut() // → round 2
  r.witnessAll()
  r.tickOut() // → Cooldown (rounds_per_epoch)
  r.attest()
  r.apply({type: 'checkpoint', from: r.id('a'), repo: {repo_id: 'org/ckpt', revision: 'abc'}, param_hash: PARAMS}, 'ok')
  r.tickOut() // Cooldown ends on the checkpoint → WaitingForMembers, P2P
  for (const l of ['a', 'b']) r.apply({type: 'withdraw', id: r.id(l)}, 'ok')
  r.apply({type: 'join', id: r.id('c')}, 'ok')
  r.apply({type: 'join', id: r.id('b')}, 'ok')
  r.tickOut() // → Warmup from the Hub checkpoint
  return finish(r)
}

/** Accusations of invalid results: rejections, then a witness quorum ejects a trainer and excludes its result. */
async function accusations(): Promise<Scenario> {
  const r = await recorder('accusations', ['a', 'b', 'c', 'd', 'e'], {verification_percent: 40})
  r.apply({type: 'resume'}, 'ok')
  for (const l of ['a', 'b', 'c', 'd', 'e']) r.apply({type: 'join', id: r.id(l)}, 'ok')
  r.apply({type: 'accuse', from: r.id('a'), step: 1, accused: r.id('b'), reason: 'invalid_result'}, 'InvalidRunState')
  r.tickOut() // → Warmup
  r.warmupOne()
  r.tickOut() // → RoundTrain
  const round = r.state.epoch.round!
  const [w0, w1] = selectWitnesses(r.state)
  const others = round.roster.filter((id) => id !== w0 && id !== w1)
  const [accused, bystander] = others
  r.apply({type: 'accuse', from: bystander, step: round.step, accused, reason: 'invalid_result'}, 'InvalidAccusation') // not a witness
  r.apply({type: 'accuse', from: w0, step: round.step, accused: w0, reason: 'invalid_result'}, 'InvalidAccusation') // itself
  r.apply({type: 'accuse', from: w0, step: round.step + 1, accused, reason: 'invalid_result'}, 'WrongStep')
  r.apply({type: 'accuse', from: w0, step: round.step, accused, reason: 'invalid_result'}, 'ok')
  r.apply({type: 'accuse', from: w0, step: round.step, accused, reason: 'invalid_result'}, 'DuplicateAccusation')
  r.apply({type: 'accuse', from: w1, step: round.step, accused, reason: 'invalid_result'}, 'ok') // quorum: ejected, excluded
  r.apply({type: 'accuse', from: w1, step: round.step, accused: bystander, reason: 'invalid_result'}, 'ok')
  // Verifiers (verification_percent: 40) accuse by low scores, of the previous round's results: none in an epoch's first round.
  const [v0] = selectVerifiers(r.state)
  r.apply({type: 'accuse', from: v0, step: round.step, accused: round.roster.find((id) => id !== v0)!, reason: 'low_score'}, 'InvalidAccusation')
  r.apply({type: 'join', id: accused}, 'Banned') // an ejected client sits out this epoch and the next
  r.witnessAll()
  r.tickOut() // next round: the ejected trainer has left
  // The verifiers assigned to score a trainer (4 clients, K = 3: both verifiers) judge it; witnesses cannot, and the reasons count apart.
  const second = r.state.epoch.round!
  const [u0, u1] = selectVerifiers(r.state)
  const target = second.roster.find((id) => id !== u0 && id !== u1)!
  const nonVerifier = second.roster.find((id) => id !== u0 && id !== u1 && id !== target)!
  r.apply({type: 'accuse', from: nonVerifier, step: second.step, accused: target, reason: 'low_score'}, 'InvalidAccusation')
  r.apply({type: 'accuse', from: u0, step: second.step, accused: target, reason: 'low_score'}, 'ok')
  r.apply({type: 'accuse', from: u0, step: second.step, accused: target, reason: 'low_score'}, 'DuplicateAccusation')
  r.apply({type: 'accuse', from: u1, step: second.step, accused: target, reason: 'low_score'}, 'ok') // assigned quorum: ejected
  r.witnessAll()
  r.tickOut()
  return finish(r)
}

/**
 * A trainer cut off from its peers (3 clients, all witnesses, quorum 2): the two others saw each other, its own proof
 * names only itself. It is not healthy, so the round's close drops it (and a health check naming it is still taken). The labels cut-6 and cut-18 are a pair whose
 * participant keys plain double hashing mapped to the same bits of the round's 64-bit bloom (found by search): under
 * that hashing the others' proofs named the cut-off trainer too, the health check was refused, and every replica
 * waited for a result nobody had (bloom.ts positionsOf).
 */
async function cutOff(): Promise<Scenario> {
  const r = await recorder('cut-off', ['cut-6', 'other', 'cut-18'], {witness_nodes: 0}) // every client witnesses
  const [a, b, c] = [r.id('cut-6'), r.id('other'), r.id('cut-18')]
  r.startEpoch([a, b, c]) // → RoundTrain
  r.witnessAll()
  r.tickOut() // round 2: c is cut off from a and b
  const step = r.state.epoch.round!.step
  for (const from of [a, b]) r.apply({type: 'witness', from, step, proof: r.proof([a, b])}, 'ok')
  r.apply({type: 'witness', from: c, step, proof: r.proof([c])}, 'ok')
  r.tickOut() // round 2 closes: c, unseen, is dropped
  if (!r.state.epoch.exited.some((x) => x.id === c && x.state === 'Dropped')) throw new Error('cut-off: the closing round did not drop c')
  r.apply({type: 'health_check', from: b, accused: [a]}, 'InvalidHealthCheck') // a was seen by b
  r.apply({type: 'health_check', from: a, accused: [c]}, 'ok')
  r.witnessAll([a, b])
  r.tickOut()
  return finish(r)
}

/**
 * At capacity: MAX_CLIENTS clients join (one more is refused), 32 automatic witnesses prove every round, a health
 * check accuses HEALTH_CHECK_BATCH trainers at once, a witness quorum ejects one, and pausing in Cooldown and again in
 * WaitingForMembers carries every healthy client into the pending list. Every one of its transactions fits a cluster's
 * limits (test/solana/capacity.test.ts).
 */
export async function capacity(): Promise<Scenario> {
  const labels = Array.from({length: MAX_CLIENTS + 1}, (_, i) => `cap-${i}`)
  const r = await recorder('capacity', labels, {
    init_min_clients: MAX_CLIENTS / 2, // every client joins before the first tick
    min_clients: MAX_CLIENTS / 2,
    witness_nodes: 0,
    verification_percent: 25, // 64 verifiers, each assigned 4 trainers: every trainer is scored each round (capacity.test.ts)
    // 2.5 batches per trainer: half the roster has one more (the most a round's close shuffles to credit them)
    global_batch_size_start: (5 * MAX_CLIENTS) / 2,
    global_batch_size_end: (5 * MAX_CLIENTS) / 2,
    rounds_per_epoch: 4,
    epoch_time: 1000,
  })
  r.apply({type: 'resume'}, 'ok')
  for (const l of labels.slice(0, MAX_CLIENTS)) r.apply({type: 'join', id: r.id(l)}, 'ok')
  const extra = r.id(labels[MAX_CLIENTS])
  r.apply({type: 'join', id: extra}, 'CapacityExceeded')
  r.tickOut() // → Warmup
  r.warmupAll() // 32 reports start the first round
  r.witnessAll()
  r.tickOut() // round 2
  // round 2: nobody saw HEALTH_CHECK_BATCH trainers (non-witnesses that the proof's bloom does not name by chance)
  const round = r.state.epoch.round!
  const witnesses = selectWitnesses(r.state)
  const absent: string[] = []
  for (const id of round.roster) {
    if (absent.length === HEALTH_CHECK_BATCH) break
    if (witnesses.includes(id)) continue
    const saw = round.roster.filter((x) => x !== id && !absent.includes(x))
    const bloom = BloomFilter.fromBase64(witnessBloomParams(r.state.config, round), r.proof(saw).participant_bloom)
    if ([...absent, id].every((x) => !bloom.contains(participantKey(x)))) absent.push(id)
  }
  r.witnessAll(round.roster.filter((x) => !absent.includes(x)))
  r.tickOut() // round 3: judge round 2
  const judge = selectWitnesses(r.state)
  r.apply({type: 'health_check', from: judge[0], accused: absent}, 'ok')
  // a quorum of witnesses accuses one trainer: ejected and excluded
  const step = r.state.epoch.round!.step
  const victim = r.state.epoch.round!.roster.find((id) => !judge.includes(id) && !absent.includes(id))!
  for (const w of judge.slice(0, 21)) r.apply({type: 'accuse', from: w, step, accused: victim, reason: 'invalid_result'}, 'ok')
  const leaver = r.state.epoch.round!.roster.find((id) => !judge.includes(id) && !absent.includes(id) && id !== victim)!
  r.apply({type: 'withdraw', id: leaver}, 'ok')
  r.apply({type: 'join', id: extra}, 'ok') // places freed: the next epoch has room
  r.apply({type: 'pause'}, 'ok') // pending: the epoch ends first
  r.witnessAll()
  r.tickOut() // → Cooldown
  r.attest()
  r.apply({type: 'checkpoint', from: judge[0], repo: {repo_id: 'org/model-at-capacity'}, param_hash: PARAMS}, 'ok')
  r.tickOut() // → Paused: the healthy clients, then the other joiners, are pending
  r.apply({type: 'resume'}, 'ok')
  r.apply({type: 'withdraw', id: judge[1]}, 'ok') // leaves the pending list, stays a healthy client of the last epoch
  r.apply({type: 'join', id: victim}, 'Banned')
  r.apply({type: 'pause'}, 'ok') // in WaitingForMembers: judge[1] is carried again, nobody twice
  r.apply({type: 'resume'}, 'ok')
  r.tickOut() // → Warmup: the next epoch
  r.warmupAll()
  r.witnessAll()
  r.tickOut()
  return finish(r)
}

/**
 * The rewards ledger's costliest round closes: MAX_CLIENTS trainers with 2.5 batches each (half the roster has one more,
 * found by the program's sliced inverse shuffle) and `witnessNodes` witnesses (1: the round's close runs most of the
 * shuffle; 2: each proof runs its capped slice), two epochs of rounds, so the first settles (test/solana/rewards-program).
 * `maxTrainers`: max_trainers_per_round, whose chosen trainers the same shuffle finds.
 */
export async function rewardsAtScale(witnessNodes: number, clients = MAX_CLIENTS, verificationPercent = 0, maxTrainers?: number): Promise<Scenario> {
  const labels = Array.from({length: clients}, (_, i) => `cap-${i}`)
  const name = `rewards-w${witnessNodes}-${clients}${verificationPercent ? `-v${verificationPercent}` : ''}${maxTrainers ? `-g${maxTrainers}` : ''}`
  const r = await recorder(name, labels, {
    ...(maxTrainers ? {max_trainers_per_round: maxTrainers} : {}),
    verification_percent: verificationPercent,
    init_min_clients: Math.ceil(clients / 2),
    min_clients: Math.max(1, witnessNodes),
    witness_nodes: witnessNodes,
    global_batch_size_start: Math.floor((5 * clients) / 2),
    global_batch_size_end: Math.floor((5 * clients) / 2),
    rounds_per_epoch: 2,
    epoch_time: 1000,
  })
  r.apply({type: 'resume'}, 'ok')
  for (const l of labels) r.apply({type: 'join', id: r.id(l)}, 'ok')
  for (let epoch = 0; epoch < 2; epoch++) {
    r.tickOut() // → Warmup
    r.warmupAll()
    r.witnessAll()
    r.tickOut() // round 2
    r.witnessAll()
    r.tickOut() // → Cooldown
    r.attest()
    r.apply({type: 'checkpoint', from: selectWitnesses(r.state, r.state.epoch.round!)[0], repo: {repo_id: `org/rewards-${epoch}`}, param_hash: PARAMS}, 'ok')
    r.tickOut() // → WaitingForMembers: the epoch settles
  }
  return finish(r)
}

/** A result announcement signed by keypair(label)'s key (the same seed: test/solana/harness.ts). */
export function announce(runId: string, label: string, step: number, batch: [number, number], commitmentByte: number, size = 1000) {
  const identity = identityFromSeed(createHash('sha256').update(`psyche-test-key/${label}`).digest())
  return signAnnouncement(identity, {
    run_id: runId,
    step,
    client_id: identity.id,
    batch_start: batch[0],
    batch_end: batch[1],
    commitment: Buffer.alloc(32, commitmentByte).toString('hex'),
    size,
  })
}

/** Equivocation proofs: two signed announcements of one producer for one step eject it (and exclude it from the round). */
async function equivocation(): Promise<Scenario> {
  const r = await recorder('equivocation', ['a', 'b', 'c', 'd', 'x'])
  const run = r.scenario.run_id
  const proof = (label: string, step: number, same = false, runId = run): EquivocationProof => ({
    a: announce(runId, label, step, [0, 2], 1),
    b: same ? announce(runId, label, step, [0, 2], 1) : announce(runId, label, step, [0, 2], 2),
  })
  r.apply({type: 'resume'}, 'ok')
  for (const l of ['a', 'b', 'c', 'd']) r.apply({type: 'join', id: r.id(l)}, 'ok')
  r.apply({type: 'equivocation', from: r.id('b'), proof: proof('a', 1)}, 'InvalidRunState')
  r.tickOut() // → Warmup
  r.warmupOne()
  r.tickOut() // → RoundTrain
  const step = r.state.epoch.round!.step
  r.apply({type: 'equivocation', from: r.id('b'), proof: proof('a', step, true)}, 'InvalidProof') // the same result twice
  r.apply({type: 'equivocation', from: r.id('b'), proof: proof('a', step, false, 'another-run')}, 'InvalidProof')
  r.apply({type: 'equivocation', from: r.id('b'), proof: {a: announce(run, 'a', step, [0, 2], 1), b: announce(run, 'a', step + 1, [0, 2], 2)}}, 'InvalidProof')
  r.apply({type: 'equivocation', from: r.id('x'), proof: proof('a', step)}, 'UnknownClient') // not a client
  r.apply({type: 'equivocation', from: r.id('b'), proof: proof('x', step)}, 'UnknownClient') // the producer is not either
  r.apply({type: 'equivocation', from: r.id('b'), proof: proof('a', step)}, 'ok') // ejected and excluded
  r.apply({type: 'equivocation', from: r.id('c'), proof: proof('a', step)}, 'DuplicateAccusation')
  r.apply({type: 'equivocation', from: r.id('b'), proof: proof('c', step + 5)}, 'ok') // another step: ejected only
  r.apply({type: 'equivocation', from: r.id('b'), proof: proof('c', step + 5)}, 'DuplicateAccusation')
  r.witnessAll()
  r.tickOut()
  r.witnessAll()
  r.tickOut()
  return finish(r)
}

/**
 * Checkpoint authority: designated checkpointers (config.checkpointers), Cooldown's parameter-hash witnesses, and a
 * checkpoint recorded with the hash a quorum of them agreed on (one declaring another hash is refused).
 */
async function checkpointAuthority(): Promise<Scenario> {
  const r = await recorder('checkpoint-authority', ['a', 'b', 'c', 'd', 'e'], {rounds_per_epoch: 1, witness_nodes: 3, min_clients: 3, cooldown_time: 50})
  r.apply({type: 'config_update', config: {...r.state.config, checkpointers: [r.id('a'), r.id('a')]}}, 'InvalidConfig')
  r.apply({type: 'config_update', config: {...r.state.config, checkpointers: [r.id('a'), r.id('b')]}}, 'ok')
  r.apply({type: 'resume'}, 'ok')
  for (const l of ['a', 'b', 'c', 'd']) r.apply({type: 'join', id: r.id(l)}, 'ok')
  r.tickOut() // → Warmup
  r.apply({type: 'witness', from: r.id('a'), step: 0, proof: {participant_bloom: '', broadcast_bloom: ''}, param_hash: PARAMS}, 'InvalidRunState')
  r.warmupAll()
  r.witnessAll()
  const round = r.state.epoch.round!
  r.apply({type: 'witness', from: r.id('a'), step: round.step, proof: {participant_bloom: '', broadcast_bloom: ''}, param_hash: PARAMS}, 'InvalidRunState')
  r.tickOut() // → Cooldown (rounds_per_epoch 1)
  const witnesses = selectWitnesses(r.state, round)
  const outsider = round.roster.find((id) => !witnesses.includes(id))!
  r.apply({type: 'checkpoint', from: r.id('a'), repo: {repo_id: 'org/ckpt', revision: 'r1'}, param_hash: PARAMS}, 'HashNotAgreed')
  r.apply({type: 'witness', from: witnesses[0], step: round.step + 1, proof: {participant_bloom: '', broadcast_bloom: ''}, param_hash: PARAMS}, 'WrongStep')
  r.apply({type: 'witness', from: outsider, step: round.step, proof: {participant_bloom: '', broadcast_bloom: ''}, param_hash: PARAMS}, 'InvalidWitness')
  r.attest(PARAMS, [witnesses[0]])
  r.apply({type: 'witness', from: witnesses[0], step: round.step, proof: {participant_bloom: '', broadcast_bloom: ''}, param_hash: PARAMS}, 'DuplicateWitness')
  r.attest(OTHER_PARAMS, [witnesses[1]]) // one hostile witness: no quorum yet
  r.apply({type: 'checkpoint', from: r.id('a'), repo: {repo_id: 'org/ckpt', revision: 'r1'}, param_hash: PARAMS}, 'HashNotAgreed')
  r.attest(PARAMS, [witnesses[2]])
  const stranger = ['c', 'd'].map((l) => r.id(l)).find((id) => r.state.epoch.clients.some((c) => c.id === id))!
  r.apply({type: 'checkpoint', from: stranger, repo: {repo_id: 'evil/model'}, param_hash: PARAMS}, 'NotCheckpointer')
  r.apply({type: 'checkpoint', from: r.id('a'), repo: {repo_id: 'evil/model'}, param_hash: OTHER_PARAMS}, 'CheckpointHashMismatch')
  r.apply({type: 'checkpoint', from: r.id('a'), repo: {repo_id: 'evil/model'}}, 'CheckpointHashMismatch')
  r.apply({type: 'checkpoint', from: r.id('b'), repo: {repo_id: 'org/ckpt', revision: 'r1'}, param_hash: PARAMS}, 'ok')
  r.tickOut() // → WaitingForMembers; the record stays
  r.apply({type: 'pause'}, 'ok')
  r.apply({type: 'config_update', config: {...r.state.config, checkpointers: undefined}}, 'ok') // the list is gone again
  // After its Cooldown only a checkpoint of the run's current model is taken, from a member of the recorded epoch
  r.apply({type: 'checkpoint', from: r.id('e'), repo: {repo_id: 'org/late'}, param_hash: PARAMS}, 'UnknownClient')
  r.apply({type: 'checkpoint', from: r.id('b'), repo: {repo_id: 'org/late'}, param_hash: PARAMS}, 'AlreadyCheckpointed') // the same model
  return finish(r)
}

/**
 * The run's current model and idle members: a member that never trains is dropped as the round it missed closes; the
 * model is recorded at the epoch's end; a run whose members all left does not fall back to its Dummy starting point
 * (its Warmup ends with nobody loaded: no round, the step unchanged); a designated checkpointer's upload of the model,
 * reported after its Cooldown, is taken (after its refusals), and the run resumes from it; an epoch whose only round
 * nobody witnessed keeps the model it began with.
 */
async function currentModel(): Promise<Scenario> {
  const r = await recorder(
    'current-model',
    ['a', 'b', 'c', 'n'],
    {rounds_per_epoch: 2, witness_nodes: 0, min_clients: 1, init_min_clients: 2, cooldown_time: 5, waiting_for_members_extra_time: 1},
    {checkpoint: {Dummy: {repo_id: 'org/dummy'}}},
  )
  const [a, b, c, n] = ['a', 'b', 'c', 'n'].map((l) => r.id(l))
  r.apply({type: 'config_update', config: {...r.state.config, checkpointers: [a]}}, 'ok')
  r.apply({type: 'resume'}, 'ok')
  r.apply({type: 'checkpoint', from: a, repo: {repo_id: 'org/early'}, param_hash: PARAMS}, 'InvalidRunState') // no model recorded yet
  for (const id of [a, b, c]) r.apply({type: 'join', id}, 'ok')
  r.tickOut() // → Warmup
  r.warmupOne()
  r.tickOut() // → RoundTrain
  // round 1: c trains and witnesses nothing; a and b (a quorum of the 3 witnesses) saw each other
  const step = r.state.epoch.round!.step
  for (const from of [a, b]) r.apply({type: 'witness', from, step, proof: r.proof([a, b])}, 'ok')
  r.tickOut() // the round closes: c, unseen, is dropped
  r.witnessAll()
  r.tickOut() // → Cooldown (rounds_per_epoch)
  r.attest()
  r.tickOut() // → WaitingForMembers: the model recorded
  for (const id of [a, b]) r.apply({type: 'withdraw', id}, 'ok')
  for (const id of [n, c]) r.apply({type: 'join', id}, 'ok')
  r.tickOut() // → Warmup, still P2P (the Dummy fallback is not the run's model)
  r.tickOut() // nobody loaded it: back to WaitingForMembers, no round
  r.apply({type: 'checkpoint', from: n, repo: {repo_id: 'org/late'}, param_hash: PARAMS}, 'NotCheckpointer')
  r.apply({type: 'checkpoint', from: a, repo: {repo_id: 'org/late'}, param_hash: OTHER_PARAMS}, 'CheckpointHashMismatch')
  r.apply({type: 'checkpoint', from: a, repo: {repo_id: 'org/late', revision: 'r2'}, param_hash: PARAMS}, 'ok') // a has left: the list suffices
  r.apply({type: 'checkpoint', from: a, repo: {repo_id: 'org/late'}, param_hash: PARAMS}, 'AlreadyCheckpointed')
  r.tickOut() // → Warmup from the late upload (Hub: the aborted Warmup's members held nothing)
  r.warmupOne()
  r.tickOut() // → RoundTrain: a round nobody witnesses
  r.tickOut() // → RoundWitness
  r.tickOut() // → Cooldown, everyone withdrawn
  r.tickOut() // → WaitingForMembers: the model is the one the epoch began with
  for (const id of [n, c]) r.apply({type: 'join', id}, 'ok')
  r.tickOut() // → Warmup from the Hub upload again (it is the run's model)
  return finish(r)
}

/**
 * max_trainers_per_round = 2 of 6 members, with verifiers: each round only the 2 the data shuffle puts first have
 * batches (the round's batches split between them); a health check or an accusation of a member not chosen is refused,
 * the chosen are judged as usual, nobody closes the round early, and the ledger credits the chosen only.
 */
async function trainersCap(): Promise<Scenario> {
  const labels = ['a', 'b', 'c', 'd', 'e', 'f']
  const r = await recorder('trainers-cap', labels, {
    round_witness_time: 30, // a round whose every proof names both chosen trainers closes at the next tick
    max_trainers_per_round: 2,
    verification_percent: 50,
    min_clients: 3,
    init_min_clients: 6,
    witness_nodes: 3,
    rounds_per_epoch: 4,
  })
  r.startEpoch(labels.map((l) => r.id(l)))
  const first = r.state.epoch.round!
  const chosen = [...assignBatches(r.state)].filter(([, range]) => range.end > range.start).map(([id]) => id)
  if (chosen.length !== 2) throw new Error(`trainers-cap: ${chosen.length} trainers chosen, expected 2`)
  const idle = first.roster.find((id) => !chosen.includes(id) && !selectWitnesses(r.state).includes(id))!
  const [w0, w1] = selectWitnesses(r.state)
  r.apply({type: 'accuse', from: w0, step: first.step, accused: idle, reason: 'invalid_result'}, 'InvalidAccusation') // it has no result
  r.witnessAll()
  const before = r.now
  r.tickOut() // RoundTrain → RoundWitness (the proofs' quorum already ended training) → round 2
  if ((r.state.run_state as string) !== 'RoundTrain' || r.now - before > 3) throw new Error('trainers-cap: round 1 did not close early')
  // round 1's idle member is not judged; a chosen trainer its witnesses did not see is (the closing round drops it)
  r.apply({type: 'health_check', from: w0, accused: [idle]}, 'InvalidHealthCheck')
  const second = r.state.epoch.round!
  const chosen2 = [...assignBatches(r.state)].filter(([, range]) => range.end > range.start).map(([id]) => id)
  r.witnessAll(chosen2.slice(0, 1))
  r.tickOut() // round 3
  const unseen = chosen2[1]
  const reporter = r.state.epoch.clients.find((c) => c.id !== unseen)!.id
  r.apply({type: 'health_check', from: reporter, accused: [unseen]}, 'ok')
  r.apply({type: 'accuse', from: w1, step: second.step, accused: unseen, reason: 'invalid_result'}, 'WrongStep')
  for (let i = 0; i < 6 && r.state.run_state !== 'Cooldown'; i++) {
    if (r.state.run_state === 'RoundTrain') r.witnessAll()
    r.tickOut()
  }
  r.attest()
  r.tickOut() // → WaitingForMembers: the epoch settles (the ledger credits the chosen trainers only)
  return finish(r)
}

/**
 * max_trainers_per_round = 3 of 12 members: both witness blooms are sized for the 3 trainers (8 bytes each, rules.ts
 * witnessBloomParams; the program's bloom_size), not for the roster (15 bytes, refused), and such proofs attest the chosen
 * trainers: the round closes early.
 */
async function trainersCapBlooms(): Promise<Scenario> {
  const labels = Array.from({length: 12}, (_, i) => `g${i}`)
  const r = await recorder('trainers-cap-blooms', labels, {
    round_witness_time: 30,
    max_trainers_per_round: 3,
    min_clients: 3,
    init_min_clients: 12,
    witness_nodes: 3,
    global_batch_size_start: 12,
    global_batch_size_end: 12,
  })
  r.startEpoch(labels.map((l) => r.id(l)))
  const round = r.state.epoch.round!
  const seen = [...assignBatches(r.state)].filter(([, range]) => range.end > range.start).map(([id, range]) => ({id, range, commitment: Buffer.alloc(32, 7)}))
  const wide = buildWitnessProof({}, {...round, trainers: round.roster.length}, seen)
  if (Buffer.from(wide.participant_bloom, 'base64').length !== 15 || Buffer.from(r.proof().participant_bloom, 'base64').length !== 8)
    throw new Error('trainers-cap-blooms: expected 15-byte roster-sized and 8-byte trainer-sized blooms')
  r.apply({type: 'witness', from: selectWitnesses(r.state)[0], step: round.step, proof: wide}, 'InvalidWitness')
  r.witnessAll()
  const before = r.now
  r.tickOut() // RoundTrain → RoundWitness (the proofs' quorum ended training) → round 2, at once
  if ((r.state.run_state as string) !== 'RoundTrain' || r.now - before > 3) throw new Error('trainers-cap-blooms: round 1 did not close early')
  r.witnessAll()
  r.tickOut()
  return finish(r)
}

/**
 * SparseLoCo with `h` inner steps a round, every field given (as validateRunConfig fills them in), so the reference's
 * normalized model and the program's decoded one are the same object.
 */
export function sparseLoCo(h: number): LLMConfig['optimizer'] {
  return {
    SparseLoCo: {
      inner_steps: h,
      error_feedback_decay: 0.95,
      chunk: 64,
      topk: 64,
      value_bits: 2,
      outer_lr: 0.4,
      dct: false,
      inner: {betas: [0.9, 0.95], weight_decay: 0.1, eps: 1e-8, clip_grad_norm: 1},
    },
  }
}

/**
 * SparseLoCo, 3 inner steps a round, then 5 (an update of the model while Paused): each round carries H global batches
 * (the global batch ramping from 4 to 8 over the tokens of the batches before it), max_trainers_per_round = 2 of 4
 * members share them, and the next round starts after them: no batch is handed out twice. An inner_steps of 0 or
 * 10,001 is refused.
 */
async function innerSteps(): Promise<Scenario> {
  const labels = ['a', 'b', 'c', 'd']
  const r = await recorder(
    'inner-steps',
    labels,
    {global_batch_size_start: 4, global_batch_size_end: 8, global_batch_size_warmup_tokens: 640, max_trainers_per_round: 2, init_min_clients: 4, rounds_per_epoch: 3},
    {optimizer: sparseLoCo(3)},
  )
  const handedOut = new Set<number>()
  let rounds = 0
  let checked = 0
  const checkRound = (h: number) => {
    const round = r.state.epoch.round!
    if (round.step === checked) return
    checked = round.step
    const global = globalBatchSize(r.state.config, round.data_index * r.state.model.LLM.max_seq_len)
    if (round.batch_size !== global * h) throw new Error(`inner-steps: round ${round.step} has ${round.batch_size} batches, expected ${h} × ${global}`)
    const ranges = [...assignBatches(r.state).values()].filter((x) => x.end > x.start)
    if (ranges.length !== 2) throw new Error(`inner-steps: ${ranges.length} trainers, expected 2`)
    for (const range of ranges)
      for (let b = range.start; b < range.end; b++) {
        if (handedOut.has(b)) throw new Error(`inner-steps: batch ${b} handed out twice`)
        handedOut.add(b)
      }
    if (handedOut.size !== round.data_index + round.batch_size) throw new Error(`inner-steps: batches 0..${round.data_index + round.batch_size} not all handed out once`)
    rounds++
  }
  r.startEpoch(labels.map((l) => r.id(l)))
  for (let i = 0; i < 8 && r.state.run_state !== 'Cooldown'; i++) {
    if (r.state.run_state === 'RoundTrain') {
      checkRound(3)
      r.witnessAll()
    }
    r.tickOut()
  }
  r.attest()
  r.tickOut() // → WaitingForMembers, epoch 1
  r.apply({type: 'pause'}, 'ok')
  for (const bad of [0, 10_001]) r.apply({type: 'config_update', model: {LLM: {...r.state.model.LLM, optimizer: sparseLoCo(bad)}}}, 'InvalidConfig')
  r.apply({type: 'config_update', model: {LLM: {...r.state.model.LLM, optimizer: sparseLoCo(5)}}}, 'ok')
  r.apply({type: 'resume'}, 'ok')
  r.tickOut() // → Warmup
  r.warmupAll()
  for (let i = 0; i < 8 && r.state.run_state !== 'Cooldown'; i++) {
    if (r.state.run_state === 'RoundTrain') {
      checkRound(5)
      r.witnessAll()
    }
    r.tickOut()
  }
  if (rounds !== 6) throw new Error(`inner-steps: ${rounds} rounds checked, expected 6`)
  return finish(r)
}

export async function generateVectors(): Promise<VectorFile> {
  return {
    about:
      'Generated from src/core/coordinator (the reference). Each step: the event at `now`, and the reference state after it (or its rejection code). test/solana/vectors.test.ts requires the on-chain program to reach identical states.',
    scenarios: [
      await fullRun(),
      await rejections(),
      await rampAndLosses(),
      await accusations(),
      await equivocation(),
      await dummyThenHub(),
      await checkpointAuthority(),
      await cutOff(),
      await currentModel(),
      await trainersCap(),
      await trainersCapBlooms(),
      await innerSteps(),
    ],
  }
}
